//! The layout of an epoch's global stream: which positions of which splits lie where.
//!
//! Each input (the single source, or each mixed source) is read as a *source stream*: its splits'
//! outputs end to end, in the epoch's seeded order for that input. The global stream is made of
//! *blocks*: block `j` takes the next `block` elements of the stream of input `σ(j)`, where `σ` is
//! the mixing sampler (always input 0 when there is one input, with one unbounded block). Laying
//! blocks end to end gives *runs*, `(global start, split, lo, len)`: ranges of one split's output
//! at one place in the global stream.
//!
//! The layout grows as split counts become known: it stops at the first block that needs a split
//! whose count is not known yet, so everything laid out is final. It is complete when the epoch
//! ends: a draw finds its input exhausted (`firstExhausted`; with one input, when every split is
//! laid out), or the epoch holds its fixed number of elements (`elements`; an input that runs out
//! starts a new *pass*, its splits again in a new seeded order, as new virtual splits).

use super::{Fnv, MixStop, PlanSettings, mix};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::hash::Hasher;

/// Most passes over one input in an epoch (`stop: elements`). A virtual split id is
/// `pass × splits + listed id`, so ids stay below `MAX_PASSES × splits`.
pub const MAX_PASSES: u64 = 4096;

/// Blocks whose inputs the sampler deals at a time, in a seeded random order.
const WINDOW: usize = 32;

/// Weight units: weights are kept as integers summing to this, so sampling is exact.
pub(super) const WEIGHT_UNIT: u64 = 1 << 32;

/// A split id no pass of any input has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OutOfRange;

/// A range of one split's output at one place in the global stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    /// Start in the global stream.
    pub at: u64,
    /// Virtual split id.
    pub split: u64,
    /// First position in the split's output.
    pub lo: u64,
    /// Elements.
    pub len: u64,
}

/// Where one input's stream has got to.
#[derive(Clone, Debug)]
struct Cursor {
    /// Its splits, virtual ids, in stream order (passes appended as they are needed).
    order: Vec<u64>,
    /// Index in `order` of the split being read.
    pos: usize,
    /// Elements of that split already laid out.
    off: u64,
    /// Passes started.
    passes: u64,
}

/// Chooses the input of each block: the inputs' shares of every prefix of blocks follow the
/// weights to within a window (smooth weighted round robin), dealt in a seeded random order within
/// each window of [`WINDOW`] blocks.
#[derive(Clone, Debug)]
struct Sampler {
    weights: Vec<u64>,
    taken: Vec<u64>,
    drawn: u64,
    window: Vec<usize>,
    at: usize,
    seed: u64,
}

impl Sampler {
    fn new(weights: &[u64], seed: u64, epoch: u32) -> Sampler {
        Sampler {
            weights: weights.to_vec(),
            taken: vec![0; weights.len()],
            drawn: 0,
            window: Vec::new(),
            at: 0,
            seed: mix(mix(seed ^ 0x6d69_7869_6e67) ^ u64::from(epoch)),
        }
    }

    fn next(&mut self) -> usize {
        if self.weights.len() <= 1 {
            return 0;
        }
        if self.at == self.window.len() {
            self.refill();
        }
        let input = self.window[self.at];
        self.at += 1;
        input
    }

    fn refill(&mut self) {
        let index = self.drawn / WINDOW as u64;
        self.window.clear();
        for _ in 0..WINDOW {
            let m = u128::from(self.drawn + 1);
            // The input furthest behind its share of m blocks (ties: the first).
            let pick = (0..self.weights.len())
                .max_by_key(|&i| {
                    let due = u128::from(self.weights[i]) * m;
                    let had = u128::from(self.taken[i]) * u128::from(WEIGHT_UNIT);
                    (due as i128 - had as i128, std::cmp::Reverse(i))
                })
                .unwrap_or(0);
            self.taken[pick] += 1;
            self.drawn += 1;
            self.window.push(pick);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed ^ index));
        for i in (1..self.window.len()).rev() {
            let j = ((rng.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
            self.window.swap(i, j);
        }
        self.at = 0;
    }
}

/// The global stream of one epoch, laid out as far as the known counts allow.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Listed elements by listed split id.
    listed: Vec<u64>,
    /// Whether the listed counts are the output counts.
    counts_known: bool,
    /// Learnt output counts by virtual split id.
    learnt: Vec<Option<u64>>,
    /// First listed split id of each input, and its split count.
    inputs: Vec<(u64, u64)>,
    cursors: Vec<Cursor>,
    sampler: Sampler,
    /// Input of the block being filled, and how many elements it holds.
    current: Option<(usize, u64)>,
    block: u64,
    stop: MixStop,
    /// Epoch seeds.
    seed: u64,
    epoch: u32,
    shuffle: bool,
    /// The layout so far, in global order.
    runs: Vec<Run>,
    /// Indices into `runs` of each virtual split's runs.
    by_split: Vec<Vec<u32>>,
    /// Elements laid out.
    pub prefix: u64,
    /// Whether the epoch's end is laid out.
    pub complete: bool,
    /// Virtual splits in the order they are handed out.
    order: Vec<u64>,
    ordered: Vec<bool>,
    /// Leading entries of `order` whose counts are known (the order only grows at its end and
    /// counts only become known, so this only grows).
    counted: usize,
}

impl Layout {
    pub fn new(settings: &PlanSettings, epoch: u32) -> Layout {
        let inputs = settings.inputs();
        let weights: Vec<u64> =
            settings.mixing.as_ref().map(|m| m.weights.clone()).unwrap_or_else(|| vec![1]);
        let mut layout = Layout {
            listed: settings.counts.clone(),
            counts_known: settings.counts_known,
            learnt: Vec::new(),
            cursors: inputs.iter().map(|_| Cursor { order: Vec::new(), pos: 0, off: 0, passes: 0 }).collect(),
            inputs,
            sampler: Sampler::new(&weights, settings.seed, epoch),
            current: None,
            block: settings.mixing.as_ref().map_or(u64::MAX, |m| m.block.max(1)),
            stop: settings.mixing.as_ref().map_or(MixStop::FirstExhausted, |m| m.stop),
            seed: settings.seed,
            epoch,
            shuffle: settings.shuffle,
            runs: Vec::new(),
            by_split: Vec::new(),
            prefix: 0,
            complete: false,
            order: Vec::new(),
            ordered: Vec::new(),
            counted: 0,
        };
        layout.order = layout.estimated_order();
        for &v in &layout.order.clone() {
            layout.mark_ordered(v);
        }
        layout.advance();
        layout
    }

    /// Splits in the order they are handed out: the order the layout would take them in if
    /// every unknown count were its listed count; a split the layout needs beyond it is appended.
    pub fn order(&self) -> &[u64] {
        &self.order
    }

    /// Leading splits of [`Layout::order`] whose counts are known.
    pub fn counted(&self) -> usize {
        self.counted
    }

    /// The output count of virtual split `v`, once known.
    pub fn count(&self, v: u64) -> Option<u64> {
        if self.counts_known {
            let s = self.listed.len() as u64;
            return (s > 0 && v < s * MAX_PASSES).then(|| self.listed[(v % s) as usize]);
        }
        self.learnt.get(v as usize).copied().flatten()
    }

    /// Records a learnt count: `Ok(None)` when it is new, `Ok(Some(first))` when a count was
    /// known before (the caller compares them), an error for an id beyond every pass.
    pub fn learn(&mut self, v: u64, count: u64) -> Result<Option<u64>, OutOfRange> {
        let s = self.listed.len() as u64;
        if v >= s.saturating_mul(MAX_PASSES) {
            return Err(OutOfRange);
        }
        if self.counts_known {
            return Ok(self.count(v));
        }
        let i = v as usize;
        if self.learnt.len() <= i {
            self.learnt.resize(i + 1, None);
        }
        if let Some(first) = self.learnt[i] {
            return Ok(Some(first));
        }
        self.learnt[i] = Some(count);
        self.advance();
        Ok(None)
    }

    /// The runs of virtual split `v`, in output order.
    pub fn runs_of(&self, v: u64) -> impl Iterator<Item = &Run> {
        self.by_split.get(v as usize).into_iter().flatten().map(|&r| &self.runs[r as usize])
    }

    /// Whether every element of `v` is laid out (or the epoch ended before them).
    pub fn placed(&self, v: u64) -> bool {
        if self.complete {
            return true;
        }
        let Some(count) = self.count(v) else { return false };
        let laid: u64 = self.runs_of(v).map(|r| r.len).sum();
        laid == count && (count > 0 || self.passed(v))
    }

    /// Whether the layout has read past `v` (an empty split counts as laid out once passed).
    fn passed(&self, v: u64) -> bool {
        let Some((input, pass, _)) = self.locate(v) else { return false };
        let c = &self.cursors[input];
        pass < c.passes && c.order.iter().take(c.pos).any(|&x| x == v)
    }

    /// The runs overlapping global range `[a, z)`, in order.
    pub fn runs_in(&self, a: u64, z: u64) -> &[Run] {
        let first = self.runs.partition_point(|r| r.at + r.len <= a);
        let end = self.runs.partition_point(|r| r.at < z);
        &self.runs[first..end.max(first)]
    }

    /// `(input, pass, listed id)` of virtual split `v`.
    fn locate(&self, v: u64) -> Option<(usize, u64, u64)> {
        let s = self.listed.len() as u64;
        if s == 0 {
            return None;
        }
        let (pass, id) = (v / s, v % s);
        let input = self.inputs.iter().position(|&(first, n)| id >= first && id < first + n)?;
        Some((input, pass, id))
    }

    /// Virtual split ids of input `input`'s pass `pass`, in the epoch's order.
    fn pass_order(&self, input: usize, pass: u64) -> Vec<u64> {
        let (first, n) = self.inputs[input];
        let s = self.listed.len() as u64;
        let mut ids: Vec<u64> = (first..first + n).collect();
        if self.shuffle {
            let seed = if self.inputs.len() == 1 && pass == 0 {
                // One input, first pass: the split order plans have always had.
                mix(mix(self.seed ^ 0x6469_7370_6174_6368) ^ u64::from(self.epoch))
            } else {
                let mut h = Fnv(0xcbf2_9ce4_8422_2325);
                for word in [self.seed, u64::from(self.epoch), input as u64, pass] {
                    h.write(&word.to_le_bytes());
                }
                mix(h.finish())
            };
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for i in (1..ids.len()).rev() {
                let j = ((rng.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
                ids.swap(i, j);
            }
        }
        ids.into_iter().map(|id| pass * s + id).collect()
    }

    fn mark_ordered(&mut self, v: u64) -> bool {
        let i = v as usize;
        if self.ordered.len() <= i {
            self.ordered.resize(i + 1, false);
        }
        !std::mem::replace(&mut self.ordered[i], true)
    }

    /// The order splits are first needed in when unknown counts are taken as listed.
    fn estimated_order(&self) -> Vec<u64> {
        let mut sim = self.clone();
        sim.counts_known = true;
        sim.learnt.clear();
        let mut order = Vec::new();
        let mut seen = std::collections::HashSet::new();
        sim.lay(|v| {
            if seen.insert(v) {
                order.push(v);
            }
        });
        order
    }

    /// Lays out as far as the known counts allow, appending any split it needs to the order.
    fn advance(&mut self) {
        let mut needed = Vec::new();
        self.lay(|v| needed.push(v));
        for v in needed {
            if self.mark_ordered(v) {
                self.order.push(v);
            }
        }
        while let Some(&v) = self.order.get(self.counted) {
            if self.count(v).is_none() {
                break;
            }
            self.counted += 1;
        }
    }

    /// The layout loop; `touch` hears every split the layout reads or waits for.
    fn lay(&mut self, mut touch: impl FnMut(u64)) {
        while !self.complete {
            if let MixStop::Elements(n) = self.stop
                && self.prefix >= n
            {
                self.complete = true;
                break;
            }
            let (input, fill) = match self.current {
                Some(current) => current,
                None => {
                    let input = self.sampler.next();
                    self.current = Some((input, 0));
                    (input, 0)
                }
            };
            let mut need = self.block - fill;
            if let MixStop::Elements(n) = self.stop {
                need = need.min(n - self.prefix);
            }
            if self.cursors[input].pos == self.cursors[input].order.len() && !self.start_pass(input) {
                self.complete = true;
                break;
            }
            let c = &self.cursors[input];
            let v = c.order[c.pos];
            touch(v);
            let Some(count) = self.count(v) else { break };
            let off = c.off;
            let take = need.min(count - off.min(count));
            if take > 0 {
                self.push_run(v, off, take);
            }
            let c = &mut self.cursors[input];
            c.off += take;
            if c.off >= count {
                c.pos += 1;
                c.off = 0;
            }
            let fill = fill + take;
            self.current = if fill >= self.block { None } else { Some((input, fill)) };
        }
    }

    /// Starts the next pass over `input`, when the stop rule allows one; false when the input is
    /// exhausted for this epoch.
    fn start_pass(&mut self, input: usize) -> bool {
        let c = &self.cursors[input];
        let again = c.passes == 0 || matches!(self.stop, MixStop::Elements(_));
        if !again || c.passes >= MAX_PASSES || self.inputs[input].1 == 0 {
            return false;
        }
        // A pass that yielded nothing would repeat forever: the input is exhausted.
        if c.passes > 0 {
            let start = c.order.len() - self.inputs[input].1 as usize;
            let yielded: u64 =
                c.order[start..].iter().map(|&v| self.runs_of(v).map(|r| r.len).sum::<u64>()).sum();
            if yielded == 0 {
                return false;
            }
        }
        let pass = c.passes;
        let ids = self.pass_order(input, pass);
        let c = &mut self.cursors[input];
        c.order.extend(ids);
        c.passes += 1;
        true
    }

    fn push_run(&mut self, v: u64, lo: u64, len: u64) {
        let at = self.prefix;
        self.prefix += len;
        if let Some(last) = self.runs.last_mut()
            && last.split == v
            && last.at + last.len == at
            && last.lo + last.len == lo
        {
            last.len += len;
            return;
        }
        let i = v as usize;
        if self.by_split.len() <= i {
            self.by_split.resize(i + 1, Vec::new());
        }
        self.by_split[i].push(self.runs.len() as u32);
        self.runs.push(Run { at, split: v, lo, len });
    }
}
