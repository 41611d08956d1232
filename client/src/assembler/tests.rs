use std::collections::BTreeMap;

use bytes::Bytes;
use granary_proto::v1::{BatchPart, Tensor};

use super::*;
use crate::plan::PlanPart;

/// A slot and its parts, `(split, lo, hi)`.
type SlotSpec<'a> = (u64, &'a [(u64, u64, u64)]);

/// A plan from slots and their parts.
fn plan(epoch: u32, slots: &[SlotSpec<'_>]) -> Plan {
    let slots: BTreeMap<u64, Vec<PlanPart>> = slots
        .iter()
        .map(|&(slot, parts)| {
            (slot, parts.iter().map(|&(split, lo, hi)| PlanPart { split, lo, hi }).collect())
        })
        .collect();
    Plan::new(epoch, slots)
}

/// A part whose rows hold their position in the split.
fn part(epoch: u32, slot: u64, split: u64, lo: u64, hi: u64) -> BatchPart {
    BatchPart {
        epoch,
        split,
        lo,
        hi,
        slot,
        keys: (lo..hi).map(|i| format!("{split}/{i}")).collect(),
        tensors: vec![Tensor {
            name: "x".into(),
            dtype: "uint8".into(),
            shape: vec![hi - lo],
            data: Bytes::from((lo..hi).map(|i| i as u8).collect::<Vec<u8>>()),
            normalize: None,
            padding: None,
            images: None,
        }],
    }
}

/// Epoch 0: slot 0 = split 1 [0,4); slot 1 = split 1 [4,6) + split 2 [0,2); slot 2 = split 2 [2,6).
fn three_slots(epoch: u32) -> Plan {
    plan(epoch, &[(0, &[(1, 0, 4)]), (1, &[(1, 4, 6), (2, 0, 2)]), (2, &[(2, 2, 6)])])
}

fn started(epochs: u32) -> Assembler {
    let mut assembler = Assembler::new(epochs);
    let start = assembler.start_epoch(three_slots(0), &SlotRanges::default());
    assert!(start.replay.is_empty() && start.errors.is_empty());
    assembler
}

#[test]
fn drops_duplicate_parts_and_delivered_slots() {
    let mut assembler = started(1);
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Completed);
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.pop().unwrap().slot, 0);
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Kept);
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.duplicates(), 3);
    assert!(assembler.pop().is_none());
    // Not in the plan: another slot's range, an unknown slot, a past-the-end epoch.
    assert_eq!(assembler.accept(part(0, 2, 1, 4, 6)).unwrap(), Accepted::Unplanned);
    assert_eq!(assembler.accept(part(0, 7, 1, 0, 4)).unwrap(), Accepted::Unplanned);
    assert_eq!(assembler.accept(part(1, 0, 1, 0, 4)).unwrap(), Accepted::Unplanned);
}

#[test]
fn concatenates_parts_in_plan_order() {
    let mut assembler = started(1);
    assert_eq!(assembler.accept(part(0, 1, 2, 0, 2)).unwrap(), Accepted::Kept);
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Completed);
    let batch = assembler.pop().unwrap();
    assert_eq!((batch.epoch, batch.slot, batch.len()), (0, 1, 4));
    assert_eq!(batch.keys, vec!["1/4", "1/5", "2/0", "2/1"]);
    assert_eq!(&batch.tensor("x").unwrap().data[..], &[4, 5, 0, 1]);
    assert_eq!(batch.tensor("x").unwrap().shape, vec![4]);
}

#[test]
fn delivers_slots_in_completion_order() {
    let mut assembler = started(1);
    assembler.accept(part(0, 2, 2, 2, 6)).unwrap();
    assembler.accept(part(0, 0, 1, 0, 4)).unwrap();
    assert_eq!(assembler.ready(), 2);
    assert_eq!(assembler.pop().unwrap().slot, 2);
    assert_eq!(assembler.pop().unwrap().slot, 0);
    assert!(!assembler.epoch_finished());
    assembler.accept(part(0, 1, 1, 4, 6)).unwrap();
    assembler.accept(part(0, 1, 2, 0, 2)).unwrap();
    assert_eq!(assembler.pop().unwrap().slot, 1);
    assert!(assembler.epoch_finished());
    assert_eq!(assembler.delivered().ranges(), &[(0, 3)]);
}

#[test]
fn holds_next_epoch_parts_until_it_is_current() {
    let mut assembler = started(3);
    assert_eq!(assembler.accept(part(1, 0, 1, 0, 4)).unwrap(), Accepted::Held);
    assert_eq!(assembler.accept(part(1, 0, 1, 0, 4)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.accept(part(1, 1, 1, 4, 6)).unwrap(), Accepted::Held);
    assert!(!assembler.split_end(1, 1));
    assert!(assembler.pop().is_none(), "a later epoch's batch is not delivered early");
    for (slot, split, lo, hi) in [(0, 1, 0, 4), (1, 1, 4, 6), (1, 2, 0, 2), (2, 2, 2, 6)] {
        assembler.accept(part(0, slot, split, lo, hi)).unwrap();
    }
    while assembler.pop().is_some() {}
    assert!(assembler.epoch_finished());

    let start = assembler.start_epoch(three_slots(1), &SlotRanges::default());
    assert!(start.errors.is_empty());
    assert!(start.replay.is_empty(), "split 1 ended with every part held");
    assert_eq!(assembler.epoch(), Some(1));
    assert_eq!(assembler.pop().unwrap().slot, 0);
    assert!(assembler.pop().is_none());
    // Earlier epochs are dropped as duplicates.
    assert_eq!(assembler.accept(part(0, 2, 2, 2, 6)).unwrap(), Accepted::Duplicate);
}

#[test]
fn held_split_end_with_missing_parts_asks_for_a_replay() {
    let mut assembler = started(2);
    assembler.accept(part(1, 0, 1, 0, 4)).unwrap();
    assert!(!assembler.split_end(1, 1));
    let start = assembler.start_epoch(three_slots(1), &SlotRanges::default());
    assert_eq!(start.replay, vec![1], "slot 1 lacks split 1 [4, 6)");
}

#[test]
fn split_end_detects_missing_parts() {
    let mut assembler = started(1);
    assembler.accept(part(0, 0, 1, 0, 4)).unwrap();
    assert!(assembler.split_end(0, 1), "split 1 [4, 6) of slot 1 never came");
    assembler.accept(part(0, 1, 1, 4, 6)).unwrap();
    assert!(!assembler.split_end(0, 1));
    assert!(assembler.split_end(0, 2));
    assert!(!assembler.split_end(0, 9), "a split outside the plan lacks nothing");
    assert!(!assembler.split_end(5, 1), "a past-the-end epoch is ignored");
}

#[test]
fn missing_splits_cover_open_slots_only() {
    let mut assembler = started(1);
    assert_eq!(assembler.missing_splits(), vec![1, 2]);
    assembler.accept(part(0, 0, 1, 0, 4)).unwrap();
    assembler.accept(part(0, 1, 1, 4, 6)).unwrap();
    assert_eq!(assembler.missing_splits(), vec![2]);
    assembler.accept(part(0, 1, 2, 0, 2)).unwrap();
    assert_eq!(assembler.missing_splits(), vec![2], "slot 2 still lacks split 2 [2, 6)");
    assembler.accept(part(0, 2, 2, 2, 6)).unwrap();
    assert!(assembler.missing_splits().is_empty(), "ready slots lack nothing");
}

#[test]
fn resumes_with_delivered_slots() {
    let mut assembler = Assembler::new(1);
    let delivered = SlotRanges::from_ranges(&[(0, 1), (2, 3)]).unwrap();
    assembler.start_epoch(three_slots(0), &delivered);
    assert_eq!(assembler.missing_splits(), vec![1, 2]);
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.accept(part(0, 2, 2, 2, 6)).unwrap(), Accepted::Duplicate);
    assembler.accept(part(0, 1, 1, 4, 6)).unwrap();
    assembler.accept(part(0, 1, 2, 0, 2)).unwrap();
    assert_eq!(assembler.pop().unwrap().slot, 1);
    assert!(assembler.epoch_finished());
}

#[test]
fn empty_slots_are_ready_at_once() {
    let mut assembler = Assembler::new(1);
    assembler.start_epoch(plan(0, &[(0, &[(1, 0, 2)]), (1, &[])]), &SlotRanges::default());
    let batch = assembler.pop().unwrap();
    assert_eq!(batch.slot, 1);
    assert!(batch.is_empty());
    assert_eq!(assembler.missing_splits(), vec![1]);
}

#[test]
fn bad_parts_are_errors_and_leave_the_slot_open() {
    let mut assembler = started(1);
    let mut bad = part(0, 0, 1, 0, 4);
    bad.tensors[0].shape = vec![3];
    assert!(matches!(assembler.accept(bad), Err(ClientError::Assembly { epoch: 0, slot: 0, .. })));
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Completed);

    let mut other = part(0, 1, 2, 0, 2);
    other.tensors[0].dtype = "int32".into();
    other.tensors[0].data = Bytes::from(vec![0u8; 8]);
    assembler.accept(part(0, 1, 1, 4, 6)).unwrap();
    // Parts that pass alone but do not join: the slot completes, and its join fails.
    assert_eq!(assembler.accept(other).unwrap(), Accepted::Completed);
    assert_eq!(assembler.pop().map(|batch| batch.slot), Some(0));
    let complete = assembler.take_complete().unwrap();
    assert_eq!(complete.slot, 1);
    assert!(Batch::from_arrived(0, 1, complete.parts).is_err());
    assert_eq!(assembler.missing_splits(), vec![2], "a slot being joined is not missing");
    assembler.settle(0, 1, false);
    assert_eq!(assembler.missing_splits(), vec![1, 2], "the failed slot is open again");
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Kept, "and takes parts again");
}

/// `plan`, marked partial: more slots follow.
fn partial(epoch: u32, slots: &[SlotSpec<'_>]) -> Plan {
    let mut plan = plan(epoch, slots);
    plan.partial = true;
    plan
}

#[test]
fn a_partial_plan_holds_parts_of_later_slots_until_it_grows() {
    let mut assembler = Assembler::new(1);
    // Resumed with slot 2 already delivered, which the partial plan does not list yet.
    let mut delivered = SlotRanges::default();
    delivered.insert(2);
    let start = assembler.start_epoch(partial(0, &[(0, &[(1, 0, 4)])]), &delivered);
    assert!(start.errors.is_empty());
    assert_eq!(assembler.accept(part(0, 0, 1, 0, 4)).unwrap(), Accepted::Completed);
    assert_eq!(assembler.pop().unwrap().slot, 0);
    // Every listed slot is delivered, but the epoch is not over: the plan is partial.
    assert!(!assembler.epoch_finished());
    // A part of slot 1, which the plan does not list yet, is held (once).
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Held);
    assert_eq!(assembler.accept(part(0, 1, 1, 4, 6)).unwrap(), Accepted::Duplicate);
    // The plan grows by slots 1 and 2 and is complete: the held part is taken, slot 2 counts
    // as delivered from the resume.
    let more = plan(0, &[(1, &[(1, 4, 6), (2, 0, 2)]), (2, &[(2, 2, 6)])]);
    assert!(assembler.extend_plan(more).unwrap().is_empty());
    assert!(!assembler.plan_partial());
    assert_eq!(assembler.planned_slots(), 3);
    assert_eq!(assembler.accept(part(0, 2, 2, 2, 6)).unwrap(), Accepted::Duplicate);
    assert_eq!(assembler.accept(part(0, 1, 2, 0, 2)).unwrap(), Accepted::Completed);
    let batch = assembler.pop().unwrap();
    assert_eq!((batch.slot, batch.keys.len()), (1, 4));
    assert!(assembler.epoch_finished());
}

#[test]
fn a_plan_extension_that_repeats_a_slot_is_refused() {
    let mut assembler = Assembler::new(1);
    assembler.start_epoch(partial(0, &[(0, &[(1, 0, 4)])]), &SlotRanges::default());
    let again = plan(0, &[(0, &[(1, 0, 4)])]);
    assert!(matches!(assembler.extend_plan(again), Err(ClientError::BadPlan { .. })));
}
