//! A page header read step for step as the parquet crate (60.1) reads it: `PageHeader`'s
//! `read_thrift_without_stats` over its `ThriftReadInputProtocol`, the protocol it reads page
//! headers with. The point is not the values alone but the work: this reader takes the same
//! path through the bytes, so it knows how many steps the crate's read will take before the crate
//! takes them.
//!
//! Three ways in which the crate's read is not thrift's compact protocol make its work unbounded
//! by the bytes, and so are mirrored here:
//! - a boolean element of a list, set or map takes no byte (the protocol writes one), so a list
//!   of 2^31 booleans costs 2^31 steps and 6 bytes;
//! - a skipped `double`, UUID or binary past the end of the bytes is not an error: the skip
//!   stops at the end and the read goes on, so a list of 2^31 doubles at the end of a chunk
//!   costs 2^31 steps;
//! - a known field is read by its id whatever type its header declares (a list at id 2 is read
//!   as an `i32`), and `i16` and `i32` values wrap, so the crate's read and the protocol's part
//!   ways and the crate reads the rest of the bytes as something else.
//!
//! A 1.3 KB file found by fuzzing kept the fuzzing build in the crate's skip loop for over two
//! minutes (`fuzz/regressions/source_parquet/page-header-list-of-booleans`).
//! [`read`] counts the crate's steps (a field of a skipped struct, an element of a collection)
//! and gives up, as an error, once they pass the bytes read by [`SLACK_STEPS`]: a header that a
//! writer produced takes a byte at least for each.

/// Steps past the bytes read that a header may take before it is refused: a writer's header
/// takes none (each field and element takes a byte at least).
pub(super) const SLACK_STEPS: usize = 64;
/// The crate's depth for a skip (`DEFAULT_SKIP_DEPTH`).
const SKIP_DEPTH: u32 = 64;

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

/// Why a header was not read to its end.
#[derive(Debug, PartialEq)]
pub(super) enum Unread {
    /// The crate's read fails here as well, after no more steps than bytes: it reports the
    /// error itself.
    Fails,
    /// The crate's read would take more steps than the header's bytes (by [`SLACK_STEPS`]).
    Excess { steps: usize, bytes: usize },
}

type Step<T> = Result<T, Unread>;

/// Reads the page header at the start of `bytes` as the crate does.
pub(super) fn read(bytes: &[u8]) -> Step<Header> {
    let mut c = Cursor { bytes, at: 0, steps: 0 };
    let (mut uncompressed, mut compressed, mut dictionary_values) = (None, None, None);
    c.fields(|c, id, kind| {
        match id {
            1 | 4 => drop(c.i32()?),
            2 => uncompressed = Some(c.i32()?),
            3 => compressed = Some(c.i32()?),
            // The data page headers (v1 and v2): their i32 fields by id, a boolean at v2's 7.
            5 => c.known(&[1, 2, 3, 4], None)?,
            // The index page header: no field of its own.
            6 => c.known(&[], None)?,
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
            8 => c.known(&[1, 2, 3, 4, 5, 6], Some(7))?,
            _ => c.skip(kind, SKIP_DEPTH)?,
        }
        Ok(())
    })?;
    let (Some(uncompressed), Some(compressed)) = (uncompressed, compressed) else {
        return Err(Unread::Fails);
    };
    Ok(Header { uncompressed, compressed, dictionary_values, len: c.at })
}

/// A boolean field's value is in its header; the crate refuses any other type there.
fn bool_field(kind: u8) -> Step<()> {
    if matches!(kind, 1 | 2) { Ok(()) } else { Err(Unread::Fails) }
}

/// The crate's read position, and the steps it has taken.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    steps: usize,
}

impl Cursor<'_> {
    /// One more step: an error once they pass the bytes read by [`SLACK_STEPS`].
    fn step(&mut self) -> Step<()> {
        self.steps += 1;
        if self.steps > self.at.saturating_add(SLACK_STEPS) {
            return Err(Unread::Excess { steps: self.steps, bytes: self.at });
        }
        Ok(())
    }

    fn byte(&mut self) -> Step<u8> {
        let b = *self.bytes.get(self.at).ok_or(Unread::Fails)?;
        self.at += 1;
        Ok(b)
    }

    /// `skip_bytes`: up to `n` bytes, fewer at the end and no error (`io::copy` of a `take`).
    fn skip_bytes(&mut self, n: u64) -> Step<()> {
        let left = (self.bytes.len() - self.at) as u64;
        self.at += usize::try_from(n.min(left)).unwrap_or(0);
        Ok(())
    }

    /// `read_vlq`: as many bytes as the varint has, the shift wrapping as the crate's does.
    fn varint(&mut self) -> Step<u64> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f).wrapping_shl(shift);
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift = shift.wrapping_add(7);
        }
    }

    fn zigzag(&mut self) -> Step<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// `read_i32`: the zigzag value cut to 32 bits, as the crate's `as` does.
    fn i32(&mut self) -> Step<i32> {
        Ok(self.zigzag()? as i32)
    }

    /// Reads a struct's fields to its stop, calling `field` with each one's id and type.
    fn fields(&mut self, mut field: impl FnMut(&mut Self, i16, u8) -> Step<()>) -> Step<()> {
        let mut last = 0i16;
        loop {
            let head = self.byte()?;
            let kind = head & 0x0f;
            if kind == 0 {
                return Ok(());
            }
            if kind > 13 {
                return Err(Unread::Fails);
            }
            let id = match head >> 4 {
                // `read_i16`: the zigzag value cut to 16 bits.
                0 => self.zigzag()? as i16,
                delta => last.checked_add(i16::from(delta)).ok_or(Unread::Fails)?,
            };
            self.step()?;
            field(self, id, kind)?;
            last = id;
        }
    }

    /// A struct whose fields `i32s` are read as `i32` and `boolean` as a boolean, whatever their
    /// declared types, and the rest skipped.
    fn known(&mut self, i32s: &[i16], boolean: Option<i16>) -> Step<()> {
        self.fields(|c, id, kind| {
            if i32s.contains(&id) {
                c.i32().map(drop)
            } else if Some(id) == boolean {
                bool_field(kind)
            } else {
                c.skip(kind, SKIP_DEPTH)
            }
        })
    }

    /// `skip_till_depth`: skips a value of type `kind`.
    fn skip(&mut self, kind: u8, depth: u32) -> Step<()> {
        if depth == 0 {
            return Err(Unread::Fails);
        }
        match kind {
            // A boolean: no byte, as a field (its value is in the field's header) and, unlike
            // the protocol, as an element.
            1 | 2 => Ok(()),
            3 => self.byte().map(drop),
            4..=6 => self.varint().map(drop),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                if head == 0 {
                    return Ok(());
                }
                let element = element_type(head & 0x0f)?;
                let n = match head >> 4 {
                    15 => i32::try_from(self.varint()?).map_err(|_| Unread::Fails)?,
                    n => i32::from(n),
                };
                for _ in 0..n {
                    self.step()?;
                    self.skip(element, depth - 1)?;
                }
                Ok(())
            }
            11 => {
                let n = i32::try_from(self.varint()?).map_err(|_| Unread::Fails)?;
                if n > 0 {
                    let kinds = self.byte()?;
                    let (key, value) = (element_type(kinds >> 4)?, element_type(kinds & 0x0f)?);
                    for _ in 0..n {
                        self.step()?;
                        self.skip(key, depth - 1)?;
                        self.skip(value, depth - 1)?;
                    }
                }
                Ok(())
            }
            12 => self.fields(|c, _, kind| c.skip(kind, depth - 1)),
            13 => self.skip_bytes(16),
            _ => Err(Unread::Fails),
        }
    }
}

/// A collection's element type as the crate takes it (`ElementType`, then `FieldType`): 1 and
/// 2 are both a boolean.
fn element_type(nibble: u8) -> Step<u8> {
    match nibble {
        1..=13 => Ok(nibble),
        _ => Err(Unread::Fails),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A field header: `delta` from the last id, compact type `kind`.
    fn field(delta: u8, kind: u8) -> u8 {
        delta << 4 | kind
    }

    /// `v` as an unsigned varint.
    pub(in crate::source::parquet::pages) fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// `v` as a zigzag varint (thrift's compact `i16`, `i32` and `i64`).
    pub(in crate::source::parquet::pages) fn zigzag(v: i64) -> Vec<u8> {
        varint(((v << 1) ^ (v >> 63)) as u64)
    }

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
