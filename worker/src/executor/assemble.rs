//! The assembler: restores task order, shuffles within each split, stacks batches. Elements a
//! filter dropped take their place in the order and nothing else: they reach neither the shuffle
//! buffer nor a batch, and the split's count leaves them out. With `text.pack`, the split's
//! elements are packed here, in order, and its rows are what is shuffled, batched and counted.

use super::pack::SplitPack;
use super::shuffle::ShuffleBuffer;
use super::{CacheUse, Done, ExecError, Output, Plan, Skips, StageTimes, Task};
use crate::batch::{Batch, BatchOrigin, Batcher};
use crate::budget::Budget;
use crate::cache::write::WriteThread;
use crate::cache::{CacheOutcome, ReadReport};
use crate::element::Element;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Per-split state: the shuffle buffer and the batch under construction.
struct SplitState {
    task: Task,
    split_id: u64,
    /// The shuffle buffer, unless the plan keeps the order or the reader shuffled the split.
    shuffle: Option<ShuffleBuffer<Element>>,
    batcher: Batcher,
    sequence: u64,
    /// Elements the split produced so far (those filters kept).
    elements: u64,
    /// The split's entry is being written.
    writing: bool,
    /// Why the split's entry stopped being written (an element skipped before the cut).
    unwritten: Option<String>,
    /// Elements a stage failed on that were dropped (`spec.errors.policy: skip`).
    skipped: Skips,
    /// `text.pack`: the split's packing, when the plan packs.
    pack: Option<SplitPack>,
    /// Rows the packing made from the last element, not yet taken in.
    rows: Vec<Element>,
}

/// How `task`'s batches pad: ragged image rows for a task whose images are planned
/// ([`Plan::plans_images`]), else `spec.batch.pad`.
fn padding(plan: &Plan, task: Task) -> Option<Arc<crate::batch::Padding>> {
    match &plan.client_images {
        Some(images) if plan.plans_images(task) => Some(Arc::clone(&images.padding)),
        _ => plan.padding.clone(),
    }
}

type Out<'a> = &'a Sender<Result<Output, ExecError>>;

impl SplitState {
    fn new(
        plan: &Plan,
        task: Task,
        split_id: u64,
        unstacked: Option<&str>,
        writer: &mut Writer<'_>,
    ) -> SplitState {
        let writing = writer.begin(plan, task, split_id);
        let shuffle = if plan.shuffles_first(task) { None } else { ShuffleBuffer::new(plan, task, split_id) };
        SplitState {
            task,
            split_id,
            shuffle,
            batcher: Batcher::new(plan.batch_size, padding(plan, task), plan.bucketing.clone())
                .leaving_unstacked(unstacked.map(String::from)),
            sequence: 0,
            elements: 0,
            writing,
            unwritten: None,
            skipped: Skips::default(),
            pack: SplitPack::new(plan),
            rows: Vec::new(),
        }
    }

    /// Takes one computed element in, or the rows it completes when the plan packs; false when
    /// the consumer is gone.
    fn take(
        &mut self,
        plan: &Plan,
        element: Element,
        out: Out<'_>,
        budget: &Arc<Budget>,
        times: &StageTimes,
    ) -> Result<bool, ExecError> {
        let Some(pack) = self.pack.as_mut() else {
            return self.push(element, out, budget);
        };
        pack.push(plan, self.task, self.split_id, &element, times, &mut self.rows)?;
        drop(element);
        self.take_rows(out, budget)
    }

    /// Takes in the rows the packing made; false when the consumer is gone.
    fn take_rows(&mut self, out: Out<'_>, budget: &Arc<Budget>) -> Result<bool, ExecError> {
        let mut rows = std::mem::take(&mut self.rows);
        for row in rows.drain(..) {
            if !self.push(row, out, budget)? {
                return Ok(false);
            }
        }
        self.rows = rows;
        Ok(true)
    }

    /// Takes one element in; false when the consumer is gone.
    fn push(&mut self, element: Element, out: Out<'_>, budget: &Arc<Budget>) -> Result<bool, ExecError> {
        self.elements += 1;
        let chosen = match self.shuffle.as_mut() {
            Some(shuffle) => shuffle.push(element),
            None => Some(element),
        };
        match chosen {
            Some(element) => self.add(element, out, budget),
            None => Ok(true),
        }
    }

    fn add(&mut self, element: Element, out: Out<'_>, budget: &Arc<Budget>) -> Result<bool, ExecError> {
        match self.batcher.push(element, self.task.epoch)? {
            Some(batch) => Ok(self.emit(batch, false, out, budget)),
            None => Ok(true),
        }
    }

    fn emit(&mut self, mut batch: Batch, tail: bool, out: Out<'_>, budget: &Arc<Budget>) -> bool {
        batch.origin =
            Some(BatchOrigin { epoch: self.task.epoch, split: self.split_id, sequence: self.sequence });
        self.sequence += 1;
        batch.permit = Some(budget.force(batch.nbytes()));
        out.send(Ok(Output::Batch { batch, tail })).is_ok()
    }

    /// Packs the split's last row, drains the shuffle buffer and emits the tail batch and the
    /// split's completion.
    fn finish(
        mut self,
        plan: &Plan,
        out: Out<'_>,
        budget: &Arc<Budget>,
        times: &StageTimes,
        cache: CacheOutcome,
    ) -> Result<bool, ExecError> {
        if let Some(pack) = self.pack.take() {
            pack.finish(plan, self.task, self.split_id, times, &mut self.rows)?;
            if !self.take_rows(out, budget)? {
                return Ok(false);
            }
        }
        if let Some(mut shuffle) = self.shuffle.take() {
            while let Some(chosen) = shuffle.drain() {
                if !self.add(chosen, out, budget)? {
                    return Ok(false);
                }
            }
        }
        for (batch, tail) in self.batcher.finish(self.task.epoch)? {
            if !self.emit(batch, tail, out, budget) {
                return Ok(false);
            }
        }
        let (task, elements, skipped) = (self.task, self.elements, self.skipped);
        Ok(out.send(Ok(Output::SplitDone { task, elements, cache, skipped })).is_ok())
    }
}

/// The cache writer, started on the first task that writes.
struct Writer<'a> {
    rt: &'a Handle,
    thread: Option<WriteThread>,
}

impl Writer<'_> {
    /// Begins writing `task`'s split when the task writes the cache; true if it does.
    fn begin(&mut self, plan: &Plan, task: Task, split_id: u64) -> bool {
        let CacheUse::Write { cut } = task.cache else { return false };
        let Some(cache) = plan.cache.as_ref() else { return false };
        // A virtual split id (a further pass of an upsampled source) writes its base split's
        // entry: see `EngineCache::locate`.
        let Some((cut, entry)) = cache.cut(cut).and_then(|c| Some((c, cache.entry(c, split_id)?))) else {
            return false;
        };
        if self.thread.is_none() {
            match WriteThread::start(Arc::clone(cache), self.rt.clone()) {
                Ok(t) => self.thread = Some(t),
                Err(e) => {
                    tracing::warn!("cannot start the cache writer thread: {e}; computing without writing");
                    return false;
                }
            }
        }
        if let Some(t) = &self.thread {
            t.begin(cut, entry);
        }
        true
    }

    fn record(&self, record: Vec<u8>) {
        if let Some(t) = &self.thread {
            t.record(record);
        }
    }

    fn end(&self, read: ReadReport) -> CacheOutcome {
        let mut outcome = CacheOutcome::from_read(read);
        if let Some(t) = &self.thread {
            let report = t.end();
            outcome.written = report.written;
            outcome.bytes_written = report.bytes;
            if report.problem.is_some() {
                outcome.problem = report.problem;
            }
        }
        outcome
    }
}

/// Assembles the computed elements into batches; `unstacked` names a field the batches leave in
/// the elements' buffers, for the executor's [`crate::batch::Finish`] that rewrites it.
pub(super) fn run(
    plan: &Plan,
    unstacked: Option<&str>,
    done: &Receiver<Done>,
    out: Out<'_>,
    budget: &Arc<Budget>,
    times: &StageTimes,
    rt: &Handle,
) {
    if let Err(e) = assemble(plan, unstacked, done, out, budget, times, rt) {
        let _ = out.send(Err(e));
    }
}

fn assemble(
    plan: &Plan,
    unstacked: Option<&str>,
    done: &Receiver<Done>,
    out: Out<'_>,
    budget: &Arc<Budget>,
    times: &StageTimes,
    rt: &Handle,
) -> Result<(), ExecError> {
    let mut writer = Writer { rt, thread: None };
    let mut pending: BTreeMap<u64, Done> = BTreeMap::new();
    let mut next = 0u64;
    let mut split: Option<SplitState> = None;
    for item in done.iter() {
        pending.insert(item.seq(), item);
        while let Some(item) = pending.remove(&next) {
            next += 1;
            match item {
                Done::Failed { error, .. } => return Err(error),
                Done::Element { task, split_id, element, record, permit, .. } => {
                    // The element leaves the in-flight budget: the shuffle buffer and the batch
                    // under construction are sized by the spec, not by prefetching.
                    drop(permit);
                    let state = match split.as_mut() {
                        Some(state) => state,
                        None => split.insert(SplitState::new(plan, task, split_id, unstacked, &mut writer)),
                    };
                    if state.writing
                        && let Some(record) = record
                    {
                        writer.record(record);
                    }
                    if !state.take(plan, element, out, budget, times)? {
                        return Ok(());
                    }
                }
                Done::Dropped { task, split_id, record, skipped, .. } => {
                    let state = match split.as_mut() {
                        Some(state) => state,
                        None => split.insert(SplitState::new(plan, task, split_id, unstacked, &mut writer)),
                    };
                    if let Some(error) = skipped {
                        tracing::warn!(
                            epoch = task.epoch,
                            split = split_id,
                            "skipped an element (spec.errors.policy: skip): {error}"
                        );
                        if state.writing && record.is_none() {
                            // The entry would lack the element, and the elements after it would
                            // sit at the wrong indices: it is not written (the split is still
                            // delivered).
                            state.writing = false;
                            state.unwritten = Some(format!(
                                "an element was skipped before the cache cut, so split {split_id}'s entry \
                                 was not written: {error}"
                            ));
                        }
                        state.skipped.add(error);
                    }
                    if state.writing
                        && let Some(record) = record
                    {
                        writer.record(record);
                    }
                }
                Done::SplitEnd { task, split_id, read, .. } => {
                    let mut state = match split.take() {
                        Some(state) => state,
                        None => SplitState::new(plan, task, split_id, unstacked, &mut writer),
                    };
                    let mut cache =
                        if state.writing { writer.end(read) } else { CacheOutcome::from_read(read) };
                    if let Some(why) = state.unwritten.take() {
                        cache.problem = Some(why);
                    }
                    if !state.finish(plan, out, budget, times, cache)? {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}
