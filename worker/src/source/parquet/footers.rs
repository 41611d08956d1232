//! The decoded footers of a source's Parquet files, kept so that a row group's read does not
//! fetch, check and decode its file's footer again. Listing decodes every footer once; without
//! them, each read of a row group made the store's two reads of the footer (its closing bytes,
//! then its body) and repeated the check and the decode. On a file of 1,954 row groups (a
//! 2.2-MB footer), that was most of a worker's time reading it.
//!
//! A source keeps its footers within a budget of decoded bytes (as
//! [`ParquetMetaData::memory_size`] counts them; a share of the process's memory,
//! `crate::memory::footers_for`), oldest out first. A footer larger than the whole budget is not
//! kept: each read of its file decodes it, as before. The footers are those of the listed objects
//! (input, path and size): a source reads the files its listing found, and so does the cache.

use super::pages;
use object_store::path::Path as StorePath;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::ParquetMetaData;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

/// A column chunk as the footer places it, and the least bits each of its values takes.
#[derive(Debug)]
pub(super) struct Chunk {
    pub bytes: Range<u64>,
    pub value_bits: u64,
}

/// A file's decoded footer: the metadata a stream builder takes, and where its column chunks lie
/// (for the page check).
pub(super) struct Footer {
    pub metadata: ArrowReaderMetadata,
    pub chunks: Arc<[Chunk]>,
}

impl Footer {
    /// `metadata` as the stream builder takes it: with the Arrow schema derived by the default
    /// options, which those of `ParquetRecordBatchStreamBuilder::new` are.
    pub fn new(metadata: Arc<ParquetMetaData>) -> parquet::errors::Result<Footer> {
        let chunks = chunks(&metadata);
        let metadata = ArrowReaderMetadata::try_new(metadata, ArrowReaderOptions::new())?;
        Ok(Footer { metadata, chunks })
    }

    /// What keeping it costs, in bytes.
    fn weight(&self) -> usize {
        self.metadata.metadata().memory_size() + self.chunks.len() * size_of::<Chunk>()
    }
}

/// Every column chunk of the file `metadata` describes, in the order of their offsets (writers
/// write them in the footer's order, but nothing promises it), so that a fetch finds its chunks
/// by binary search. A chunk whose offset or length is negative, or whose end overflows, is
/// left out: no fetch starts in it.
pub(super) fn chunks(metadata: &ParquetMetaData) -> Arc<[Chunk]> {
    let columns = metadata.row_groups().iter().flat_map(|group| group.columns());
    let mut chunks: Vec<Chunk> = columns
        .filter_map(|c| {
            let start = u64::try_from(c.dictionary_page_offset().unwrap_or(c.data_page_offset())).ok()?;
            let end = start.checked_add(u64::try_from(c.compressed_size()).ok()?)?;
            let descr = c.column_descr();
            let value_bits = pages::least_value_bits(descr.physical_type(), descr.type_length());
            Some(Chunk { bytes: start..end, value_bits })
        })
        .collect();
    chunks.sort_by_key(|c| c.bytes.start);
    chunks.into()
}

/// A listed object: the source's input it belongs to, its path and its size.
type Key = (usize, StorePath, u64);

/// One source's decoded footers (see the module's doc).
pub struct Footers {
    budget: usize,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    footers: HashMap<Key, Arc<Footer>>,
    /// Keys in the order they were kept, oldest first.
    order: VecDeque<Key>,
    /// Their weights' sum.
    weight: usize,
}

impl std::fmt::Debug for Footers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Footers")
            .field("budget", &self.budget)
            .field("files", &kept.footers.len())
            .field("weight", &kept.weight)
            .finish()
    }
}

impl Footers {
    /// An empty set that keeps at most `budget` decoded bytes (0: keeps none).
    pub fn new(budget: usize) -> Footers {
        Footers { budget, kept: Mutex::default() }
    }

    /// The footer of `input`'s object at `location`, of `size` bytes, if it is kept.
    pub(super) fn get(&self, input: usize, location: &StorePath, size: u64) -> Option<Arc<Footer>> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.footers.get(&(input, location.clone(), size)).cloned()
    }

    /// Keeps `footer` as that of `input`'s object at `location`, of `size` bytes, putting out the
    /// oldest footers until the budget holds it; one larger than the budget is not kept.
    pub(super) fn keep(&self, input: usize, location: &StorePath, size: u64, footer: &Arc<Footer>) {
        let weight = footer.weight();
        if weight > self.budget {
            tracing::debug!(%location, weight, budget = self.budget, "a Parquet footer too large to keep");
            return;
        }
        let key = (input, location.clone(), size);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.footers.contains_key(&key) {
            return;
        }
        while kept.weight + weight > self.budget {
            let Some(oldest) = kept.order.pop_front() else { break };
            if let Some(out) = kept.footers.remove(&oldest) {
                kept.weight -= out.weight();
            }
        }
        kept.weight += weight;
        kept.order.push_back(key.clone());
        kept.footers.insert(key, Arc::clone(footer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::WriterProperties;

    /// The footer of a file of `groups` row groups of one INT64 column.
    fn footer(groups: usize) -> Arc<Footer> {
        let column: ArrayRef = Arc::new(Int64Array::from_iter_values(0..groups as i64 * 2));
        let batch = RecordBatch::try_from_iter([("x", column)]).unwrap();
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(2)).build();
        let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        let file = bytes::Bytes::from(writer.into_inner().unwrap());
        let metadata = ParquetMetaDataReader::new().parse_and_finish(&file).unwrap();
        assert_eq!(metadata.num_row_groups(), groups);
        Arc::new(Footer::new(Arc::new(metadata)).unwrap())
    }

    #[test]
    fn a_footer_lists_each_column_chunk_where_its_file_puts_it() {
        let f = footer(3);
        assert_eq!(f.chunks.len(), 3);
        assert!(f.chunks.windows(2).all(|w| w[0].bytes.end <= w[1].bytes.start), "{:?}", f.chunks);
        assert!(f.chunks.iter().all(|c| c.bytes.start >= 4 && c.value_bits == 64), "{:?}", f.chunks);
        assert_eq!(f.metadata.schema().fields().len(), 1);
    }

    #[test]
    fn a_kept_footer_is_found_by_its_input_path_and_size_only() {
        let footers = Footers::new(crate::memory::MAX_FOOTER_BYTES);
        let (a, b) = (StorePath::from("a.parquet"), StorePath::from("b.parquet"));
        let f = footer(2);
        footers.keep(0, &a, 100, &f);
        assert!(Arc::ptr_eq(&footers.get(0, &a, 100).unwrap(), &f));
        assert!(footers.get(1, &a, 100).is_none(), "another input's object of the same path");
        assert!(footers.get(0, &a, 101).is_none(), "another size");
        assert!(footers.get(0, &b, 100).is_none());
    }

    #[test]
    fn the_oldest_footers_go_when_the_budget_is_spent_and_one_too_large_is_not_kept() {
        let f = footer(2);
        let weight = f.weight();
        let footers = Footers::new(weight * 2);
        let paths: Vec<StorePath> = (0..3).map(|i| StorePath::from(format!("{i}.parquet"))).collect();
        for p in &paths {
            footers.keep(0, p, 1, &f);
        }
        assert!(footers.get(0, &paths[0], 1).is_none(), "the oldest went");
        assert!(footers.get(0, &paths[1], 1).is_some() && footers.get(0, &paths[2], 1).is_some());
        footers.keep(0, &paths[2], 1, &f);
        assert!(footers.get(0, &paths[1], 1).is_some(), "keeping a kept one again puts nothing out");

        let large = footer(40);
        assert!(large.weight() > weight * 2);
        footers.keep(0, &paths[0], 1, &large);
        assert!(footers.get(0, &paths[0], 1).is_none(), "larger than the budget");
        assert!(footers.get(0, &paths[1], 1).is_some(), "and nothing went for it");
        assert!(Footers::new(0).get(0, &paths[0], 1).is_none());
        let none = Footers::new(0);
        none.keep(0, &paths[0], 1, &f);
        assert!(none.get(0, &paths[0], 1).is_none(), "a budget of 0 keeps nothing");
    }
}
