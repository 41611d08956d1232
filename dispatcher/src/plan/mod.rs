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

mod layout;
#[cfg(test)]
mod tests;

use layout::{Layout, OutOfRange};
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// How several inputs (`spec.sources`) are mixed; `None` for a single source.
    pub mixing: Option<MixPlan>,
}

impl Hash for PlanSettings {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The fields in declaration order, as `derive` hashed them before mixing existed (so
        // fingerprints of single-source plans did not change); the mixing only when there is one.
        self.counts.hash(state);
        self.counts_known.hash(state);
        self.batch.hash(state);
        self.consumers.hash(state);
        self.mode.hash(state);
        self.drop_remainder.hash(state);
        self.shuffle.hash(state);
        self.seed.hash(state);
        if let Some(mixing) = &self.mixing {
            mixing.hash(state);
        }
    }
}

/// How several inputs are mixed into one global stream (see `layout.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MixPlan {
    /// Listed splits of each input, in order: input `i` owns the next `splits[i]` split ids.
    pub splits: Vec<u64>,
    /// Weight of each input, in integer shares that sum to 2^32.
    pub weights: Vec<u64>,
    /// Consecutive elements drawn from one input at a time.
    pub block: u64,
    /// When an epoch ends.
    pub stop: MixStop,
}

/// When an epoch of mixed inputs ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MixStop {
    /// When a draw finds its input exhausted (a single input: when it is read whole).
    FirstExhausted,
    /// After this many elements; exhausted inputs start over.
    Elements(u64),
}

impl MixPlan {
    /// Integer weights summing to 2^32 from positive relative weights (all equal when none is
    /// positive and finite).
    pub fn weights(relative: &[f64]) -> Vec<u64> {
        let valid = |w: f64| w.is_finite() && w > 0.0;
        let total: f64 = relative.iter().copied().filter(|&w| valid(w)).sum();
        if relative.is_empty() || total <= 0.0 {
            let n = relative.len().max(1) as u64;
            return (0..n)
                .map(|i| layout::WEIGHT_UNIT / n + u64::from(i < layout::WEIGHT_UNIT % n))
                .collect();
        }
        let mut weights: Vec<u64> = relative
            .iter()
            .map(|&w| if valid(w) { (w / total * layout::WEIGHT_UNIT as f64).floor() as u64 } else { 0 })
            .collect();
        let short = layout::WEIGHT_UNIT.saturating_sub(weights.iter().sum());
        if let Some(max) = (0..weights.len()).max_by_key(|&i| weights[i]) {
            weights[max] += short;
        }
        weights
    }
}

impl PlanSettings {
    /// A fingerprint of the settings: positions taken under one plan only resume under it.
    /// Stable across builds (FNV-1a over the fields), unlike `std`'s hasher.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        self.hash(&mut h);
        h.finish()
    }

    /// The order splits are handed out in `epoch` when the counts are as listed: for a single
    /// source, a permutation seeded by `(seed, epoch)`, or the listing order.
    pub fn order(&self, epoch: u32) -> Vec<u64> {
        self.plan(epoch).order().to_vec()
    }

    /// The plan of `epoch`: complete when the counts are known, else partial until
    /// [`EpochPlan::learn`] has the counts the epoch needs.
    pub fn plan(&self, epoch: u32) -> EpochPlan {
        EpochPlan::new(self, epoch)
    }

    /// First split id and split count of each input.
    pub(crate) fn inputs(&self) -> Vec<(u64, u64)> {
        match &self.mixing {
            None => vec![(0, self.counts.len() as u64)],
            Some(m) => {
                let mut first = 0;
                m.splits
                    .iter()
                    .map(|&n| {
                        let input = (first, n);
                        first += n;
                        input
                    })
                    .collect()
            }
        }
    }

    /// The listed split a (possibly virtual) split id reads: pass `p` of listed split `x` is
    /// `p × splits + x`.
    pub fn listed_split(&self, split: u64) -> u64 {
        match self.counts.len() as u64 {
            0 => split,
            s => split % s,
        }
    }

    /// Most split ids an epoch can use (passes included).
    pub fn max_splits(&self) -> u64 {
        let s = self.counts.len() as u64;
        if matches!(self.mixing.as_ref().map(|m| m.stop), Some(MixStop::Elements(_))) {
            s.saturating_mul(layout::MAX_PASSES)
        } else {
            s
        }
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
    layout: Layout,
    /// Every count is known.
    complete: bool,
    /// Elements the plan deals with: all of them once complete, else the whole rounds inside
    /// the laid-out prefix.
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
    fn new(settings: &PlanSettings, epoch: u32) -> EpochPlan {
        let replicated = settings.mode == Mode::Replicated;
        let mut plan = EpochPlan {
            layout: Layout::new(settings, epoch),
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
    /// that differs from the one learnt before is an error (the plan keeps the first). A split id
    /// the plan cannot have is ignored.
    pub fn learn(&mut self, split: u64, count: u64) -> Result<bool, CountMismatch> {
        match self.layout.learn(split, count) {
            Err(OutOfRange) => Ok(false),
            Ok(Some(first)) if first == count => Ok(false),
            Ok(Some(first)) => Err(CountMismatch { first, now: count }),
            Ok(None) => {
                self.advance();
                Ok(true)
            }
        }
    }

    /// The output count of `split`, once known.
    pub fn count(&self, split: u64) -> Option<u64> {
        self.layout.count(split)
    }

    /// Splits at the front of the order whose counts are known.
    pub fn counted_splits(&self) -> usize {
        self.layout.counted()
    }

    /// Whether every count the epoch needs is known (always, for pipelines whose counts are
    /// listed).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Takes in what the layout determines now.
    fn advance(&mut self) {
        let (b, k) = (self.b, self.k);
        let prefix = self.layout.prefix;
        if !self.layout.complete {
            // Whole rounds inside the prefix are regular whatever the remaining counts are.
            let certain = prefix / (k * b) * (k * b);
            (self.n, self.regular, self.last_round) = (certain, certain / b, None);
            return;
        }
        self.complete = true;
        self.n = prefix;
        let n = self.n;
        (self.regular, self.last_round) = if self.drop_remainder {
            ((n / b) / k * k, None)
        } else {
            let t = n.div_ceil(b);
            let m = t % k;
            if m == 0 { (t, None) } else { (t - m, Some((t - m) * b)) }
        };
    }

    /// Splits in the order they are handed out. With mixed sources or passes, ids are virtual:
    /// pass `p` of listed split `x` is `p × splits + x` (see [`PlanSettings::listed_split`]).
    pub fn order(&self) -> &[u64] {
        self.layout.order()
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
        if !self.complete {
            self.layout.count(split)?;
            if !self.layout.placed(split) || self.layout.runs_of(split).any(|r| r.at + r.len > self.n) {
                return None;
            }
        }
        let dealt = self.dealt();
        let mut parts = Vec::new();
        for run in self.layout.runs_of(split) {
            let (s0, s1) = (run.at, (run.at + run.len).min(dealt));
            let mut at = s0;
            while at < s1 {
                let (c, slot, end) = self.owner_of(at);
                let hi = end.min(s1);
                if hi > at {
                    parts.push(Part {
                        lo: run.lo + at - s0,
                        hi: run.lo + hi - s0,
                        slot,
                        consumers: self.owners(c, consumers),
                    });
                }
                at = hi.max(at + 1);
            }
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
        for run in self.layout.runs_in(a, z) {
            let (s0, s1) = (run.at, run.at + run.len);
            let (lo, hi) = (a.max(s0), z.min(s1));
            if hi > lo {
                parts.push(SlotPart { split: run.split, lo: run.lo + lo - s0, hi: run.lo + hi - s0 });
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
