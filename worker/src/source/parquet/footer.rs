//! A file's footer (its `FileMetaData`), read step for step as the parquet crate (60.1) decodes
//! it (`parquet_metadata_from_bytes` over its slice protocol, with the default metadata options
//! and without the `encryption` feature), before the crate decodes it.
//!
//! The crate's skip of an unknown field takes no byte for a boolean element of a collection (see
//! [`Cursor`]), so eight bytes of footer, a field no reader knows holding a list of 2^31
//! booleans, keep the crate busy for seconds, and a footer of such fields for hours: listing
//! the bucket or opening the file stalls on one crafted object. [`check`] refuses a footer
//! whose decoding would take more steps than its bytes.
//!
//! Each struct is read as the crate reads it: a known id by the crate's type for it, whatever
//! type the field declares, and any other id skipped by its declared type. Where the crate
//! refuses a value (an enum out of range, a string that is not UTF-8, a required field missing,
//! a list that claims more elements than bytes are left, a schema that does not build) this
//! reader may read on: it then counts steps the crate does not take, which can only refuse a
//! footer the crate refuses too. Where this reader stops (the bytes end, a type no protocol has,
//! a list of another element type than the crate's), the crate fails as well, at the same byte.

use super::thrift::{Cursor, Protocol, SKIP_DEPTH, Step, Unread, bool_field};

/// What the crate reads at an id it knows.
#[derive(Clone, Copy)]
enum Read {
    /// `i16`, `i32`, `i64` and enums: a varint. The element type each takes in a list.
    I16,
    I32,
    I64,
    /// `i8`: one byte.
    Byte,
    /// A boolean: the value is in the field's header.
    Bool,
    /// A string or a binary: its length, then its bytes.
    Bytes,
    Double,
    /// A list of one element type, which the crate requires of the list's header.
    List(&'static Read),
    /// A struct: the ids it knows, in no order; any other id is skipped.
    Struct(&'static [(i16, Read)]),
    /// A union: exactly one field, then the stop.
    Union(&'static Union),
    /// An empty struct as a union's variant (`skip_empty_struct`): a single stop byte.
    Empty,
}

/// A union's variants, and what the crate does with an id it does not know.
struct Union {
    variants: &'static [(i16, Read)],
    /// Skips an unknown variant (`thrift_union_with_unknown`, `ColumnOrder`) rather than fail.
    skips_unknown: bool,
}

impl Read {
    /// The element type the crate requires of a list of these (`ELEMENT_TYPE`).
    fn element_type(self) -> u8 {
        match self {
            Read::Bool => 1,
            Read::Byte => 3,
            Read::I16 => 4,
            Read::I32 => 5,
            Read::I64 => 6,
            Read::Double => 7,
            Read::Bytes => 8,
            Read::List(_) => 9,
            Read::Struct(_) | Read::Union(_) | Read::Empty => 12,
        }
    }
}

use Read::{Bool, Byte, Bytes, Double, Empty, I16, I32, I64, List};

const STATISTICS: Read = Read::Struct(&[
    (1, Bytes),
    (2, Bytes),
    (3, I64),
    (4, I64),
    (5, Bytes),
    (6, Bytes),
    (7, Bool),
    (8, Bool),
    (9, I64),
]);
const TIME_UNIT: Read =
    Read::Union(&Union { variants: &[(1, Empty), (2, Empty), (3, Empty)], skips_unknown: false });
const TIMESTAMP: Read = Read::Struct(&[(1, Bool), (2, TIME_UNIT)]);
const LOGICAL_TYPE: Read = Read::Union(&Union {
    variants: &[
        (1, Empty),
        (2, Empty),
        (3, Empty),
        (4, Empty),
        (5, Read::Struct(&[(1, I32), (2, I32)])),
        (6, Empty),
        (7, TIMESTAMP),
        (8, TIMESTAMP),
        (10, Read::Struct(&[(1, Byte), (2, Bool)])),
        (11, Empty),
        (12, Empty),
        (13, Empty),
        (14, Empty),
        (15, Empty),
        (16, Read::Struct(&[(1, Byte)])),
        (17, Read::Struct(&[(1, Bytes)])),
        (18, Read::Struct(&[(1, Bytes), (2, I32)])),
        (19, Empty),
    ],
    skips_unknown: true,
});
const SCHEMA_ELEMENT: Read = Read::Struct(&[
    (1, I32),
    (2, I32),
    (3, I32),
    (4, Bytes),
    (5, I32),
    (6, I32),
    (7, I32),
    (8, I32),
    (9, I32),
    (10, LOGICAL_TYPE),
]);
const PAGE_ENCODING_STATS: Read = Read::Struct(&[(1, I32), (2, I32), (3, I32)]);
const SIZE_STATISTICS: Read = Read::Struct(&[(1, I64), (2, List(&I64)), (3, List(&I64))]);
const BOUNDING_BOX: Read = Read::Struct(&[
    (1, Double),
    (2, Double),
    (3, Double),
    (4, Double),
    (5, Double),
    (6, Double),
    (7, Double),
    (8, Double),
]);
const GEOSPATIAL_STATISTICS: Read = Read::Struct(&[(1, BOUNDING_BOX), (2, List(&I32))]);
/// `ColumnMetaData` (`read_column_metadata`): 3 (the path) and 8 (key-value metadata) are
/// skipped.
const COLUMN_META_DATA: Read = Read::Struct(&[
    (1, I32),
    (2, List(&I32)),
    (4, I32),
    (5, I64),
    (6, I64),
    (7, I64),
    (9, I64),
    (10, I64),
    (11, I64),
    (12, STATISTICS),
    (13, List(&PAGE_ENCODING_STATS)),
    (14, I64),
    (15, I32),
    (16, SIZE_STATISTICS),
    (17, GEOSPATIAL_STATISTICS),
]);
/// `ColumnChunk` (`read_column_chunk`): 8 and 9 (encryption) are skipped.
const COLUMN_CHUNK: Read =
    Read::Struct(&[(1, Bytes), (2, I64), (3, COLUMN_META_DATA), (4, I64), (5, I32), (6, I64), (7, I32)]);
const SORTING_COLUMN: Read = Read::Struct(&[(1, I32), (2, Bool), (3, Bool)]);
/// `RowGroup` (`read_row_group`): 6 (the compressed size) is skipped.
const ROW_GROUP: Read = Read::Struct(&[
    (1, List(&COLUMN_CHUNK)),
    (2, I64),
    (3, I64),
    (4, List(&SORTING_COLUMN)),
    (5, I64),
    (7, I16),
]);
const KEY_VALUE: Read = Read::Struct(&[(1, Bytes), (2, Bytes)]);
const COLUMN_ORDER: Read =
    Read::Union(&Union { variants: &[(1, Empty), (2, Empty), (3, Empty)], skips_unknown: true });
/// `FileMetaData` (`parquet_metadata_from_bytes`): 8 and 9 (encryption) are skipped.
const FILE_META_DATA: Read = Read::Struct(&[
    (1, I32),
    (2, List(&SCHEMA_ELEMENT)),
    (3, I64),
    (4, List(&ROW_GROUP)),
    (5, List(&KEY_VALUE)),
    (6, Bytes),
    (7, List(&COLUMN_ORDER)),
]);

/// Checks the footer's thrift bytes (between the data and the closing length and magic): an
/// error says that decoding it would take more steps than its bytes hold. A footer the crate
/// fails to decode is left to the crate, which reports it.
pub(super) fn check(footer: &[u8]) -> Result<(), String> {
    let mut c = Cursor::new(footer, Protocol::Slice);
    match read(&mut c, FILE_META_DATA, 12) {
        Ok(()) | Err(Unread::Fails) => Ok(()),
        Err(Unread::Excess { steps, bytes }) => Err(format!(
            "decoding its footer would take the Parquet reader more than {steps} steps in its first \
             {bytes} bytes (a list or map that claims more elements than it holds); the file is \
             corrupt: rewrite it"
        )),
    }
}

/// Reads one value as `what`, in a field that declared `kind`.
fn read(c: &mut Cursor<'_>, what: Read, kind: u8) -> Step<()> {
    match what {
        I16 | I32 | I64 => c.varint().map(drop),
        Byte => c.byte().map(drop),
        Bool => bool_field(kind),
        Bytes => c.binary(),
        Double => c.double(),
        List(element) => {
            let (declared, n) = c.list_begin()?;
            if declared != element.element_type() {
                return Err(Unread::Fails);
            }
            for _ in 0..n {
                c.element()?;
                read(c, *element, declared)?;
            }
            Ok(())
        }
        Read::Struct(known) => c.fields(|c, id, kind| match known.iter().find(|(k, _)| *k == id) {
            Some((_, what)) => read(c, *what, kind),
            None => c.skip(kind, SKIP_DEPTH),
        }),
        Read::Union(union) => {
            let Some((id, kind)) = c.field_begin(0)? else { return Err(Unread::Fails) };
            match union.variants.iter().find(|(k, _)| *k == id) {
                Some((_, what)) => read(c, *what, kind)?,
                None if union.skips_unknown => c.skip(kind, SKIP_DEPTH)?,
                None => return Err(Unread::Fails),
            }
            match c.field_begin(id)? {
                None => Ok(()),
                Some(_) => Err(Unread::Fails),
            }
        }
        Empty => match c.byte()? {
            0 => Ok(()),
            _ => Err(Unread::Fails),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::thrift::encode::{field, varint, zigzag};
    use super::*;
    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::{
        ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int64Array,
        RecordBatch, StringArray, StructArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field};
    use parquet::file::metadata::{KeyValue, SortingColumn};
    use parquet::file::properties::WriterProperties;
    use std::sync::Arc;

    /// Eight bytes: a field of id 0 (no field of the format) holding a list of 2^31 - 1
    /// booleans, which the crate skips an element at a time, taking no byte for each.
    const BOOLEANS: [u8; 8] = [0x09, 0x00, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];

    /// Reads a footer to its end: the bytes it took.
    fn read_to_end(footer: &[u8]) -> Step<usize> {
        let mut c = Cursor::new(footer, Protocol::Slice);
        read(&mut c, FILE_META_DATA, 12)?;
        Ok(c.at())
    }

    /// A file the parquet crate writes with most of what a footer holds: logical types, nested
    /// and list columns, statistics, key-value metadata, sorting columns, three row groups.
    fn written() -> Vec<u8> {
        let mut list = ListBuilder::new(Int32Builder::new());
        for i in 0..5 {
            list.values().append_slice(&[i, i + 1]);
            list.append(i != 3);
        }
        let inner: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5]));
        let nested = StructArray::from(vec![(Arc::new(Field::new("n", DataType::Int64, false)), inner)]);
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("text", Arc::new(StringArray::from(vec!["a", "bb", "ccc", "a", "e"]))),
            ("bytes", Arc::new(BinaryArray::from(vec![&b"\x00\xf1"[..], b"", b"x", b"yz", b"\xff"]))),
            ("flag", Arc::new(BooleanArray::from(vec![true, false, true, true, false]))),
            ("score", Arc::new(Float64Array::from(vec![0.5, -1.0, f64::NAN, 2.0, 3.5]))),
            ("at", Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3, 4, 5]).with_timezone("UTC"))),
            ("day", Arc::new(Date32Array::from(vec![1, 2, 3, 4, 5]))),
            (
                "price",
                Arc::new(
                    Decimal128Array::from(vec![100, 250, 399, 1, 0]).with_precision_and_scale(10, 2).unwrap(),
                ),
            ),
            ("values", Arc::new(list.finish())),
            ("nested", Arc::new(nested)),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .set_key_value_metadata(Some(vec![KeyValue::new("origin".into(), "a test".to_string())]))
            .set_sorting_columns(Some(vec![SortingColumn {
                column_idx: 0,
                descending: true,
                nulls_first: false,
            }]))
            .build();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(Vec::new(), batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.into_inner().unwrap()
    }

    /// The footer's thrift bytes of a whole file.
    fn footer_of(file: &[u8]) -> &[u8] {
        let n = file.len();
        let len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
        &file[n - 8 - len..n - 8]
    }

    #[test]
    fn a_writers_footer_is_read_to_its_end() {
        let file = written();
        let footer = footer_of(&file);
        assert_eq!(read_to_end(footer), Ok(footer.len()));
        assert_eq!(check(footer), Ok(()));
        // And the crate decodes what was checked.
        let metadata = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(footer).unwrap();
        assert_eq!(metadata.num_row_groups(), 3);
    }

    #[test]
    fn a_list_of_booleans_in_a_field_no_reader_knows_is_refused() {
        let file = written();
        let footer = [&BOOLEANS[..], footer_of(&file)].concat();
        let refused = check(&footer).unwrap_err();
        assert!(refused.contains("steps") && refused.contains("footer"), "{refused}");
    }

    /// A footer of one column and one row group whose column's statistics hold `statistics`.
    fn with_statistics(statistics: &[u8]) -> Vec<u8> {
        let mut out = vec![field(1, 5)];
        out.extend(zigzag(2));
        // The schema: a root of one child, and the child (a required INT64 named "x").
        out.extend([field(1, 9), 0x2c, field(4, 8), 4]);
        out.extend(b"root");
        out.push(field(1, 5));
        out.extend(zigzag(1));
        out.extend([0, field(1, 5)]);
        out.extend(zigzag(2));
        out.push(field(2, 5));
        out.extend(zigzag(0));
        out.extend([field(1, 8), 1, b'x', 0]);
        out.push(field(1, 6));
        out.extend(zigzag(1));
        // One row group of one column chunk: its offset, then its metadata.
        out.extend([field(1, 9), 0x1c, field(1, 9), 0x1c, field(2, 6)]);
        out.extend(zigzag(4));
        out.push(field(1, 12));
        // The column's metadata: its type, encodings (plain), codec, counts and sizes, where
        // its data starts, then field 12, the statistics, then its stop.
        out.push(field(1, 5));
        out.extend(zigzag(2));
        out.extend([field(1, 9), 0x15]);
        out.extend(zigzag(0));
        out.push(field(2, 5));
        out.extend(zigzag(0));
        for (delta, value) in [(1, 1), (1, 10), (1, 10), (2, 4)] {
            out.push(field(delta, 6));
            out.extend(zigzag(value));
        }
        out.push(field(3, 12));
        out.extend(statistics);
        out.extend([0, 0]);
        // The row group's sizes, its stop, and the file's.
        out.push(field(1, 6));
        out.extend(zigzag(10));
        out.push(field(1, 6));
        out.extend(zigzag(1));
        out.extend([0, 0]);
        out
    }

    #[test]
    fn a_list_of_booleans_deep_in_the_footer_is_refused() {
        // Statistics holding a max and a min value (fields 5 and 6, 8 bytes each): read to the end.
        let mut values = vec![field(5, 8), 8];
        values.extend(9i64.to_le_bytes());
        values.extend([field(1, 8), 8]);
        values.extend(1i64.to_le_bytes());
        values.push(0);
        let plain = with_statistics(&values);
        assert_eq!(read_to_end(&plain), Ok(plain.len()));
        // The crate reads it too, statistics and all.
        let metadata = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&plain).unwrap();
        let column = metadata.row_group(0).column(0);
        assert_eq!((column.num_values(), column.data_page_offset()), (1, 4));
        assert!(column.statistics().is_some());
        // Statistics holding field 20 (no field of the format), a list of 2^31 - 1 booleans.
        let mut booleans = vec![0x09];
        booleans.extend(zigzag(20));
        booleans.push(0xf1);
        booleans.extend(varint(i32::MAX as u64));
        booleans.push(0);
        assert!(matches!(read_to_end(&with_statistics(&booleans)), Err(Unread::Excess { .. })));
        // A map of booleans to booleans, the same.
        let mut map = vec![0x0b];
        map.extend(zigzag(20));
        map.extend(varint(1 << 30));
        map.extend([0x11, 0]);
        assert!(matches!(read_to_end(&with_statistics(&map)), Err(Unread::Excess { .. })));
    }

    #[test]
    fn a_known_id_is_read_by_the_crates_type_whatever_it_declares() {
        // The version (id 1, an i32) declared as a binary of 8 bytes: the crate reads the length
        // as the version, then the binary's bytes as fields: a field of id 30 holding a list of
        // 2^31 - 1 booleans.
        let file = written();
        let mut footer = vec![field(1, 8), 8, 0x09];
        footer.extend(zigzag(30));
        footer.extend([0xf1, 0xff, 0xff, 0xff, 0xff, 0x07]);
        footer.extend(footer_of(&file));
        assert!(matches!(read_to_end(&footer), Err(Unread::Excess { .. })));
        // Read by the declared types, as the protocol says, the list is a binary's bytes.
        let mut by_protocol = Cursor::new(&footer, Protocol::Slice);
        assert_ne!(
            std::mem::discriminant(&by_protocol.skip(12, SKIP_DEPTH)),
            std::mem::discriminant(&Err::<(), _>(Unread::Excess { steps: 0, bytes: 0 }))
        );
    }

    #[test]
    fn a_logical_types_unknown_variant_is_skipped_as_the_crate_does() {
        // A schema element whose logical type is variant 30 (none yet), a list of 2^31 - 1
        // booleans: the crate skips it.
        let mut footer = vec![field(2, 9), 0x1c, field(4, 8), 1, b'x', field(6, 12), 0x09];
        footer.extend(zigzag(30));
        footer.extend([0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 0, 0, 0]);
        assert!(matches!(read_to_end(&footer), Err(Unread::Excess { .. })));
        // A known variant with its stop; then a second variant, which the crate refuses.
        let known = [field(2, 9), 0x1c, field(4, 8), 1, b'x', field(6, 12), field(1, 12), 0, 0, 0, 0];
        assert_eq!(read_to_end(&known), Ok(known.len()));
        let two = [
            field(2, 9),
            0x1c,
            field(4, 8),
            1,
            b'x',
            field(6, 12),
            field(1, 12),
            0,
            field(1, 12),
            0,
            0,
            0,
            0,
        ];
        assert_eq!(read_to_end(&two), Err(Unread::Fails));
    }

    #[test]
    fn wherever_the_crate_decodes_a_changed_footer_this_reader_reads_it_whole() {
        // Every byte of a writer's footer changed in several ways: wherever the crate still
        // decodes the footer, this reader must not have stopped or refused it. Stopping where
        // the crate goes on is the one way this reader could miss steps the crate takes.
        let file = written();
        let footer = footer_of(&file);
        let (mut decoded, mut changed) = (0, 0);
        for at in 0..footer.len() {
            for change in [0x01u8, 0x02, 0x04, 0x10, 0x40, 0x80, 0x0f, 0xff] {
                let mut bytes = footer.to_vec();
                bytes[at] ^= change;
                changed += 1;
                if parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&bytes).is_ok() {
                    decoded += 1;
                    assert!(
                        read_to_end(&bytes).is_ok(),
                        "byte {at} ^ {change:#04x}: {:?}",
                        read_to_end(&bytes)
                    );
                }
            }
            // And the byte taken out.
            let cut = [&footer[..at], &footer[at + 1..]].concat();
            changed += 1;
            if parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&cut).is_ok() {
                decoded += 1;
                assert!(read_to_end(&cut).is_ok(), "byte {at} taken out: {:?}", read_to_end(&cut));
            }
        }
        eprintln!("{decoded} of {changed} changed footers decoded");
        assert!(decoded > changed / 10, "{decoded} of {changed} changed footers decoded");
    }

    #[test]
    fn what_the_crate_refuses_is_left_to_it() {
        let file = written();
        let footer = footer_of(&file);
        assert_eq!(check(&footer[..footer.len() / 2]), Ok(()), "cut short");
        assert_eq!(check(&[]), Ok(()));
        // A list of the wrong element type where the crate knows the type: the crate stops.
        assert_eq!(read_to_end(&[field(2, 9), 0x15, 0x02, 0]), Err(Unread::Fails));
        // A binary longer than the bytes.
        assert_eq!(read_to_end(&[field(6, 8), 9, b'a']), Err(Unread::Fails));
    }
}
