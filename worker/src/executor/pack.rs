//! `text.pack` in the executor: the assembler, which sees a split's elements in their
//! deterministic order, packs them into rows and runs the stages after the pack on each row.
//!
//! Compute threads run only the stages before the pack ([`Plan::element_stages`]). Rows depend
//! only on the split's documents and their order, and each row's stages draw from the row's own
//! seeded stream (`(seed, epoch, split, row)`), so a recomputed split yields the same rows; the
//! split's count is its rows that the later stages kept.

use super::{ExecError, ImageForm, Plan, StageTimes, Task, apply};
use crate::element::Element;
use crate::ops::Fate;
use crate::ops::text::pack::{PackedRow, Packer};
use crate::seed::{SeededRng, Stream};
use std::time::Instant;

/// One split's packing: its packer and the rows made so far.
pub(super) struct SplitPack {
    /// Index of the `text.pack` stage in `plan.stages`.
    stage: usize,
    packer: Packer,
    /// Rows filled by the last document, not yet made elements.
    full: Vec<PackedRow>,
    /// Rows of the split made so far.
    rows: u64,
}

impl SplitPack {
    /// The packing of one split, when the plan packs.
    pub(super) fn new(plan: &Plan) -> Option<SplitPack> {
        let stage = plan.element_stages();
        let op = plan.stages.get(stage)?.op.packing()?;
        Some(SplitPack { stage, packer: op.packer(), full: Vec::new(), rows: 0 })
    }

    /// Packs `element`'s document; appends to `rows` the rows it filled that the stages after
    /// the pack kept.
    pub(super) fn push(
        &mut self,
        plan: &Plan,
        task: Task,
        split_id: u64,
        element: &Element,
        times: &StageTimes,
        rows: &mut Vec<Element>,
    ) -> Result<(), ExecError> {
        let stage = &plan.stages[self.stage];
        let Some(op) = stage.op.packing() else { return Ok(()) };
        let start = Instant::now();
        op.push(&mut self.packer, element, &mut self.full).map_err(|e| ExecError::Op {
            path: stage.path.clone(),
            stage: stage.name.clone(),
            key: element.key.clone(),
            message: e.0,
        })?;
        times.add(self.stage, start.elapsed().as_nanos() as u64);
        self.rows_out(plan, task, split_id, times, rows)
    }

    /// Ends the split: appends its last row, when it has one that is kept.
    pub(super) fn finish(
        mut self,
        plan: &Plan,
        task: Task,
        split_id: u64,
        times: &StageTimes,
        rows: &mut Vec<Element>,
    ) -> Result<(), ExecError> {
        let last = self.packer.finish();
        self.full.extend(last);
        self.rows_out(plan, task, split_id, times, rows)
    }

    /// Makes elements of the filled rows and runs the stages after the pack on them.
    fn rows_out(
        &mut self,
        plan: &Plan,
        task: Task,
        split_id: u64,
        times: &StageTimes,
        rows: &mut Vec<Element>,
    ) -> Result<(), ExecError> {
        let Some(op) = plan.stages[self.stage].op.packing() else { return Ok(()) };
        for row in self.full.drain(..) {
            let index = self.rows;
            self.rows += 1;
            let mut element = op.row_element(split_id, index, row);
            let mut rng = SeededRng::new(plan.seed, Stream::Row, &[u64::from(task.epoch), split_id, index]);
            if apply(plan, self.stage + 1..plan.stages.len(), &mut element, &mut rng, times, ImageForm::Made)?
                == Fate::Keep
            {
                rows.push(element);
            }
        }
        Ok(())
    }
}
