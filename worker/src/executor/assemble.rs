//! The assembler: restores task order, shuffles within each split, stacks batches.

use super::{Done, ExecError, Output, Plan, Task};
use crate::batch::{BatchBuilder, BatchOrigin};
use crate::budget::Budget;
use crate::element::Element;
use crate::seed::{SeededRng, Stream};
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Per-split state: the shuffle buffer and the batch under construction.
struct SplitState {
    task: Task,
    split_id: u64,
    rng: Option<SeededRng>,
    buffer: Vec<Element>,
    builder: BatchBuilder,
    sequence: u64,
    elements: u64,
}

type Out<'a> = &'a Sender<Result<Output, ExecError>>;

impl SplitState {
    fn new(plan: &Plan, task: Task, split_id: u64) -> SplitState {
        let rng = (plan.shuffle_buffer > 0)
            .then(|| SeededRng::new(plan.seed, Stream::Shuffle, &[u64::from(task.epoch), split_id]));
        SplitState {
            task,
            split_id,
            rng,
            buffer: Vec::with_capacity(plan.shuffle_buffer.min(1 << 16)),
            builder: BatchBuilder::new(plan.batch_size),
            sequence: 0,
            elements: 0,
        }
    }

    /// Takes one element in; false when the consumer is gone.
    fn push(
        &mut self,
        plan: &Plan,
        element: Element,
        out: Out<'_>,
        budget: &Arc<Budget>,
    ) -> Result<bool, ExecError> {
        self.elements += 1;
        let Some(rng) = self.rng.as_mut() else {
            return self.add(element, out, budget);
        };
        self.buffer.push(element);
        if self.buffer.len() > plan.shuffle_buffer {
            let i = rng.below(self.buffer.len() as u64) as usize;
            let chosen = self.buffer.swap_remove(i);
            return self.add(chosen, out, budget);
        }
        Ok(true)
    }

    fn add(&mut self, element: Element, out: Out<'_>, budget: &Arc<Budget>) -> Result<bool, ExecError> {
        self.builder.push(element)?;
        if self.builder.is_full() {
            return Ok(self.emit(false, out, budget));
        }
        Ok(true)
    }

    fn emit(&mut self, tail: bool, out: Out<'_>, budget: &Arc<Budget>) -> bool {
        let origin = BatchOrigin { epoch: self.task.epoch, split: self.split_id, sequence: self.sequence };
        self.sequence += 1;
        let mut batch = self.builder.finish(self.task.epoch, Some(origin));
        batch.permit = Some(budget.force(batch.nbytes()));
        out.send(Ok(Output::Batch { batch, tail })).is_ok()
    }

    /// Drains the shuffle buffer and emits the tail batch and the split's completion.
    fn finish(mut self, out: Out<'_>, budget: &Arc<Budget>) -> Result<bool, ExecError> {
        if let Some(mut rng) = self.rng.take() {
            while !self.buffer.is_empty() {
                let i = rng.below(self.buffer.len() as u64) as usize;
                let chosen = self.buffer.swap_remove(i);
                if !self.add(chosen, out, budget)? {
                    return Ok(false);
                }
            }
        }
        if !self.builder.is_empty() && !self.emit(true, out, budget) {
            return Ok(false);
        }
        Ok(out.send(Ok(Output::SplitDone { task: self.task, elements: self.elements })).is_ok())
    }
}

pub(super) fn run(plan: &Plan, done: &Receiver<Done>, out: Out<'_>, budget: &Arc<Budget>) {
    if let Err(e) = assemble(plan, done, out, budget) {
        let _ = out.send(Err(e));
    }
}

fn assemble(plan: &Plan, done: &Receiver<Done>, out: Out<'_>, budget: &Arc<Budget>) -> Result<(), ExecError> {
    let mut pending: BTreeMap<u64, Done> = BTreeMap::new();
    let mut next = 0u64;
    let mut split: Option<SplitState> = None;
    for item in done.iter() {
        pending.insert(item.seq(), item);
        while let Some(item) = pending.remove(&next) {
            next += 1;
            match item {
                Done::Failed { error, .. } => return Err(error),
                Done::Element { task, split_id, element, permit, .. } => {
                    // The element leaves the in-flight budget: the shuffle buffer and the batch
                    // under construction are sized by the spec, not by prefetching.
                    drop(permit);
                    let state = split.get_or_insert_with(|| SplitState::new(plan, task, split_id));
                    if !state.push(plan, element, out, budget)? {
                        return Ok(());
                    }
                }
                Done::SplitEnd { task, split_id, .. } => {
                    let state = split.take().unwrap_or_else(|| SplitState::new(plan, task, split_id));
                    if !state.finish(out, budget)? {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}
