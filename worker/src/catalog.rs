//! What the dispatcher plans an epoch with: the source's splits and how many elements each one
//! yields. Files and Parquet row groups are counted from the listing. WebDataset shards are
//! counted from their tar headers alone (members are skipped, not fetched), TFRecord files from
//! their record headers alone (data is skipped, or decompressed and discarded) and JSONL files by
//! streaming their lines through a fixed buffer, and CSV files by parsing their rows into a fixed
//! buffer, so counting holds no object in memory. Counting checks what it reads: a damaged record
//! header or a CSV row with a missing cell fails the listing, before any epoch starts. Counting has
//! a time budget ([`COUNT_BUDGET`] unless given): past it, the listing fails and says how far it
//! got.

mod lines;
mod ranged;
mod records;
mod rows;
mod shards;
#[cfg(test)]
mod tests;

use ranged::Deadline;

use crate::source::{Source, SourceError, Split, SplitKind};
use granary_crds::InputPipelineSpec;
use std::time::Duration;

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

/// How long listing and counting a pipeline's source may take by default.
pub const COUNT_BUDGET: Duration = Duration::from_secs(60);

/// Lists every input of `spec` and counts each split's elements within [`COUNT_BUDGET`]. Blocks;
/// call it off any async runtime.
pub fn list(spec: &InputPipelineSpec) -> Result<Listing, SourceError> {
    list_within(spec, COUNT_BUDGET)
}

/// Lists every input of `spec` and counts each split's elements, failing once `budget` is spent.
/// Blocks; call it off any async runtime.
pub fn list_within(spec: &InputPipelineSpec, budget: Duration) -> Result<Listing, SourceError> {
    let deadline = Deadline::after(budget);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("granary-catalog")
        .enable_all()
        .build()
        .map_err(|e| SourceError::data("spec.source.url", format!("cannot start the I/O runtime: {e}")))?;
    let opened = runtime.block_on(async {
        tokio::time::timeout(budget, Source::open_all(spec, spec.batch.size.max(1) as usize)).await
    });
    let source = match opened {
        Ok(source) => source?,
        Err(_) => return Err(spent(budget, "listing the source", None)),
    };
    let inputs = source.input_splits();
    let splits = source.splits();
    let mut facts = vec![SplitFacts { elements: 0, bytes: 0 }; splits.len()];
    let readers = splits.len().clamp(1, 4);
    let chunk = splits.len().div_ceil(readers).max(1);
    let handle = runtime.handle();
    let counted = std::sync::atomic::AtomicUsize::new(0);
    let result = std::thread::scope(|scope| {
        let jobs: Vec<_> = splits
            .chunks(chunk)
            .zip(facts.chunks_mut(chunk))
            .map(|(splits, out)| {
                let (source, counted) = (&source, &counted);
                scope.spawn(move || -> Result<(), SourceError> {
                    for (split, fact) in splits.iter().zip(out) {
                        let elements = count(source, split, handle, deadline)?;
                        *fact = SplitFacts { elements, bytes: split.bytes() };
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    });
    if deadline.passed() && result.is_err() {
        let done = (counted.into_inner(), splits.len());
        return Err(spent(budget, "counting the source's elements", Some(done)));
    }
    result?;
    Ok(Listing { splits: facts, inputs })
}

/// The error of a listing that ran out of `budget` while `doing` (with `(counted, splits)` when
/// counting).
fn spent(budget: Duration, doing: &str, progress: Option<(usize, usize)>) -> SourceError {
    let progress = match progress {
        Some((counted, splits)) => format!(" ({counted} of {splits} splits counted)"),
        None => String::new(),
    };
    SourceError::data(
        "spec.source.url",
        format!(
            "{doing} took longer than its {}s budget{progress}; check that the store answers, use \
             fewer and larger objects, or raise the budget (granary operator --count-budget)",
            budget.as_secs_f64()
        ),
    )
}

fn count(
    source: &Source,
    split: &Split,
    rt: &tokio::runtime::Handle,
    deadline: Deadline,
) -> Result<u64, SourceError> {
    let store = || {
        source
            .store_of(split)
            .ok_or_else(|| SourceError::data(format!("split {}", split.id), "names no listed input"))
    };
    match &split.kind {
        SplitKind::Files(files) => Ok(files.len() as u64),
        SplitKind::RowGroup { rows, .. } => Ok(*rows),
        SplitKind::Shard(object) => shards::count(store()?, object, rt, deadline),
        SplitKind::Jsonl(object) => lines::count(store()?, object, rt, deadline),
        SplitKind::Tfrecord { object, gzip } => records::count(store()?, object, *gzip, rt, deadline),
        SplitKind::Csv { object, delimiter } => rows::count(store()?, object, *delimiter, rt, deadline),
    }
}
