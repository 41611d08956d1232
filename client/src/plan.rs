//! A consumer's epoch plan: its slots and the split ranges that make each one.

use std::collections::{BTreeMap, HashMap};

use granary_proto::v1::EpochPlan;

use crate::error::ClientError;
use crate::position::SourcePosition;

/// Elements `[lo, hi)` of split `split`'s output: one part of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanPart {
    /// The split.
    pub(crate) split: u64,
    /// First position in the split's output.
    pub(crate) lo: u64,
    /// End of the range.
    pub(crate) hi: u64,
}

/// Which slots a consumer receives in one epoch, and their parts in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The epoch.
    pub(crate) epoch: u32,
    /// Parts of each slot, in the order they are joined.
    pub(crate) slots: BTreeMap<u64, Vec<PlanPart>>,
    /// Slots with a part in each split.
    pub(crate) by_split: HashMap<u64, Vec<u64>>,
    /// More slots follow: the pipeline's counts are learnt as its splits are computed.
    pub(crate) partial: bool,
    /// The mixed sources, in order, with their listed splits (empty for one source).
    pub(crate) sources: Vec<(String, u64)>,
}

impl Plan {
    /// A plan from its slots.
    pub(crate) fn new(epoch: u32, slots: BTreeMap<u64, Vec<PlanPart>>) -> Plan {
        let mut by_split: HashMap<u64, Vec<u64>> = HashMap::new();
        for (&slot, parts) in &slots {
            for part in parts {
                let entry = by_split.entry(part.split).or_default();
                if entry.last() != Some(&slot) {
                    entry.push(slot);
                }
            }
        }
        Plan { epoch, slots, by_split, partial: false, sources: Vec::new() }
    }

    /// Adds the slots of `more`, the same epoch's plan from slot [`Plan::len`] on; returns the
    /// first new slot.
    pub(crate) fn extend(&mut self, more: Plan) -> Result<u64, ClientError> {
        let epoch = self.epoch;
        let first = self.len();
        if more.epoch != epoch {
            let reason = format!("the dispatcher extended the plan with epoch {}'s", more.epoch);
            return Err(ClientError::BadPlan { epoch, reason });
        }
        if let Some(&slot) = more.slots.keys().find(|&&slot| slot < first) {
            let reason = format!("the dispatcher listed slot {slot} again when extending the plan");
            return Err(ClientError::BadPlan { epoch, reason });
        }
        for (slot, parts) in more.slots {
            for part in &parts {
                let entry = self.by_split.entry(part.split).or_default();
                if entry.last() != Some(&slot) {
                    entry.push(slot);
                }
            }
            self.slots.insert(slot, parts);
        }
        self.partial = more.partial;
        Ok(first)
    }

    /// The plan the dispatcher sent for `epoch`, checked.
    pub(crate) fn from_proto(epoch: u32, plan: EpochPlan) -> Result<Plan, ClientError> {
        let bad = |reason: String| ClientError::BadPlan { epoch, reason };
        let plan_partial = plan.partial;
        let sources: Vec<(String, u64)> = plan.sources.iter().map(|s| (s.name.clone(), s.splits)).collect();
        if plan.epoch != epoch {
            return Err(bad(format!("the dispatcher sent the plan of epoch {}", plan.epoch)));
        }
        let mut slots = BTreeMap::new();
        for slot in plan.slots {
            let mut parts: Vec<PlanPart> = Vec::with_capacity(slot.parts.len());
            for part in slot.parts {
                if part.hi < part.lo {
                    return Err(bad(format!(
                        "slot {} has the reversed range {}..{}",
                        slot.slot, part.lo, part.hi
                    )));
                }
                if parts.iter().any(|known| known.split == part.split && known.lo == part.lo) {
                    return Err(bad(format!(
                        "slot {} lists split {} at {} twice",
                        slot.slot, part.split, part.lo
                    )));
                }
                parts.push(PlanPart { split: part.split, lo: part.lo, hi: part.hi });
            }
            if slots.insert(slot.slot, parts).is_some() {
                return Err(bad(format!("slot {} is listed twice", slot.slot)));
            }
        }
        let mut plan = Plan::new(epoch, slots);
        plan.partial = plan_partial;
        plan.sources = sources;
        Ok(plan)
    }

    /// Elements of each mixed source in the slots `delivered` holds, by source name (empty for
    /// one source): where each source's stream stands for this consumer.
    pub(crate) fn source_positions(&self, delivered: impl Fn(u64) -> bool) -> Vec<SourcePosition> {
        let listed: u64 = self.sources.iter().map(|(_, n)| n).sum();
        if listed == 0 {
            return Vec::new();
        }
        let mut out: Vec<SourcePosition> =
            self.sources.iter().map(|(name, _)| SourcePosition { name: name.clone(), elements: 0 }).collect();
        for (_, parts) in self.slots.iter().filter(|(slot, _)| delivered(**slot)) {
            for part in parts {
                let mut id = part.split % listed;
                let source = self.sources.iter().position(|&(_, n)| {
                    let here = id < n;
                    id = id.saturating_sub(n);
                    here
                });
                if let Some(i) = source {
                    out[i].elements += part.hi - part.lo;
                }
            }
        }
        out
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> u64 {
        self.slots.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use granary_proto::v1::{Slot, SlotPart};

    use super::*;

    fn slot(slot: u64, parts: &[(u64, u64, u64)]) -> Slot {
        Slot { slot, parts: parts.iter().map(|&(split, lo, hi)| SlotPart { split, lo, hi }).collect() }
    }

    #[test]
    fn indexes_slots_by_split() {
        let plan = EpochPlan {
            epoch: 2,
            slots: vec![slot(0, &[(5, 0, 4)]), slot(1, &[(5, 4, 6), (9, 0, 2)]), slot(2, &[(9, 2, 6)])],
            plan_fingerprint: 1,
            partial: false,
            sources: vec![],
        };
        let plan = Plan::from_proto(2, plan).unwrap();
        assert_eq!(plan.len(), 3);
        assert_eq!(plan.by_split[&5], vec![0, 1]);
        assert_eq!(plan.by_split[&9], vec![1, 2]);
    }

    #[test]
    fn rejects_inconsistent_plans() {
        let wrong_epoch =
            EpochPlan { epoch: 1, slots: vec![], plan_fingerprint: 0, partial: false, sources: vec![] };
        assert!(Plan::from_proto(2, wrong_epoch).is_err());
        let twice = EpochPlan {
            epoch: 2,
            slots: vec![slot(0, &[]), slot(0, &[])],
            plan_fingerprint: 0,
            partial: false,
            sources: vec![],
        };
        assert!(Plan::from_proto(2, twice).is_err());
        let reversed = EpochPlan {
            epoch: 2,
            slots: vec![slot(0, &[(1, 4, 2)])],
            plan_fingerprint: 0,
            partial: false,
            sources: vec![],
        };
        assert!(Plan::from_proto(2, reversed).is_err());
    }
}
