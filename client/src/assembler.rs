//! The assembler turns batch parts, arriving from any worker in any order and possibly more than
//! once, into the complete batches of the current epoch, each exactly once.
//!
//! It is pure: no I/O, no clock. The client feeds it parts and split ends, asks it which splits
//! to replay, and takes complete slots from it (their parts, which the client's finisher joins
//! into batches off the trainer's thread), telling it when each was delivered.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

#[cfg(test)]
use crate::batch::Batch;
use crate::batch::{Arrived, check_part};
use crate::error::ClientError;
use crate::plan::Plan;
use crate::ranges::SlotRanges;

#[cfg(test)]
mod tests;

/// What became of a part given to [`Assembler::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepted {
    /// Kept; its slot still lacks parts.
    Kept,
    /// Kept, and its slot is complete: a batch is ready.
    Completed,
    /// Kept for a later epoch.
    Held,
    /// Already held, already delivered, or of an earlier epoch: dropped.
    Duplicate,
    /// Not in the consumer's plan (or past the last epoch): dropped.
    Unplanned,
}

impl Accepted {
    /// Whether the part was new to the client.
    pub(crate) fn is_new(self) -> bool {
        matches!(self, Accepted::Kept | Accepted::Completed | Accepted::Held)
    }
}

/// What starting an epoch found among the parts and split ends held for it.
#[derive(Debug, Default)]
pub(crate) struct EpochStart {
    /// Splits that ended while still lacking parts: replay them.
    pub(crate) replay: Vec<u64>,
    /// Held parts that could not be assembled.
    pub(crate) errors: Vec<ClientError>,
}

/// A complete slot of the current epoch: every part of it, in plan order.
#[derive(Debug)]
pub(crate) struct Complete {
    pub(crate) epoch: u32,
    pub(crate) slot: u64,
    pub(crate) parts: Vec<Arrived>,
}

/// Assembles batches of the current epoch; holds parts of later epochs until they are current.
#[derive(Debug)]
pub(crate) struct Assembler {
    epochs: u32,
    current: Option<Current>,
    held: BTreeMap<u32, Held>,
    duplicates: u64,
}

/// The epoch being delivered.
#[derive(Debug)]
struct Current {
    plan: Plan,
    /// Parts received for incomplete slots, in plan order. Slots without an entry have none.
    pending: HashMap<u64, Vec<Option<Arrived>>>,
    /// Complete slots in completion order, not yet taken.
    ready: VecDeque<Complete>,
    /// Complete slots not yet delivered: those in `ready` and those taken, until settled.
    ready_slots: HashSet<u64>,
    delivered: SlotRanges,
    /// Slots delivered before a resume, for slots a partial plan adds later.
    resumed: SlotRanges,
    /// Parts of slots a partial plan does not list yet, and their identities.
    beyond: Vec<Arrived>,
    beyond_seen: HashSet<(u64, u64)>,
}

/// Parts and split ends that arrived for an epoch before it became current.
#[derive(Debug, Default)]
struct Held {
    parts: Vec<Arrived>,
    seen: HashSet<(u64, u64)>,
    split_ends: Vec<u64>,
}

impl Assembler {
    /// An assembler for a job of `epochs` epochs, with no current epoch yet.
    pub(crate) fn new(epochs: u32) -> Assembler {
        Assembler { epochs, current: None, held: BTreeMap::new(), duplicates: 0 }
    }

    /// Makes `plan`'s epoch current, with the slots in `delivered` already delivered (resume).
    /// Parts and split ends held for it are processed now; earlier held epochs are dropped.
    pub(crate) fn start_epoch(&mut self, plan: Plan, delivered: &SlotRanges) -> EpochStart {
        let epoch = plan.epoch;
        let mut current = Current {
            pending: HashMap::new(),
            ready: VecDeque::new(),
            ready_slots: HashSet::new(),
            delivered: SlotRanges::default(),
            resumed: delivered.clone(),
            beyond: Vec::new(),
            beyond_seen: HashSet::new(),
            plan,
        };
        current.admit(0);
        self.current = Some(current);
        let held = self.held.remove(&epoch).unwrap_or_default();
        self.held.retain(|&later, _| later > epoch);

        let mut start = EpochStart::default();
        for part in held.parts {
            if let Err(error) = self.accept(part) {
                start.errors.push(error);
            }
        }
        let mut ended = held.split_ends;
        ended.sort_unstable();
        ended.dedup();
        start.replay = ended.into_iter().filter(|&split| self.split_end(epoch, split)).collect();
        start
    }

    /// Takes a part. It is kept if its slot is in the current plan, not yet delivered and the
    /// part not yet held; parts of later epochs are held; everything else is dropped.
    pub(crate) fn accept(&mut self, part: impl Into<Arrived>) -> Result<Accepted, ClientError> {
        let part = part.into();
        if part.epoch >= self.epochs {
            return Ok(Accepted::Unplanned);
        }
        let outcome = match self.current.as_mut() {
            Some(current) if part.epoch == current.plan.epoch => current.accept(part)?,
            Some(current) if part.epoch < current.plan.epoch => Accepted::Duplicate,
            _ => {
                let held = self.held.entry(part.epoch).or_default();
                if held.seen.insert((part.split, part.lo)) {
                    held.parts.push(part);
                    Accepted::Held
                } else {
                    Accepted::Duplicate
                }
            }
        };
        if outcome == Accepted::Duplicate {
            self.duplicates += 1;
        }
        Ok(outcome)
    }

    /// Adds the slots of `more` to the current epoch's partial plan (the same epoch's plan from
    /// the first slot not yet listed). Parts held for those slots are taken now.
    pub(crate) fn extend_plan(&mut self, more: Plan) -> Result<Vec<ClientError>, ClientError> {
        let Some(current) = self.current.as_mut() else { return Ok(Vec::new()) };
        let first = current.plan.extend(more)?;
        current.admit(first);
        current.beyond_seen.clear();
        let mut errors = Vec::new();
        for part in std::mem::take(&mut current.beyond) {
            if let Err(error) = self.accept(part) {
                errors.push(error);
            }
        }
        Ok(errors)
    }

    /// Elements of each mixed source in the slots of `epoch` that `delivered` holds (empty for
    /// one source, or when `epoch` is not the current epoch).
    pub(crate) fn source_positions(
        &self,
        epoch: u32,
        delivered: impl Fn(u64) -> bool,
    ) -> Vec<crate::position::SourcePosition> {
        match &self.current {
            Some(current) if current.plan.epoch == epoch => current.plan.source_positions(delivered),
            _ => Vec::new(),
        }
    }

    /// Whether the current epoch's plan lists only the slots known so far.
    pub(crate) fn plan_partial(&self) -> bool {
        self.current.as_ref().is_some_and(|current| current.plan.partial)
    }

    /// Slots the current epoch's plan lists.
    pub(crate) fn planned_slots(&self) -> u64 {
        self.current.as_ref().map_or(0, |current| current.plan.len())
    }

    /// Every part of `split` in `epoch` was sent. True when the current epoch still lacks some
    /// of that split's parts: the split should be replayed. Split ends of later epochs are held.
    pub(crate) fn split_end(&mut self, epoch: u32, split: u64) -> bool {
        match self.current.as_ref() {
            Some(current) if epoch == current.plan.epoch => current.lacks_split(split),
            Some(current) if epoch < current.plan.epoch => false,
            _ => {
                if epoch < self.epochs {
                    self.held.entry(epoch).or_default().split_ends.push(split);
                }
                false
            }
        }
    }

    /// Splits holding a missing part of an undelivered slot of the current epoch, sorted.
    pub(crate) fn missing_splits(&self) -> Vec<u64> {
        let Some(current) = self.current.as_ref() else { return Vec::new() };
        let mut splits = BTreeSet::new();
        for (&slot, parts) in &current.plan.slots {
            if !current.is_open(slot) {
                continue;
            }
            let received = current.pending.get(&slot);
            for (index, part) in parts.iter().enumerate() {
                if received.is_none_or(|received| received[index].is_none()) {
                    splits.insert(part.split);
                }
            }
        }
        splits.into_iter().collect()
    }

    /// The next complete slot of the current epoch, in completion order. It is neither open nor
    /// delivered until [`Assembler::settle`] says what became of it.
    pub(crate) fn take_complete(&mut self) -> Option<Complete> {
        self.current.as_mut()?.ready.pop_front()
    }

    /// A slot taken with [`Assembler::take_complete`] was delivered (`delivered`), or its
    /// parts could not be joined: then it is open again, and its splits are replayed.
    pub(crate) fn settle(&mut self, epoch: u32, slot: u64, delivered: bool) {
        let Some(current) = self.current.as_mut().filter(|current| current.plan.epoch == epoch) else {
            return;
        };
        if current.ready_slots.remove(&slot) && delivered {
            current.delivered.insert(slot);
        }
    }

    /// The next complete slot joined into its batch and delivered at once.
    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<Batch> {
        let Complete { epoch, slot, parts } = self.take_complete()?;
        let batch = Batch::from_arrived(epoch, slot, parts);
        self.settle(epoch, slot, batch.is_ok());
        batch.ok()
    }

    /// Whether every slot of the current epoch was delivered (and the plan lists them all).
    pub(crate) fn epoch_finished(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|current| !current.plan.partial && current.delivered.count() == current.plan.len())
    }

    /// The current epoch, once one was started.
    pub(crate) fn epoch(&self) -> Option<u32> {
        self.current.as_ref().map(|current| current.plan.epoch)
    }

    /// Delivered slots of the current epoch.
    #[cfg(test)]
    pub(crate) fn delivered(&self) -> SlotRanges {
        self.current.as_ref().map(|current| current.delivered.clone()).unwrap_or_default()
    }

    /// Complete slots not yet taken.
    pub(crate) fn ready(&self) -> usize {
        self.current.as_ref().map_or(0, |current| current.ready.len())
    }

    /// Parts dropped as duplicates so far.
    pub(crate) fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

impl Current {
    /// Takes in the plan's slots from `first` on: those delivered before a resume are
    /// delivered, and a slot without parts (an empty batch of the last round) is complete.
    fn admit(&mut self, first: u64) {
        let epoch = self.plan.epoch;
        for &(start, end) in self.resumed.ranges() {
            for &slot in self.plan.slots.range(start.max(first)..end.max(first)).map(|(slot, _)| slot) {
                self.delivered.insert(slot);
            }
        }
        for (&slot, parts) in self.plan.slots.range(first..) {
            if parts.is_empty() && !self.delivered.contains(slot) {
                self.ready.push_back(Complete { epoch, slot, parts: Vec::new() });
                self.ready_slots.insert(slot);
            }
        }
    }

    /// A slot that is neither delivered nor complete.
    fn is_open(&self, slot: u64) -> bool {
        !self.delivered.contains(slot) && !self.ready_slots.contains(&slot)
    }

    fn accept(&mut self, part: Arrived) -> Result<Accepted, ClientError> {
        let (epoch, slot) = (part.epoch, part.slot);
        if self.plan.partial && slot >= self.plan.len() {
            // A slot the plan does not list yet: its parts wait for the plan to grow.
            if !self.beyond_seen.insert((part.split, part.lo)) {
                return Ok(Accepted::Duplicate);
            }
            self.beyond.push(part);
            return Ok(Accepted::Held);
        }
        let Some(plan_parts) = self.plan.slots.get(&slot) else { return Ok(Accepted::Unplanned) };
        let Some(index) = plan_parts.iter().position(|planned| {
            planned.split == part.split && planned.lo == part.lo && planned.hi == part.hi
        }) else {
            return Ok(Accepted::Unplanned);
        };
        if !self.is_open(slot) {
            return Ok(Accepted::Duplicate);
        }
        if self.pending.get(&slot).is_some_and(|received| received[index].is_some()) {
            return Ok(Accepted::Duplicate);
        }
        check_part(&part).map_err(|reason| ClientError::Assembly { epoch, slot, reason })?;
        let count = plan_parts.len();
        let received = self.pending.entry(slot).or_insert_with(|| (0..count).map(|_| None).collect());
        received[index] = Some(part);
        if received.iter().any(Option::is_none) {
            return Ok(Accepted::Kept);
        }
        let parts = self.pending.remove(&slot).unwrap_or_default().into_iter().flatten().collect();
        self.ready.push_back(Complete { epoch, slot, parts });
        self.ready_slots.insert(slot);
        Ok(Accepted::Completed)
    }

    /// Whether an open slot lacks a part of `split`.
    fn lacks_split(&self, split: u64) -> bool {
        let Some(slots) = self.plan.by_split.get(&split) else { return false };
        slots.iter().filter(|&&slot| self.is_open(slot)).any(|slot| {
            let received = self.pending.get(slot);
            self.plan.slots.get(slot).into_iter().flatten().enumerate().any(|(index, part)| {
                part.split == split && received.is_none_or(|received| received[index].is_none())
            })
        })
    }
}
