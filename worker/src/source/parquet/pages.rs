//! The page headers of a column chunk, checked before the parquet crate decodes them.
//!
//! The crate sizes buffers from what a page header claims, before it reads what follows: it
//! zero-fills a decompression buffer of the header's `uncompressed_page_size`
//! (apache/arrow-rs#10734), and it sizes a dictionary from the dictionary page's `num_values`
//! (`set_dict`, `num_values` values of the column's type: 32 bytes each for byte arrays). A
//! 1.5 KB file found by fuzzing made a worker allocate 8.7 GB that way. So the reader checks the
//! pages each fetched column chunk holds first, against what its bytes could hold:
//! - a page may claim at most [`MOST_RATIO`] times its compressed bytes, and [`SLACK`] more,
//!   uncompressed;
//! - a dictionary page's values, each of which takes the least the column's type allows
//!   ([`least_value_bits`]: a bit for a boolean, 4 bytes for a byte array's length), must fit
//!   in its uncompressed bytes.
//!
//! So each page costs at most a fixed multiple of its bytes and of [`SLACK`]. The headers are
//! thrift's compact protocol, read here because the crate keeps its page header type to itself
//! (`pub(crate)` in 60.1). They are read as the crate reads them ([`header`]), not as the
//! protocol says, because the crate's own read of a header may take unbounded work: a header
//! whose read would take the crate more steps than its bytes is refused too. A header the crate
//! fails to read (cut short, an unknown type) stops the check, and the crate reports it.

mod header;

use super::thrift::Unread;
use parquet::basic::Type as PhysicalType;

/// How many times its compressed bytes a page may claim uncompressed. deflate (gzip) cannot
/// exceed 1,032; snappy's and lz4's ratios are lower. Only zstd and brotli go further, on pages
/// of one value repeated, which writers dictionary-encode instead (and pages up to [`SLACK`]
/// pass whatever their ratio).
pub(super) const MOST_RATIO: u64 = 1_100;
/// What a page may claim uncompressed beyond [`MOST_RATIO`] times its compressed bytes: writers
/// cut pages at 1 MiB by default.
pub(super) const SLACK: u64 = 16 << 20;

/// The least bits one value of a column of `physical` type (of `type_length` bytes when fixed)
/// takes in a page that stores it whole, as a dictionary page does (plain encoding).
pub(super) fn least_value_bits(physical: PhysicalType, type_length: i32) -> u64 {
    match physical {
        PhysicalType::BOOLEAN => 1,
        PhysicalType::INT32 | PhysicalType::FLOAT | PhysicalType::BYTE_ARRAY => 32,
        PhysicalType::INT64 | PhysicalType::DOUBLE => 64,
        PhysicalType::INT96 => 96,
        // A length of 0 or less is not a valid schema; a value still takes a bit to count.
        PhysicalType::FIXED_LEN_BYTE_ARRAY => u64::try_from(type_length).map_or(1, |len| (len * 8).max(1)),
    }
}

/// Checks the pages of the column chunk whose bytes are `chunk` (its start, or all of it), each
/// of whose values takes at least `value_bits`: an error names the first page that claims more
/// than its bytes could hold.
pub(super) fn check(chunk: &[u8], value_bits: u64) -> Result<(), String> {
    let mut at = 0usize;
    let mut page = 0usize;
    while at < chunk.len() {
        let header = match header::read(&chunk[at..]) {
            Ok(header) => header,
            Err(Unread::Fails) => return Ok(()),
            Err(Unread::Excess { steps, bytes }) => {
                return Err(format!(
                    "the header of page {page} of a column chunk would take the Parquet reader more \
                     than {steps} steps in {bytes} bytes (a list or map that claims more elements \
                     than it holds); the file is corrupt: rewrite it"
                ));
            }
        };
        // The crate refuses a negative size itself.
        let (Ok(uncompressed), Ok(claimed)) =
            (u64::try_from(header.uncompressed), u64::try_from(header.compressed))
        else {
            return Ok(());
        };
        let data_at = at.saturating_add(header.len);
        // What the page's data could be: no more than the chunk holds after its header.
        let compressed = claimed.min(chunk.len().saturating_sub(data_at) as u64);
        let most = compressed.saturating_mul(MOST_RATIO).saturating_add(SLACK);
        if uncompressed > most {
            return Err(format!(
                "page {page} of a column chunk claims {uncompressed} bytes uncompressed from {compressed} \
                 compressed, more than any codec gives ({most}); the file is corrupt: rewrite it"
            ));
        }
        // A negative count is refused by the crate itself.
        if let Some(values) = header.dictionary_values.and_then(|v| u64::try_from(v).ok()) {
            let fit = uncompressed.saturating_mul(8) / value_bits.max(1);
            if values > fit {
                return Err(format!(
                    "the dictionary page (page {page}) of a column chunk claims {values} values, \
                     more than its {uncompressed} bytes hold ({fit}); the file is corrupt: rewrite it"
                ));
            }
        }
        at = data_at.saturating_add(usize::try_from(claimed).unwrap_or(usize::MAX));
        page += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::parquet::thrift::encode::zigzag;

    /// A page header (type, sizes, then a page header struct holding a count and a list)
    /// followed by `compressed` bytes of data: a data page, or a dictionary page of `values`.
    fn page(uncompressed: i64, compressed: i64, dictionary: Option<i64>) -> Vec<u8> {
        let mut out = vec![0x15];
        out.extend(zigzag(if dictionary.is_some() { 2 } else { 0 }));
        out.push(0x15);
        out.extend(zigzag(uncompressed));
        out.push(0x15);
        out.extend(zigzag(compressed));
        // Field 5 (data page) or 7 (dictionary page), a struct: field 1 i32 (the values),
        // field 2 i32 (the encoding), field 9 (no field of the format) a list of two i32s, then
        // its stop.
        out.push(if dictionary.is_some() { 0x4c } else { 0x2c });
        out.push(0x15);
        out.extend(zigzag(dictionary.unwrap_or(10)));
        out.push(0x15);
        out.extend(zigzag(0));
        out.push(0x79);
        out.push(0x25);
        out.extend(zigzag(1));
        out.extend(zigzag(2));
        out.push(0x00);
        out.push(0x00);
        out.extend(std::iter::repeat_n(7u8, usize::try_from(compressed).unwrap_or(0)));
        out
    }

    #[test]
    fn every_page_of_a_chunk_is_read_past_its_data() {
        let one = page(100, 4, None);
        let h = header::read(&one).unwrap();
        assert_eq!((h.uncompressed, h.compressed, h.dictionary_values), (100, 4, None));
        assert_eq!(h.len + 4, one.len(), "the header ends where its data starts");
        let dictionary = page(400, 400, Some(100));
        assert_eq!(header::read(&dictionary).unwrap().dictionary_values, Some(100));
        let fits = [dictionary, page(100, 4, None), page(SLACK as i64 + 3 * 1_100, 3, None)].concat();
        assert_eq!(check(&fits, 32), Ok(()));
        let chunk = [fits.clone(), page(1 << 30, 2, None)].concat();
        let refused = check(&chunk, 32).unwrap_err();
        assert!(refused.contains("page 3") && refused.contains("1073741824"), "{refused}");
    }

    #[test]
    fn a_page_is_held_to_the_bytes_the_chunk_has_for_it() {
        // Claims 1 MiB compressed, of which the chunk holds 10 bytes.
        let mut cut = page(SLACK as i64 + 100 * 1_100, 1 << 20, None);
        let header_len = header::read(&cut).unwrap().len;
        cut.truncate(header_len + 10);
        let refused = check(&cut, 8).unwrap_err();
        assert!(refused.contains("from 10 compressed"), "{refused}");
    }

    #[test]
    fn a_dictionary_holds_no_more_values_than_its_bytes() {
        // 400 bytes: 100 byte arrays (4 bytes of length each at least), 3,200 booleans.
        assert_eq!(check(&page(400, 400, Some(100)), least_value_bits(PhysicalType::BYTE_ARRAY, 0)), Ok(()));
        let refused = check(&page(400, 400, Some(101)), 32).unwrap_err();
        assert!(refused.contains("claims 101 values") && refused.contains("(100)"), "{refused}");
        assert_eq!(check(&page(400, 400, Some(3_200)), least_value_bits(PhysicalType::BOOLEAN, 0)), Ok(()));
        // The found file's claim: 2^28 values in a few bytes.
        assert!(check(&page(6, 6, Some(1 << 28)), 32).is_err());
    }

    #[test]
    fn a_header_that_would_keep_the_crate_reading_is_refused() {
        // The page header's field 20 (no field of the format): 2^31 - 1 booleans in 6 bytes, each a
        // step of the crate's read and none a byte of it.
        let mut one = page(100, 4, None);
        let header_len = header::read(&one).unwrap().len;
        one.truncate(header_len - 1);
        one.extend([0xf9, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]);
        let chunk = [page(100, 4, None), one].concat();
        let refused = check(&chunk, 8).unwrap_err();
        assert!(refused.contains("page 1") && refused.contains("steps"), "{refused}");
    }

    #[test]
    fn each_type_takes_its_least_bits() {
        assert_eq!(least_value_bits(PhysicalType::BOOLEAN, 0), 1);
        assert_eq!(least_value_bits(PhysicalType::INT64, 0), 64);
        assert_eq!(least_value_bits(PhysicalType::INT96, 0), 96);
        assert_eq!(least_value_bits(PhysicalType::FIXED_LEN_BYTE_ARRAY, 16), 128);
        assert_eq!(least_value_bits(PhysicalType::FIXED_LEN_BYTE_ARRAY, -3), 1);
        assert_eq!(least_value_bits(PhysicalType::FIXED_LEN_BYTE_ARRAY, 0), 1);
    }

    #[test]
    fn what_does_not_parse_is_left_to_the_crate() {
        assert_eq!(check(&[], 8), Ok(()));
        assert_eq!(check(&[0x15], 8), Ok(()), "cut short");
        assert_eq!(check(&[0x0f, 0x00], 8), Ok(()), "an unknown type");
        assert_eq!(check(&[0x00], 8), Ok(()), "no sizes");
        let negative = page(-5, 4, None);
        assert_eq!(check(&negative, 8), Ok(()), "the crate refuses a negative size itself");
        // A list at the page type's id is read as an i32, as the crate does; then the header
        // is cut short.
        assert_eq!(check(&[0x19, 0xf5, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x02], 8), Ok(()));
        // Structs at the known ids are read as i32s until the bytes end.
        assert_eq!(check(&[0x1c; 64], 8), Ok(()));
        // A field id given in full as i64's largest, then one more by delta.
        let mut past = vec![0x05];
        past.extend(zigzag(i64::MAX));
        past.extend(zigzag(1));
        past.extend([0x15, 0x02, 0x00]);
        assert_eq!(check(&past, 8), Ok(()), "ids past i64's range do not parse");
    }
}
