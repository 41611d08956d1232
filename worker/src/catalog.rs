//! What the dispatcher plans an epoch with: the source's splits and how many elements each one
//! yields. Files and Parquet row groups are counted from the listing; WebDataset shards and JSONL,
//! TFRecord and CSV files are read once (without decoding images) to count their samples, lines,
//! records or rows. Reading them checks them too: a corrupt TFRecord (a CRC that does not match)
//! or a CSV row with a missing cell fails the listing, before any epoch starts.

use crate::source::{Source, SourceError, Split, SplitKind};
use granary_crds::InputPipelineSpec;

/// One split as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitFacts {
    /// Elements the split yields.
    pub elements: u64,
    /// Bytes it reads from the store.
    pub bytes: u64,
}

/// A pipeline's listing: every split's facts, numbered across its inputs in order, and which
/// splits belong to which input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Each split's facts, by split id.
    pub splits: Vec<SplitFacts>,
    /// Split ids of each input (`spec.source`, or each of `spec.sources`), in order.
    pub inputs: Vec<std::ops::Range<usize>>,
}

/// Lists `spec`'s source and counts each split's elements. Blocks; call it off any async runtime.
pub fn describe(spec: &InputPipelineSpec) -> Result<Vec<SplitFacts>, SourceError> {
    list(spec).map(|listing| listing.splits)
}

/// Lists every input of `spec` and counts each split's elements. Blocks; call it off any async
/// runtime.
pub fn list(spec: &InputPipelineSpec) -> Result<Listing, SourceError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("granary-catalog")
        .enable_all()
        .build()
        .map_err(|e| SourceError::data("spec.source.url", format!("cannot start the I/O runtime: {e}")))?;
    let source = runtime.block_on(Source::open_all(spec, spec.batch.size.max(1) as usize))?;
    let inputs = source.input_splits();
    let splits = source.splits();
    let mut facts = vec![SplitFacts { elements: 0, bytes: 0 }; splits.len()];
    let readers = splits.len().clamp(1, 4);
    let chunk = splits.len().div_ceil(readers).max(1);
    let handle = runtime.handle();
    std::thread::scope(|scope| {
        let jobs: Vec<_> = splits
            .chunks(chunk)
            .zip(facts.chunks_mut(chunk))
            .map(|(splits, out)| {
                let source = &source;
                scope.spawn(move || -> Result<(), SourceError> {
                    for (split, fact) in splits.iter().zip(out) {
                        *fact = SplitFacts { elements: count(source, split, handle)?, bytes: split.bytes() };
                    }
                    Ok(())
                })
            })
            .collect();
        for job in jobs {
            match job.join() {
                Ok(result) => result?,
                Err(_) => return Err(SourceError::data("spec.source.url", "a counting thread failed")),
            }
        }
        Ok(())
    })?;
    Ok(Listing { splits: facts, inputs })
}

fn count(source: &Source, split: &Split, rt: &tokio::runtime::Handle) -> Result<u64, SourceError> {
    match &split.kind {
        SplitKind::Files(files) => Ok(files.len() as u64),
        SplitKind::RowGroup { rows, .. } => Ok(*rows),
        SplitKind::Shard(_) | SplitKind::Jsonl(_) | SplitKind::Tfrecord { .. } | SplitKind::Csv { .. } => {
            let mut n = 0u64;
            source.read_split(split, rt, &mut |_| {
                n += 1;
                true
            })?;
            Ok(n)
        }
    }
}
