//! Compute time per stage and elements computed, counted by every compute thread and read by the
//! tuner and the metrics.
//!
//! Each thread counts into a shard of its own: a counter that two threads add to moves its cache
//! line between their cores on every element, and on a table's rows (one stage call takes about
//! a hundred nanoseconds) that cost more than the stage. Readers sum the shards.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Shards per execution: threads beyond this many share one, which costs time, never counts.
const SHARDS: usize = 16;

/// Unused words after each shard's counters, so that no two shards share a cache line.
const PAD: usize = 16;

/// Compute time per stage, summed over elements since the execution started.
#[derive(Debug)]
pub struct StageTimes {
    /// `SHARDS` runs of `stride` counters: each stage's nanoseconds, then the elements.
    counters: Box<[AtomicU64]>,
    stages: usize,
    stride: usize,
    /// Compute threads running now (the tuner moves it).
    pub(super) threads: AtomicUsize,
}

thread_local! {
    /// The shard this thread counts into.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

impl StageTimes {
    /// Counters for `stages` stages, run by `threads` compute threads to start with.
    pub(super) fn new(stages: usize, threads: usize) -> StageTimes {
        let stride = stages + 1 + PAD;
        StageTimes {
            counters: (0..SHARDS * stride).map(|_| AtomicU64::new(0)).collect(),
            stages,
            stride,
            threads: AtomicUsize::new(threads),
        }
    }

    /// This thread's counters: each stage's, then the elements'.
    fn mine(&self) -> &[AtomicU64] {
        let at = SHARD.with(|s| *s) * self.stride;
        &self.counters[at..at + self.stages + 1]
    }

    /// Adds `nanos` to stage `stage`'s time (a stage past the plan's is not counted).
    pub(super) fn add(&self, stage: usize, nanos: u64) {
        if stage < self.stages {
            self.mine()[stage].fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// Counts one element computed.
    pub(super) fn add_element(&self) {
        self.mine()[self.stages].fetch_add(1, Ordering::Relaxed);
    }

    /// Compute threads the execution runs now.
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Acquire)
    }

    /// Nanoseconds spent in each stage (in plan order) and the elements computed, so far.
    pub fn totals(&self) -> (Vec<u64>, u64) {
        let mut sums = vec![0u64; self.stages + 1];
        for shard in self.counters.chunks_exact(self.stride) {
            for (sum, counter) in sums.iter_mut().zip(shard) {
                *sum += counter.load(Ordering::Relaxed);
            }
        }
        let elements = sums.pop().unwrap_or(0);
        (sums, elements)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_totals_sum_what_every_thread_counted() {
        let times = StageTimes::new(2, 1);
        std::thread::scope(|scope| {
            for t in 0..(SHARDS + 3) as u64 {
                let times = &times;
                scope.spawn(move || {
                    for _ in 0..100 {
                        times.add(0, t);
                        times.add(1, 1);
                        times.add(2, 1_000); // past the plan: not counted
                        times.add_element();
                    }
                });
            }
        });
        let n = (SHARDS + 3) as u64;
        assert_eq!(times.totals(), (vec![100 * n * (n - 1) / 2, 100 * n], 100 * n));
        assert_eq!(StageTimes::new(0, 1).totals(), (vec![], 0));
    }
}
