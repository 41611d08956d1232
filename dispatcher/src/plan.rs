//! The epoch plan: which consumer gets which elements, as a pure function of the split counts,
//! the epoch's split order, the batch size, the consumer count, the mode and `dropRemainder`.
//!
//! The epoch's global stream is every split's output laid end to end in the split order. Global
//! batch `j` is stream elements `[jB, (j+1)B)`. In distributed mode batch `j` is consumer
//! `j mod k`'s slot `j div k`; an incomplete last round is split evenly so every consumer gets
//! the same number of batches. In replicated mode every consumer gets every batch. See
//! `docs/data-plane.md`.
//!
//! When the pipeline filters or packs, a split's output count is known only once it is computed,
//! so the plan learns counts as splits are counted ([`EpochPlan::learn`]). Until every count is
//! known, the plan is *partial*: it covers the whole rounds (`k` batches of `B`) that lie inside
//! the counted prefix of the split order. Those rounds are regular in every final plan, so
//! nothing a partial plan says ever changes; the last round is dealt when the last count arrives.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::hash::{Hash, Hasher};

/// How a job's consumers share the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// Each element once per epoch across the consumers.
    Distributed,
    /// Each consumer sees every element once per epoch.
    Replicated,
}

/// The fixed facts a plan is built from (everything but the epoch).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlanSettings {
    /// Elements of each split as listed, by split id.
    pub counts: Vec<u64>,
    /// Whether each split's output count is its listed count; false when stages filter or pack,
    /// and the plan learns the output counts as splits are computed.
    pub counts_known: bool,
    /// Elements per batch.
    pub batch: u64,
    /// Consumers of the job.
    pub consumers: u32,
    /// Distributed or replicated.
    pub mode: Mode,
    /// Drop what does not fill whole rounds of full batches.
    pub drop_remainder: bool,
    /// Visit splits in a seeded random order (else in listing order).
    pub shuffle: bool,
    /// Pipeline seed.
    pub seed: u64,
}

impl PlanSettings {
    /// A fingerprint of the settings: positions taken under one plan only resume under it.
    /// Stable across builds (FNV-1a over the fields), unlike `std`'s hasher.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        self.hash(&mut h);
        h.finish()
    }

    /// The split order of `epoch`: a permutation seeded by `(seed, epoch)`, or the listing order.
    pub fn order(&self, epoch: u32) -> Vec<u64> {
        let mut order: Vec<u64> = (0..self.counts.len() as u64).collect();
        if self.shuffle {
            let mut rng =
                ChaCha8Rng::seed_from_u64(mix(mix(self.seed ^ 0x6469_7370_6174_6368) ^ u64::from(epoch)));
            for i in (1..order.len()).rev() {
                let j = ((rng.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
                order.swap(i, j);
            }
        }
        order
    }

    /// The plan of `epoch`: complete when the counts are known, else partial until
    /// [`EpochPlan::learn`] has every split's count.
    pub fn plan(&self, epoch: u32) -> EpochPlan {
        let counts = if self.counts_known {
            self.counts.iter().map(|&c| Some(c)).collect()
        } else {
            vec![None; self.counts.len()]
        };
        EpochPlan::new(self, self.order(epoch), counts)
    }
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A range of one split's output routed to one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// First position in the split's output.
    pub lo: u64,
    /// One past the last position.
    pub hi: u64,
    /// The consumer's batch number in the epoch.
    pub slot: u64,
    /// Consumers that receive it.
    pub consumers: Vec<u32>,
}

/// One piece of a consumer's batch: positions `[lo, hi)` of `split`'s output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotPart {
    /// Split id.
    pub split: u64,
    /// First position.
    pub lo: u64,
    /// One past the last position.
    pub hi: u64,
}

/// One epoch's plan.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    order: Vec<u64>,
    /// Start of each split in the global stream, by split id (set for counted prefix splits).
    start: Vec<u64>,
    /// Elements of each split, by split id, once known.
    counts: Vec<Option<u64>>,
    /// Leading splits of `order` whose counts are known.
    known: usize,
    /// Elements in those splits.
    prefix: u64,
    /// Every count is known.
    complete: bool,
    /// Elements the plan deals with: all of them once complete, else the whole rounds inside
    /// the counted prefix.
    n: u64,
    b: u64,
    k: u64,
    replicated: bool,
    drop_remainder: bool,
    /// Global batches dealt in whole, before the evenly split last round.
    regular: u64,
    /// The last round, split into `k` chunks: its first element.
    last_round: Option<u64>,
}

/// A split's output count differs from the one learnt before: its stages are not deterministic
/// under their seed, so an epoch's plan cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountMismatch {
    /// The count learnt first.
    pub first: u64,
    /// The count reported now.
    pub now: u64,
}

impl EpochPlan {
    fn new(settings: &PlanSettings, order: Vec<u64>, counts: Vec<Option<u64>>) -> EpochPlan {
        let replicated = settings.mode == Mode::Replicated;
        let mut plan = EpochPlan {
            start: vec![0; counts.len()],
            order,
            counts,
            known: 0,
            prefix: 0,
            complete: false,
            n: 0,
            b: settings.batch.max(1),
            k: if replicated { 1 } else { u64::from(settings.consumers.max(1)) },
            replicated,
            drop_remainder: settings.drop_remainder,
            regular: 0,
            last_round: None,
        };
        plan.advance();
        plan
    }

    /// Records that `split` yields `count` elements. Returns whether the count is new; a count
    /// that differs from the one learnt before is an error (the plan keeps the first).
    pub fn learn(&mut self, split: u64, count: u64) -> Result<bool, CountMismatch> {
        let Some(slot) = self.counts.get_mut(split as usize) else { return Ok(false) };
        match *slot {
            Some(first) if first == count => Ok(false),
            Some(first) => Err(CountMismatch { first, now: count }),
            None => {
                *slot = Some(count);
                self.advance();
                Ok(true)
            }
        }
    }

    /// The output count of `split`, once known.
    pub fn count(&self, split: u64) -> Option<u64> {
        self.counts.get(split as usize).copied().flatten()
    }

    /// Splits at the front of the order whose counts are known.
    pub fn counted_splits(&self) -> usize {
        self.known
    }

    /// Whether every split's count is known (always, for pipelines whose counts are listed).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Extends the counted prefix as far as the counts allow, and what it determines.
    fn advance(&mut self) {
        while let Some(&s) = self.order.get(self.known) {
            let Some(count) = self.counts[s as usize] else { break };
            self.start[s as usize] = self.prefix;
            self.prefix += count;
            self.known += 1;
        }
        let (b, k) = (self.b, self.k);
        if self.known < self.order.len() {
            // Whole rounds inside the prefix are regular whatever the remaining counts are.
            let certain = self.prefix / (k * b) * (k * b);
            (self.n, self.regular, self.last_round) = (certain, certain / b, None);
            return;
        }
        self.complete = true;
        self.n = self.prefix;
        let n = self.n;
        (self.regular, self.last_round) = if self.drop_remainder {
            ((n / b) / k * k, None)
        } else {
            let t = n.div_ceil(b);
            let m = t % k;
            if m == 0 { (t, None) } else { (t - m, Some((t - m) * b)) }
        };
    }

    /// Splits in the order they are handed out.
    pub fn order(&self) -> &[u64] {
        &self.order
    }

    /// Elements in the epoch's global stream; for a partial plan, those of its known rounds.
    pub fn elements(&self) -> u64 {
        self.n
    }

    /// Batches each consumer receives; for a partial plan, those known so far.
    pub fn slots_per_consumer(&self) -> u64 {
        self.regular / self.k + u64::from(self.last_round.is_some())
    }

    /// Elements dealt (the rest is dropped by `dropRemainder`).
    pub fn dealt(&self) -> u64 {
        if self.last_round.is_some() { self.n } else { (self.regular * self.b).min(self.n) }
    }

    /// Global range of consumer `c`'s slot `slot`.
    fn slot_range(&self, c: u64, slot: u64) -> (u64, u64) {
        let j = slot * self.k + c;
        if j < self.regular {
            return (j * self.b, ((j + 1) * self.b).min(self.n));
        }
        let r0 = self.last_round.unwrap_or(self.n);
        let e = self.n - r0;
        (r0 + c * e / self.k, r0 + (c + 1) * e / self.k)
    }

    /// The consumers of a slot owned by plan consumer `c`.
    fn owners(&self, c: u64, all: u32) -> Vec<u32> {
        if self.replicated { (0..all.max(1)).collect() } else { vec![c as u32] }
    }

    /// How split `split`'s output is cut and routed; `consumers` is the job's consumer count
    /// (replicated parts go to all of them). Positions outside every part are dropped. `None`
    /// while a partial plan cannot tell yet: the split, or a split before it, is not counted, or
    /// its output reaches into a round that is not known to be whole.
    pub fn parts_of_split(&self, split: u64, consumers: u32) -> Option<Vec<Part>> {
        let count = self.counts.get(split as usize).copied().flatten()?;
        let s0 = self.start[split as usize];
        if !self.complete {
            let position = self.order.iter().position(|&s| s == split)?;
            if position >= self.known || s0 + count > self.n {
                return None;
            }
        }
        let s1 = (s0 + count).min(self.dealt());
        let mut parts = Vec::new();
        let mut at = s0;
        while at < s1 {
            let (c, slot, end) = self.owner_of(at);
            let hi = end.min(s1);
            if hi > at {
                parts.push(Part { lo: at - s0, hi: hi - s0, slot, consumers: self.owners(c, consumers) });
            }
            at = hi.max(at + 1);
        }
        Some(parts)
    }

    /// The plan consumer, slot and end of the global batch holding position `at`.
    fn owner_of(&self, at: u64) -> (u64, u64, u64) {
        let j = at / self.b;
        if j < self.regular {
            return (j % self.k, j / self.k, ((j + 1) * self.b).min(self.n));
        }
        let r0 = self.last_round.unwrap_or(self.n);
        let e = self.n - r0;
        // Chunk c is [r0 + c·e/k, r0 + (c+1)·e/k): find the last c whose start is ≤ at.
        let mut c = ((at - r0) * self.k / e.max(1)).min(self.k - 1);
        while c + 1 < self.k && r0 + (c + 1) * e / self.k <= at {
            c += 1;
        }
        while c > 0 && r0 + c * e / self.k > at {
            c -= 1;
        }
        (c, self.regular / self.k, r0 + (c + 1) * e / self.k)
    }

    /// Consumer `consumer`'s batches: for each slot, the split ranges that make it, in order.
    pub fn consumer_slots(&self, consumer: u32) -> Vec<Vec<SlotPart>> {
        self.consumer_slots_from(consumer, 0)
    }

    /// [`Self::consumer_slots`] from slot `from` on.
    pub fn consumer_slots_from(&self, consumer: u32, from: u64) -> Vec<Vec<SlotPart>> {
        let c = if self.replicated { 0 } else { u64::from(consumer) };
        (from..self.slots_per_consumer()).map(|slot| self.slot_parts(c, slot)).collect()
    }

    fn slot_parts(&self, c: u64, slot: u64) -> Vec<SlotPart> {
        let (a, z) = self.slot_range(c, slot);
        let mut parts = Vec::new();
        // The split holding `a`: the last in order whose start is ≤ a (slots lie in the prefix).
        let counted = &self.order[..self.known];
        let idx = counted.partition_point(|&s| self.start[s as usize] <= a).saturating_sub(1);
        for &s in &counted[idx..] {
            let s0 = self.start[s as usize];
            if s0 >= z {
                break;
            }
            let s1 = s0 + self.counts[s as usize].unwrap_or(0);
            let (lo, hi) = (a.max(s0), z.min(s1));
            if hi > lo {
                parts.push(SlotPart { split: s, lo: lo - s0, hi: hi - s0 });
            }
        }
        parts
    }

    /// Splits holding any part of consumer `consumer`'s slots for which `wanted(slot)` is true.
    pub fn splits_for(&self, consumer: u32, wanted: impl Fn(u64) -> bool) -> Vec<u64> {
        let c = if self.replicated { 0 } else { u64::from(consumer) };
        let mut splits: Vec<u64> = (0..self.slots_per_consumer())
            .filter(|&slot| wanted(slot))
            .flat_map(|slot| self.slot_parts(c, slot).into_iter().map(|p| p.split))
            .collect();
        splits.sort_unstable();
        splits.dedup();
        splits
    }
}

#[cfg(test)]
mod tests {
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
        }
    }

    /// Every dealt position of every split, mapped to (consumer, slot), via both views.
    fn check(s: &PlanSettings) {
        let plan = s.plan(3);
        let k = s.consumers.max(1);
        let mut from_parts: BTreeMap<(u64, u64), Vec<(u32, u64)>> = BTreeMap::new();
        for split in 0..s.counts.len() as u64 {
            let mut last = 0;
            for p in plan.parts_of_split(split, k).unwrap() {
                assert!(p.lo >= last && p.hi > p.lo && p.hi <= s.counts[split as usize]);
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
        let total: u64 = s.counts.iter().sum();
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
        for counts in [vec![64, 64, 64, 10], vec![5, 0, 7, 3, 3], vec![128; 9], vec![1], vec![33, 0, 31, 64]]
        {
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
        let s =
            PlanSettings { counts_known: false, ..settings(vec![10, 10], 4, 2, Mode::Distributed, false) };
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
}
