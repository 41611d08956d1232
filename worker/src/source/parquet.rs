//! `format: parquet`: one row per sample; a row group is a split. Rows are decoded one record
//! batch at a time. With a [`Projection`], only the top-level columns it names are read: the
//! others' column chunks are neither fetched nor decoded.

// `ParquetObjectReader` is deprecated in parquet 60 in favour of hand-written `AsyncFileReader`s;
// it still reads correctly over any `object_store`, and replacing it is tracked for the cache work.
#![allow(deprecated)]

mod footer;
mod footers;
mod pages;
mod thrift;

pub(super) use footers::Footers;

use super::columns::Column;
use super::{Emit, Object, Projection, SourceError, Split, SplitKind, record_key, relative_key};
use crate::contained::contained;
use crate::element::{Element, FieldName};
use crate::store::Located;
use bytes::Bytes;
use footers::{Chunk, Footer};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::{AsyncFileReader, ParquetObjectReader, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::FOOTER_SIZE;
use parquet::file::metadata::{FooterTail, ParquetMetaData, ParquetMetaDataReader};
use std::ops::Range;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Rows decoded at once.
const ROWS_PER_BATCH: usize = 1024;

/// `object`'s reader; `chunks` are its column chunks, from its footer (none before it is read).
fn reader(store: &Arc<dyn ObjectStore>, object: &Object, chunks: Arc<[Chunk]>) -> CheckedReader {
    CheckedReader {
        inner: ParquetObjectReader::new(Arc::clone(store), object.location.clone()),
        size: object.size,
        chunks,
    }
}

/// `object`'s footer, decoded: the one `footers` keeps for it (as `input`'s), or else read,
/// checked and decoded, then kept.
async fn decoded_footer(
    store: &Arc<dyn ObjectStore>,
    object: &Object,
    input: usize,
    footers: &Footers,
) -> parquet::errors::Result<Arc<Footer>> {
    if let Some(kept) = footers.get(input, &object.location, object.size) {
        return Ok(kept);
    }
    let metadata = reader(store, object, Arc::default()).metadata().await?;
    let footer = Arc::new(Footer::new(Arc::new(metadata))?);
    footers.keep(input, &object.location, object.size, &footer);
    Ok(footer)
}

/// The object's reader: it checks the footer ([`footer`]) and the page headers of each column
/// chunk it fetches ([`pages`]) before the parquet crate decodes them. Fetches are unchanged; a
/// chunk's bytes are checked where they arrive.
struct CheckedReader {
    inner: ParquetObjectReader,
    /// The object's size in bytes, from its listing: where the footer ends.
    size: u64,
    /// Every column chunk of the file, from its footer.
    chunks: Arc<[Chunk]>,
}

/// The chunks of `chunks` (in the order of their offsets) that start within `range`.
fn starting_within<'a>(chunks: &'a [Chunk], range: &Range<u64>) -> impl Iterator<Item = &'a Chunk> {
    let first = chunks.partition_point(|c| c.bytes.start < range.start);
    chunks[first..].iter().take_while(move |c| c.bytes.start < range.end)
}

impl CheckedReader {
    /// Checks the pages of each chunk that starts within `range`, whose bytes are `bytes`. The
    /// chunks are in the order of their offsets: a file of many row groups has thousands.
    fn check(&self, range: &Range<u64>, bytes: &Bytes) -> parquet::errors::Result<()> {
        for chunk in starting_within(&self.chunks, range) {
            let from = usize::try_from(chunk.bytes.start - range.start).unwrap_or(usize::MAX);
            let to = usize::try_from(chunk.bytes.end.min(range.end) - range.start).unwrap_or(usize::MAX);
            let Some(held) = bytes.get(from..to.min(bytes.len())) else { continue };
            pages::check(held, chunk.value_bits).map_err(ParquetError::General)?;
        }
        Ok(())
    }

    /// Fetches the footer as the crate's metadata reader does (its closing length and magic,
    /// then its bytes), checks it, and decodes it. The crate's errors are kept for what it
    /// refuses itself.
    async fn metadata(&mut self) -> parquet::errors::Result<ParquetMetaData> {
        let size = self.size;
        let tail_at = size
            .checked_sub(FOOTER_SIZE as u64)
            .ok_or_else(|| ParquetError::EOF(format!("file size of {size} is less than footer")))?;
        let tail = self.inner.get_bytes(tail_at..size).await?;
        let tail = <[u8; FOOTER_SIZE]>::try_from(tail.as_ref())
            .map_err(|_| ParquetError::EOF(format!("read {} bytes of the footer's 8", tail.len())))?;
        let tail = FooterTail::try_new(&tail)?;
        if tail.is_encrypted_footer() {
            return Err(ParquetError::General(
                "Parquet file has an encrypted footer, which this reader does not decrypt".into(),
            ));
        }
        let length = tail.metadata_length();
        let start = tail_at.checked_sub(length as u64).ok_or_else(|| {
            let needs = length + FOOTER_SIZE;
            ParquetError::EOF(format!("file size of {size} is less than footer + metadata {needs}"))
        })?;
        // An empty footer is not fetched (a store refuses an empty range); the crate refuses it.
        let footer = if length == 0 { Bytes::new() } else { self.inner.get_bytes(start..tail_at).await? };
        footer::check(&footer).map_err(ParquetError::General)?;
        ParquetMetaDataReader::decode_metadata(&footer)
    }
}

impl AsyncFileReader for CheckedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let bytes = self.inner.get_bytes(range.clone()).await?;
            self.check(&range, &bytes)?;
            Ok(bytes)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let fetched = self.inner.get_byte_ranges(ranges.clone()).await?;
            for (range, bytes) in ranges.iter().zip(&fetched) {
                self.check(range, bytes)?;
            }
            Ok(fetched)
        }
        .boxed()
    }

    /// The footer, checked and decoded, with the default metadata options, which the footer check
    /// mirrors (and no page index). The stream builders this reader is given to are handed the
    /// footer ([`decoded_footer`]), so they do not ask for it; this is the trait's whole answer.
    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let metadata = Arc::new(self.metadata().await?);
            self.chunks = footers::chunks(&metadata);
            Ok(metadata)
        }
        .boxed()
    }
}

/// Footers the listing reads at once: a distant store answers each read late, and a dataset may
/// hold thousands of files.
const LISTING_READS_IN_FLIGHT: usize = 16;

/// Lists `objects` (those of `input`, at `located`) into one split per row group, keeping the
/// footers it decodes in `footers` for the reads. Footers are read [`LISTING_READS_IN_FLIGHT`] at
/// a time; the splits keep the objects' order, and the first unreadable file in that order fails
/// the listing.
pub(super) async fn splits(
    located: &Located,
    objects: Vec<ObjectMeta>,
    input: usize,
    footers: &Footers,
) -> Result<Vec<Split>, SourceError> {
    let objects = objects.into_iter().filter(|o| {
        let p = o.location.as_ref();
        p.ends_with(".parquet") || p.ends_with(".parq")
    });
    // Each file's row counts, not its footer: the listing holds no more footers than it reads at
    // once, whatever `footers` keeps.
    let files = futures::stream::iter(objects.map(|o| async move {
        let object = Object { location: o.location, size: o.size };
        let footer = decoded_footer(&located.store, &object, input, footers).await.map_err(|e| {
            SourceError::data(object.location.to_string(), format!("not a readable Parquet file: {e}"))
        })?;
        let rows: Vec<u64> =
            footer.metadata.metadata().row_groups().iter().map(|rg| rg.num_rows().max(0) as u64).collect();
        Ok::<_, SourceError>((object, rows))
    }));
    let files: Vec<(Object, Vec<u64>)> = files.buffered(LISTING_READS_IN_FLIGHT).try_collect().await?;
    let mut splits = Vec::new();
    for (object, groups) in files {
        let mut first_row = 0u64;
        for (row_group, rows) in groups.into_iter().enumerate() {
            splits.push(Split {
                id: splits.len() as u64,
                kind: SplitKind::RowGroup { object: object.clone(), row_group, first_row, rows },
                input: 0,
            });
            first_row += rows;
        }
    }
    if splits.is_empty() {
        return Err(SourceError::Empty { url: located.url.to_string(), format: "parquet" });
    }
    Ok(splits)
}

/// Refuses a row group whose column chunks do not lie within the file: the footer is the file's
/// own claim, and the parquet crate panics on a negative offset or length.
fn check_row_group(metadata: &ParquetMetaData, row_group: usize, file_size: u64) -> Result<(), String> {
    let Some(group) = metadata.row_groups().get(row_group) else {
        return Err(format!("has no row group {row_group}; the file changed since it was listed"));
    };
    for (i, column) in group.columns().iter().enumerate() {
        let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
        let len = column.compressed_size();
        let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(s, l)| s.checked_add(l));
        if end.is_none_or(|end| end > file_size) {
            return Err(format!(
                "row group {row_group}, column {i}: the footer puts its {len} bytes at offset {start}, \
                 outside the {file_size}-byte file; the file is corrupt: rewrite it"
            ));
        }
    }
    Ok(())
}

/// The row group a split reads.
pub(super) struct Group<'a> {
    /// The source's input the file belongs to.
    pub input: usize,
    /// The file.
    pub object: &'a Object,
    /// Its index in the file.
    pub index: usize,
    /// Row number (within the file) of its first row.
    pub first_row: u64,
}

/// The mask reading the top-level columns `projection` names (nested columns whole).
fn projection_mask(
    schema: &parquet::schema::types::SchemaDescriptor,
    projection: &Projection,
) -> ProjectionMask {
    let roots = schema.root_schema().get_fields().iter().enumerate();
    ProjectionMask::roots(schema, roots.filter(|(_, f)| projection.contains(f.name())).map(|(i, _)| i))
}

/// Reads `group` of a file, with the footer `footers` keeps for it when it does.
pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    group: Group<'_>,
    footers: &Footers,
    projection: Option<&Projection>,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let Group { input, object, index: row_group, first_row } = group;
    let location = object.location.to_string();
    let bad = |e: parquet::errors::ParquetError| {
        SourceError::data(location.clone(), format!("cannot read Parquet: {e}"))
    };
    let footer = rt.block_on(decoded_footer(store, object, input, footers)).map_err(bad)?;
    let reader = reader(store, object, Arc::clone(&footer.chunks));
    let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.metadata.clone());
    check_row_group(builder.metadata(), row_group, object.size)
        .map_err(|m| SourceError::data(location.clone(), m))?;
    if let Some(projection) = projection {
        let mask = projection_mask(builder.parquet_schema(), projection);
        builder = builder.with_projection(mask);
    }
    let mut stream =
        builder.with_row_groups(vec![row_group]).with_batch_size(ROWS_PER_BATCH).build().map_err(bad)?;
    let file_key = relative_key(root, &object.location);
    let mut row = first_row;
    // The parquet crate panics on some corrupt pages (a dictionary-encoded page with no
    // dictionary, found by fuzzing): such a file is bad data, not a reason to lose the worker.
    let next = |stream: &mut _| {
        contained(|| rt.block_on(StreamExt::next(stream))).map_err(|why| {
            SourceError::data(
                location.clone(),
                format!(
                    "cannot read Parquet: the decoder failed on row group {row_group} ({why}); the \
                     file is corrupt: rewrite it"
                ),
            )
        })
    };
    while let Some(batch) = next(&mut stream)? {
        let batch = batch.map_err(bad)?;
        let schema = batch.schema();
        let names: Vec<FieldName> =
            schema.fields().iter().map(|f| FieldName::from(f.name().as_str())).collect();
        let columns: Vec<Column<'_>> = batch.columns().iter().map(Column::of).collect();
        for r in 0..batch.num_rows() {
            let mut element = Element::new(record_key(&file_key, ':', row));
            element.fields.reserve_exact(names.len());
            for (name, column) in names.iter().zip(&columns) {
                let value = column.value(r).map_err(|m| {
                    SourceError::data(format!("{location}:{row}"), format!("column `{name}`: {m}"))
                })?;
                if let Some(value) = value {
                    element.fields.push((name.clone(), value));
                }
            }
            row += 1;
            if !emit(element) {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counting_store::counting_store;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    use object_store::ObjectStoreExt;
    use parquet::file::properties::WriterProperties;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_fetch_checks_exactly_the_chunks_that_start_within_it() {
        // Chunks of 10 bytes every 10 bytes from 4, and one of 0 bytes at 50 beside the one there.
        let mut chunks: Vec<Chunk> =
            (0..8u64).map(|i| Chunk { bytes: 4 + 10 * i..14 + 10 * i, value_bits: 64 }).collect();
        chunks.push(Chunk { bytes: 54..54, value_bits: 64 });
        chunks.sort_by_key(|c| c.bytes.start);
        for start in 0..90 {
            for end in start..90 {
                let range = start..end;
                let fast: Vec<_> = starting_within(&chunks, &range).map(|c| c.bytes.clone()).collect();
                let all: Vec<_> = chunks
                    .iter()
                    .filter(|c| range.contains(&c.bytes.start))
                    .map(|c| c.bytes.clone())
                    .collect();
                assert_eq!(fast, all, "{range:?}");
            }
        }
    }

    /// Lists `numbers.parquet` (4 row groups of 2 rows) in `dir` with footers kept within
    /// `budget`, then reads every row group: the store's reads while listing and while reading,
    /// and the keys read.
    fn list_and_read(dir: &std::path::Path, budget: usize) -> (u64, u64, Vec<String>) {
        let (rt, counting) = counting_store(dir);
        let store: Arc<dyn ObjectStore> = counting.clone();
        let location = StorePath::from("numbers.parquet");
        let meta = rt.block_on(store.head(&location)).unwrap();
        let url = url::Url::from_directory_path(dir).unwrap();
        let located = Located { store: Arc::clone(&store), path: StorePath::from(""), url };
        let footers = Footers::new(budget);
        let before = counting.gets.load(Ordering::Relaxed);
        let splits = rt.block_on(splits(&located, vec![meta], 0, &footers)).unwrap();
        let listing = counting.gets.load(Ordering::Relaxed) - before;
        let mut keys = Vec::new();
        for split in &splits {
            let SplitKind::RowGroup { object, row_group, first_row, .. } = &split.kind else {
                panic!("{split:?}")
            };
            let group = Group { input: 0, object, index: *row_group, first_row: *first_row };
            let mut emit = |e: Element| {
                keys.push(e.key);
                true
            };
            read(&store, &located.path, group, &footers, None, rt.handle(), &mut emit).unwrap();
        }
        (listing, counting.gets.load(Ordering::Relaxed) - before - listing, keys)
    }

    /// Writes `name` in `dir`: `rows` rows of one INT64 column, in row groups of 2.
    fn write_numbers(dir: &std::path::Path, name: &str, rows: i64) {
        let column: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let batch = RecordBatch::try_from_iter([("x", column)]).unwrap();
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(2)).build();
        let file = std::fs::File::create(dir.join(name)).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// Lists the Parquet files in `dir`, in the order the store lists them (by name).
    fn list_dir(dir: &std::path::Path) -> Result<Vec<Split>, SourceError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let located = crate::store::open(url::Url::from_directory_path(dir).unwrap().as_str()).unwrap();
        let mut objects: Vec<ObjectMeta> =
            rt.block_on(located.store.list(Some(&located.path)).try_collect()).unwrap();
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        rt.block_on(splits(&located, objects, 0, &Footers::new(crate::memory::MAX_FOOTER_BYTES)))
    }

    #[test]
    fn the_listing_reads_footers_together_and_keeps_the_files_order() {
        let dir = tempfile::tempdir().unwrap();
        let files = LISTING_READS_IN_FLIGHT * 2 + 3;
        for i in 0..files {
            write_numbers(dir.path(), &format!("{i:03}.parquet"), 1 + i as i64 % 5);
        }
        let splits = list_dir(dir.path()).unwrap();
        let mut expected = Vec::new();
        for i in 0..files {
            let rows = 1 + i as u64 % 5;
            for (group, first_row) in (0..rows).step_by(2).enumerate() {
                expected.push((format!("{i:03}.parquet"), group, first_row, (rows - first_row).min(2)));
            }
        }
        let found: Vec<_> = splits
            .iter()
            .map(|s| match &s.kind {
                SplitKind::RowGroup { object, row_group, first_row, rows } => {
                    (object.location.filename().unwrap().to_string(), *row_group, *first_row, *rows)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(found, expected);
        assert!(splits.iter().enumerate().all(|(i, s)| s.id == i as u64));

        // Two unreadable files, both among the footers read at once: the first in order fails it.
        std::fs::write(dir.path().join("020.parquet"), b"not parquet").unwrap();
        std::fs::write(dir.path().join("024.parquet"), b"not parquet either").unwrap();
        let err = list_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("020.parquet") && err.contains("not a readable Parquet file"), "{err}");
    }

    #[test]
    fn the_footer_read_by_the_listing_serves_every_row_group_read() {
        let dir = tempfile::tempdir().unwrap();
        write_numbers(dir.path(), "numbers.parquet", 8);

        let (listing, reading, keys) = list_and_read(dir.path(), crate::memory::MAX_FOOTER_BYTES);
        let (listing_unkept, reading_unkept, keys_unkept) = list_and_read(dir.path(), 0);
        let expected: Vec<String> = (0..8).map(|row| format!("numbers.parquet:{row}")).collect();
        assert_eq!((keys, keys_unkept), (expected.clone(), expected));
        assert_eq!((listing, listing_unkept), (2, 2), "the footer's closing bytes, then its body");
        assert_eq!(
            reading_unkept,
            reading + 4 * 2,
            "without it, each of the 4 reads fetched the footer again"
        );
    }
}
