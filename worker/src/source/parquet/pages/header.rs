//! A page header read step for step as the parquet crate (60.1) reads it: `PageHeader`'s
//! `read_thrift_without_stats` over its `ThriftReadInputProtocol`, the protocol it reads page
//! headers with (see [`Cursor`] and its module for how that read differs from the protocol, and
//! why it matters).
//!
//! A 1.3 KB file found by fuzzing kept the fuzzing build in the crate's skip loop for over two
//! minutes (`fuzz/regressions/source_parquet/page-header-list-of-booleans`). [`read`] gives up,
//! as [`Unread::Excess`], once the crate's steps would pass the header's bytes.

use crate::source::parquet::thrift::{Cursor, Protocol, SKIP_DEPTH, Step, Unread, bool_field};

/// What a page header says of its sizes (the crate's values: wrapped to `i32`), and its own
/// length as the crate counts it.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    pub(super) uncompressed: i32,
    pub(super) compressed: i32,
    /// The values a dictionary page claims; `None` for other pages.
    pub(super) dictionary_values: Option<i32>,
    pub(super) len: usize,
}

/// Reads the page header at the start of `bytes` as the crate does.
pub(super) fn read(bytes: &[u8]) -> Step<Header> {
    let mut c = Cursor::new(bytes, Protocol::Read);
    let (mut uncompressed, mut compressed, mut dictionary_values) = (None, None, None);
    c.fields(|c, id, kind| {
        match id {
            1 | 4 => drop(c.i32()?),
            2 => uncompressed = Some(c.i32()?),
            3 => compressed = Some(c.i32()?),
            // The data page headers (v1 and v2): their i32 fields by id, a boolean at v2's 7.
            5 => known(c, &[1, 2, 3, 4], None)?,
            // The index page header: no field of its own.
            6 => known(c, &[], None)?,
            7 => {
                let mut values = 0;
                c.fields(|c, id, kind| match id {
                    1 => {
                        values = c.i32()?;
                        Ok(())
                    }
                    2 => c.i32().map(drop),
                    3 => bool_field(kind),
                    _ => c.skip(kind, SKIP_DEPTH),
                })?;
                dictionary_values = Some(values);
            }
            8 => known(c, &[1, 2, 3, 4, 5, 6], Some(7))?,
            _ => c.skip(kind, SKIP_DEPTH)?,
        }
        Ok(())
    })?;
    let (Some(uncompressed), Some(compressed)) = (uncompressed, compressed) else {
        return Err(Unread::Fails);
    };
    Ok(Header { uncompressed, compressed, dictionary_values, len: c.at() })
}

/// A struct whose fields `i32s` are read as `i32` and `boolean` as a boolean, whatever their
/// declared types, and the rest skipped.
fn known(c: &mut Cursor<'_>, i32s: &[i16], boolean: Option<i16>) -> Step<()> {
    c.fields(|c, id, kind| {
        if i32s.contains(&id) {
            c.i32().map(drop)
        } else if Some(id) == boolean {
            bool_field(kind)
        } else {
            c.skip(kind, SKIP_DEPTH)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::parquet::thrift::SLACK_STEPS;
    use crate::source::parquet::thrift::encode::{field, varint, zigzag};

    /// Fields 1–3 of a data page header (type 0, the two sizes), then `rest`, then the stop.
    fn header_with(rest: &[u8]) -> Vec<u8> {
        let mut out = vec![field(1, 5)];
        out.extend(zigzag(0));
        out.push(field(1, 5));
        out.extend(zigzag(100));
        out.push(field(1, 5));
        out.extend(zigzag(40));
        out.extend(rest);
        out.push(0);
        out
    }

    #[test]
    fn a_writers_header_is_read_to_its_end() {
        // Field 5, a data page header: num_values, encoding, the two level encodings, then
        // statistics (field 5, a struct holding a binary and an i64) and its stop.
        let mut data_page =
            vec![field(2, 12), field(1, 5), 20, field(1, 5), 0, field(1, 5), 6, field(1, 5), 6];
        data_page.extend([field(1, 12), field(1, 8), 3, b'a', b'b', b'c', field(2, 6), 4, 0, 0]);
        let bytes = header_with(&data_page);
        let h = read(&bytes).unwrap();
        assert_eq!((h.uncompressed, h.compressed, h.dictionary_values, h.len), (100, 40, None, bytes.len()));
    }

    #[test]
    fn values_wrap_and_known_ids_ignore_their_declared_type_as_the_crates_do() {
        // Uncompressed size 2^32 + 5: the crate's `i32` is 5.
        let mut bytes = vec![field(2, 5)];
        bytes.extend(zigzag((1 << 32) + 5));
        // Compressed size declared as a list: read as an i32 all the same.
        bytes.push(field(1, 9));
        bytes.extend(zigzag(7));
        bytes.push(0);
        let h = read(&bytes).unwrap();
        assert_eq!((h.uncompressed, h.compressed), (5, 7));
    }

    #[test]
    fn a_list_of_booleans_longer_than_its_bytes_is_refused_before_its_steps_are_taken() {
        // An unknown field 9, a list of 2^31 - 1 booleans: 7 bytes, 2^31 - 1 steps in the crate.
        let mut list = vec![field(6, 9), 0xf1];
        list.extend(varint(i32::MAX as u64));
        let bytes = header_with(&list);
        let Err(Unread::Excess { steps, bytes: read_bytes }) = read(&bytes) else { panic!("read") };
        assert!(steps > read_bytes + SLACK_STEPS && steps < 200, "{steps} steps for {read_bytes} bytes");
        // A short one is a step a byte (or near it), as a writer's would be.
        let short = header_with(&[field(6, 9), 0x31]);
        assert!(read(&short).is_ok());
    }

    #[test]
    fn doubles_skipped_past_the_end_are_steps_without_bytes() {
        let mut list = vec![field(6, 9), 0xf7];
        list.extend(varint(1 << 30));
        let mut bytes = header_with(&list);
        bytes.pop();
        assert!(matches!(read(&bytes), Err(Unread::Excess { .. })));
        // A map of booleans to booleans, the same.
        let mut map = vec![field(6, 11)];
        map.extend(varint(1 << 30));
        map.push(0x11);
        assert!(matches!(read(&header_with(&map)), Err(Unread::Excess { .. })));
    }

    #[test]
    fn what_the_crate_refuses_fails() {
        assert_eq!(read(&[]), Err(Unread::Fails));
        assert_eq!(read(&[field(1, 5)]), Err(Unread::Fails), "cut short");
        assert_eq!(read(&[field(1, 14)]), Err(Unread::Fails), "an unknown type");
        assert_eq!(read(&[0x00]), Err(Unread::Fails), "no sizes");
        // A list count past i32's range.
        let mut list = vec![field(6, 9), 0xf5];
        list.extend(varint(1 << 31));
        assert_eq!(read(&header_with(&list)), Err(Unread::Fails));
        // Structs nested past the crate's skip depth.
        let mut deep = vec![field(9, 12)];
        deep.extend([field(1, 12); 70]);
        assert_eq!(read(&header_with(&deep)), Err(Unread::Fails));
        // A boolean at v2's field 7 is a boolean; an i32 there is refused.
        assert_eq!(read(&header_with(&[field(5, 12), field(7, 5), 2, 0])), Err(Unread::Fails));
        assert!(read(&header_with(&[field(5, 12), field(7, 1), 0])).is_ok());
        // A delta that takes the id past i16's range.
        let mut past = vec![field(0, 5)];
        past.extend(zigzag(i64::from(i16::MAX)));
        past.extend(zigzag(1));
        past.extend([field(1, 5), 2, 0]);
        assert_eq!(read(&past), Err(Unread::Fails));
    }
}
