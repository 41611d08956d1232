//! Property tests of the epoch plan.

use super::*;
use std::collections::BTreeMap;

fn settings(counts: Vec<u64>, batch: u64, k: u32, mode: Mode, drop: bool) -> PlanSettings {
    PlanSettings {
        counts,
        counts_known: true,
        batch,
        consumers: k,
        mode,
        drop_remainder: drop,
        shuffle: true,
        seed: 7,
        mixing: None,
    }
}

/// Every dealt position of every split, mapped to (consumer, slot), via both views.
fn check(s: &PlanSettings) {
    let plan = s.plan(3);
    let k = s.consumers.max(1);
    let mut from_parts: BTreeMap<(u64, u64), Vec<(u32, u64)>> = BTreeMap::new();
    for &split in plan.order() {
        let mut last = 0;
        for p in plan.parts_of_split(split, k).unwrap() {
            assert!(p.lo >= last && p.hi > p.lo && p.hi <= s.counts[s.listed_split(split) as usize]);
            last = p.hi;
            for pos in p.lo..p.hi {
                for &c in &p.consumers {
                    from_parts.entry((split, pos)).or_default().push((c, p.slot));
                }
            }
        }
    }
    let mut from_slots: BTreeMap<(u64, u64), Vec<(u32, u64)>> = BTreeMap::new();
    let mut sizes = Vec::new();
    for c in 0..k {
        let slots = plan.consumer_slots(c);
        assert_eq!(slots.len() as u64, plan.slots_per_consumer());
        for (slot, parts) in slots.iter().enumerate() {
            let mut size = 0;
            for p in parts {
                size += p.hi - p.lo;
                for pos in p.lo..p.hi {
                    from_slots.entry((p.split, pos)).or_default().push((c, slot as u64));
                }
            }
            assert!(size <= s.batch);
            sizes.push(size);
        }
    }
    assert_eq!(from_parts, from_slots);
    let dealt: usize = from_parts.values().map(Vec::len).sum();
    let total: u64 = if s.mixing.is_some() { plan.elements() } else { s.counts.iter().sum() };
    match (s.mode, s.drop_remainder) {
        (Mode::Distributed, false) => assert_eq!(dealt as u64, total),
        (Mode::Replicated, false) => assert_eq!(dealt as u64, total * u64::from(k)),
        (Mode::Distributed, true) => {
            assert!(sizes.iter().all(|&n| n == s.batch));
            assert!(total - (dealt as u64) < s.batch * u64::from(k));
        }
        (Mode::Replicated, true) => assert!(sizes.iter().all(|&n| n == s.batch)),
    }
    // Distributed: each position exactly once.
    if s.mode == Mode::Distributed {
        assert!(from_parts.values().all(|v| v.len() == 1));
    }
}

#[test]
fn every_element_once_and_equal_counts() {
    for counts in [vec![64, 64, 64, 10], vec![5, 3, 7], vec![128; 9], vec![1], vec![33, 0, 31, 64]] {
        for batch in [1, 8, 32, 64] {
            for k in [1, 2, 3, 5] {
                for drop in [false, true] {
                    check(&settings(counts.clone(), batch, k, Mode::Distributed, drop));
                    check(&settings(counts.clone(), batch, k, Mode::Replicated, drop));
                }
            }
        }
    }
}

#[test]
fn last_round_is_split_evenly() {
    // 100 elements, batch 32: batches 32,32,32,4. Two consumers get two each (the fourth
    // is partial). Three consumers: the incomplete last round (4 elements) becomes 1, 1, 2.
    let s = settings(vec![100], 32, 2, Mode::Distributed, false);
    let plan = s.plan(0);
    let size = |c: u32| -> Vec<u64> {
        plan.consumer_slots(c).iter().map(|p| p.iter().map(|x| x.hi - x.lo).sum()).collect()
    };
    assert_eq!(size(0), vec![32, 32]);
    assert_eq!(size(1), vec![32, 4]);
    let s = settings(vec![100], 32, 3, Mode::Distributed, false);
    let plan = s.plan(0);
    let size = |c: u32| -> Vec<u64> {
        plan.consumer_slots(c).iter().map(|p| p.iter().map(|x| x.hi - x.lo).sum()).collect()
    };
    assert_eq!([size(0), size(1), size(2)], [vec![32, 1], vec![32, 1], vec![32, 2]]);
}

#[test]
fn orders_are_seeded_permutations() {
    let s = settings(vec![1; 50], 4, 1, Mode::Distributed, false);
    assert_eq!(s.order(1), s.order(1));
    assert_ne!(s.order(1), s.order(2));
    let mut o = s.order(1);
    o.sort_unstable();
    assert_eq!(o, (0..50).collect::<Vec<_>>());
    let plain = PlanSettings { shuffle: false, ..s.clone() };
    assert_eq!(plain.order(4), (0..50).collect::<Vec<_>>());
    assert_ne!(s.fingerprint(), PlanSettings { consumers: 2, ..s }.fingerprint());
}

/// A plan that learns its counts in any order says nothing it later takes back: every
/// split's parts, once given, and every slot, once listed, are those of the complete plan.
fn check_learning(s: &PlanSettings, learn_order: &[u64]) {
    let complete = s.plan(2);
    let k = s.consumers.max(1);
    let mut learning = PlanSettings { counts_known: false, ..s.clone() }.plan(2);
    assert!(!learning.is_complete() || s.counts.is_empty());
    let mut given: BTreeMap<u64, Vec<Part>> = BTreeMap::new();
    for &split in learn_order {
        assert_eq!(learning.learn(split, s.counts[split as usize]), Ok(true));
        assert_eq!(learning.learn(split, s.counts[split as usize]), Ok(false));
        for known in 0..s.counts.len() as u64 {
            if let Some(parts) = learning.parts_of_split(known, k) {
                assert_eq!(Some(&parts), complete.parts_of_split(known, k).as_ref());
                given.insert(known, parts);
            }
        }
        for c in 0..k {
            let slots = learning.consumer_slots(c);
            let all = complete.consumer_slots(c);
            assert!(slots.len() <= all.len());
            assert_eq!(slots[..], all[..slots.len()]);
        }
    }
    assert!(learning.is_complete());
    assert_eq!(given.len(), s.counts.len());
    assert_eq!(learning.slots_per_consumer(), complete.slots_per_consumer());
    let bad = learn_order.first().map(|&split| learning.learn(split, s.counts[split as usize] + 1));
    if let Some(result) = bad {
        assert!(result.is_err());
    }
}

#[test]
fn learnt_counts_never_change_what_was_planned() {
    for counts in [vec![64, 64, 64, 10], vec![5, 0, 7, 3, 3], vec![128; 9], vec![1], vec![33, 0, 31, 64]] {
        let n = counts.len() as u64;
        let forward: Vec<u64> = (0..n).collect();
        let backward: Vec<u64> = (0..n).rev().collect();
        let shuffled = settings(counts.clone(), 1, 1, Mode::Distributed, false).order(9);
        for batch in [1, 8, 32] {
            for k in [1, 2, 3] {
                for drop in [false, true] {
                    for mode in [Mode::Distributed, Mode::Replicated] {
                        let s = settings(counts.clone(), batch, k, mode, drop);
                        for order in [&forward, &backward, &shuffled, &s.order(2)] {
                            check_learning(&s, order);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_partial_plan_deals_whole_rounds_only() {
    // Batch 4, two consumers: a round is 8 elements. After the first split (in order) of
    // 10 elements is counted, one round (8) is certain: each consumer knows one slot, and the
    // split's parts are withheld because its last 2 elements fall in an unknown round.
    let s = PlanSettings { counts_known: false, ..settings(vec![10, 10], 4, 2, Mode::Distributed, false) };
    let mut plan = s.plan(0);
    let first = plan.order()[0];
    let second = plan.order()[1];
    plan.learn(first, 10).unwrap();
    assert_eq!(plan.slots_per_consumer(), 1);
    assert_eq!(plan.parts_of_split(first, 2), None);
    assert_eq!(plan.parts_of_split(second, 2), None);
    plan.learn(second, 3).unwrap();
    assert!(plan.is_complete());
    // 13 elements, batch 4: batches 4,4,4,1; two rounds, each consumer gets 2 slots.
    assert_eq!(plan.slots_per_consumer(), 2);
    assert!(plan.parts_of_split(first, 2).is_some());
}

fn mixed(counts: Vec<u64>, splits: Vec<u64>, weights: &[f64], block: u64, stop: MixStop) -> PlanSettings {
    PlanSettings {
        mixing: Some(MixPlan { splits, weights: MixPlan::weights(weights), block, stop }),
        ..settings(counts, 8, 1, Mode::Distributed, false)
    }
}

/// Elements of each input in the first `upto` positions of the global stream, through the
/// consumers' view of the plan.
fn shares(s: &PlanSettings, epoch: u32) -> Vec<u64> {
    let plan = s.plan(epoch);
    let inputs = s.inputs();
    let mut per = vec![0; inputs.len()];
    for c in 0..s.consumers.max(1) {
        for slot in plan.consumer_slots(c) {
            for p in slot {
                let listed = s.listed_split(p.split);
                let i = inputs.iter().position(|&(f, n)| listed >= f && listed < f + n).unwrap();
                per[i] += p.hi - p.lo;
            }
        }
    }
    per
}

#[test]
fn mixed_plans_deal_every_element_once_and_equal_counts() {
    let counts = vec![40, 7, 33, 0, 64, 5, 19];
    for (splits, weights) in [(vec![3, 4], vec![0.7, 0.3]), (vec![1, 2, 4], vec![1.0, 1.0, 2.0])] {
        for stop in [MixStop::FirstExhausted, MixStop::Elements(150), MixStop::Elements(1000)] {
            for block in [1, 5, 16] {
                for batch in [1, 8, 32] {
                    for k in [1, 2, 3] {
                        for drop in [false, true] {
                            for mode in [Mode::Distributed, Mode::Replicated] {
                                let s = PlanSettings {
                                    batch,
                                    consumers: k,
                                    mode,
                                    drop_remainder: drop,
                                    ..mixed(counts.clone(), splits.clone(), &weights, block, stop)
                                };
                                check(&s);
                                if let MixStop::Elements(n) = stop {
                                    assert_eq!(s.plan(3).elements(), n);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn weights_set_the_shares_within_a_percent_and_the_draws_follow_the_seed() {
    // Two sources, 0.7 / 0.3, 100,000 elements an epoch; the small source is upsampled.
    let counts: Vec<u64> = (0..60).map(|i| 900 + (i * 37) % 400).collect();
    let s = PlanSettings {
        consumers: 2,
        batch: 256,
        ..mixed(counts, vec![40, 20], &[0.7, 0.3], 16, MixStop::Elements(100_000))
    };
    for epoch in 0..3 {
        let per = shares(&s, epoch);
        let total: u64 = per.iter().sum();
        assert_eq!(total, 100_000);
        let first = per[0] as f64 / total as f64;
        assert!((first - 0.7).abs() < 0.01, "epoch {epoch}: share {first}");
        // Batches mix the sources (blocks of 16, batches of 256), rather than taking whole
        // splits from one of them.
        let plan = s.plan(epoch);
        let mixed = plan
            .consumer_slots(0)
            .iter()
            .take(50)
            .filter(|slot| {
                let from_first: u64 =
                    slot.iter().filter(|p| s.listed_split(p.split) < 40).map(|p| p.hi - p.lo).sum();
                from_first > 0 && from_first < 256
            })
            .count();
        assert_eq!(mixed, 50);
    }
    // Deterministic by seed: the same plan twice; another seed or epoch draws differently.
    assert_eq!(s.plan(1).consumer_slots(1), s.plan(1).consumer_slots(1));
    assert_ne!(s.plan(1).consumer_slots(1), s.plan(2).consumer_slots(1));
    let other = PlanSettings { seed: 8, ..s.clone() };
    assert_ne!(s.plan(1).consumer_slots(1), other.plan(1).consumer_slots(1));
    assert_ne!(s.fingerprint(), other.fingerprint());
}

#[test]
fn first_exhausted_ends_the_epoch_when_a_draw_finds_its_source_empty() {
    // Source 0 has 100 elements, source 1 has 1000, equal weights, blocks of 10: source 0 runs
    // out after its 10th block, at about 200 elements, and the epoch ends at the next draw of it.
    let s = mixed(vec![50, 50, 500, 500], vec![2, 2], &[1.0, 1.0], 10, MixStop::FirstExhausted);
    let per = shares(&s, 0);
    assert_eq!(per[0], 100);
    assert!(per[1] >= 90 && per[1] <= 130, "{per:?}");
    assert!(s.plan(0).order().iter().all(|&v| v < 4), "no second pass");
}

#[test]
fn an_upsampled_source_repeats_in_new_passes_with_their_own_split_ids() {
    let s = mixed(vec![10, 10, 100, 100, 100, 100], vec![2, 4], &[0.5, 0.5], 4, MixStop::Elements(200));
    let plan = s.plan(0);
    let passes: Vec<u64> = plan.order().iter().filter(|&&v| s.listed_split(v) < 2).copied().collect();
    // Source 0 holds 20 elements and gives 100: five passes, ten virtual splits.
    assert_eq!(passes.len(), 10);
    assert!(passes.iter().any(|&v| v >= 6));
    // Shares are exact at every window of 32 blocks; 200 elements are 50 blocks of 4.
    let per = shares(&s, 0);
    assert_eq!(per.iter().sum::<u64>(), 200);
    assert!(per[0].abs_diff(100) <= 32 * 4 / 2, "{per:?}");
    check(&s);
}

#[test]
fn mixed_plans_learnt_in_any_order_never_change() {
    let counts = vec![12, 0, 30, 7, 25, 9];
    for stop in [MixStop::FirstExhausted, MixStop::Elements(90)] {
        for k in [1, 2] {
            let s = PlanSettings {
                consumers: k,
                batch: 4,
                ..mixed(counts.clone(), vec![2, 4], &[0.6, 0.4], 3, stop)
            };
            let complete = s.plan(2);
            let needed: Vec<u64> = complete.order().to_vec();
            for order in [needed.clone(), needed.iter().rev().copied().collect()] {
                let mut learning = PlanSettings { counts_known: false, ..s.clone() }.plan(2);
                for &split in &order {
                    learning.learn(split, s.counts[s.listed_split(split) as usize]).unwrap();
                    for &known in learning.order() {
                        if let Some(parts) = learning.parts_of_split(known, k) {
                            assert_eq!(Some(parts), complete.parts_of_split(known, k));
                        }
                    }
                    for c in 0..k {
                        let slots = learning.consumer_slots(c);
                        assert_eq!(slots[..], complete.consumer_slots(c)[..slots.len()]);
                    }
                }
                assert!(learning.is_complete());
                assert_eq!(learning.slots_per_consumer(), complete.slots_per_consumer());
            }
        }
    }
}
