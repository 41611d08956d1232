//! How many reads a `files` split keeps in flight, tuned while it runs.
//!
//! A `files` source reads one object per sample, so each sample pays the store's latency for a
//! request: on object storage tens of milliseconds, which only reads in flight at once can hide
//! (Little's law: in flight = rate × latency). A fixed depth is either too shallow for a
//! distant store and a many-core worker, or holds more bytes than a local disk needs. As
//! tf.data's autotune deepens a prefetch buffer that its consumer finds empty, the reader deepens
//! its reads while the store holds it up more than the pipeline after it does. It times two
//! waits: for the read at the head of its queue, and for handing the element on (the compute
//! threads' queue and the prefetch budget push back there when they have enough). Every
//! [`WINDOW`] reads in which the first took more than [`BEHIND`] of the two together, the depth
//! doubles, up to [`MOST`] reads (and [`MOST_BYTES`] of listed object sizes, which the reader
//! checks). Time counts rather than the number of waits: reads that all started together finish
//! together, so a reader held up by the store throughout may wait only once per depth's worth
//! of reads. The wait for a split's first read does not count: nothing could have read it
//! earlier. After [`QUIET`] windows in a row in which the store's share stayed under [`AHEAD`],
//! the depth gives back an eighth, never below [`START`], so a passing slow spell in the store
//! does not keep the reads deep for good, while a depth that just suffices is not lost at once
//! (each step back that proves too shallow costs waits before the depth doubles again).
//!
//! The elements and their order do not depend on the depth: it changes only when reads start.
//! `spec.optimize: false` keeps the depth at [`START`].

use std::sync::Mutex;
use std::time::Duration;

/// Reads in flight when a source opens, and the least the tuner goes back to.
pub const START: usize = 16;
/// The most reads in flight at once.
pub const MOST: usize = 256;
/// The most bytes (by the listing's object sizes) in flight at once, beyond the first read.
pub const MOST_BYTES: u64 = 32 << 20;
/// Reads per decision.
const WINDOW: u32 = 32;
/// The store's share of the reader's waits above which the depth doubles.
const BEHIND: f64 = 1.0 / 2.0;
/// The share below which a window counts as quiet.
const AHEAD: f64 = 1.0 / 10.0;
/// Quiet windows in a row after which the depth gives back an eighth.
const QUIET: u32 = 64;

/// The read depth of one source, shared by the splits it reads.
#[derive(Debug)]
pub struct ReadAhead {
    tuned: bool,
    climb: Mutex<Climb>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Climb {
    depth: usize,
    reads: u32,
    /// Time the reader waited on reads in this window.
    waited: Duration,
    /// Time it took to hand elements on in this window.
    handing: Duration,
    quiet: u32,
}

impl ReadAhead {
    /// A depth of [`START`], tuned as reads go when `tuned`.
    pub fn new(tuned: bool) -> ReadAhead {
        let climb =
            Climb { depth: START, reads: 0, waited: Duration::ZERO, handing: Duration::ZERO, quiet: 0 };
        ReadAhead { tuned, climb: Mutex::new(climb) }
    }

    fn climb(&self) -> std::sync::MutexGuard<'_, Climb> {
        // A poisoned lock only means a reader panicked mid-count; the count is still a count.
        self.climb.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads to keep in flight now.
    pub fn depth(&self) -> usize {
        self.climb().depth
    }

    /// Counts one read taken from the head of the queue: the reader `waited` for it (zero for a
    /// split's first read), and handing its element on took `handing`.
    pub fn took(&self, waited: Duration, handing: Duration) {
        if self.tuned {
            self.climb().took(waited, handing);
        }
    }
}

impl Climb {
    fn took(&mut self, waited: Duration, handing: Duration) {
        self.reads += 1;
        self.waited += waited;
        self.handing += handing;
        if self.reads < WINDOW {
            return;
        }
        let both = (self.waited + self.handing).as_secs_f64();
        let share = if both > 0.0 { self.waited.as_secs_f64() / both } else { 0.0 };
        if share > BEHIND {
            let deeper = (self.depth * 2).min(MOST);
            if deeper != self.depth {
                tracing::debug!(depth = deeper, share, "reads fell behind; more in flight");
            }
            self.depth = deeper;
            self.quiet = 0;
        } else if share < AHEAD {
            self.quiet += 1;
            if self.quiet >= QUIET {
                let shallower = (self.depth - self.depth / 8).max(START);
                if shallower != self.depth {
                    tracing::debug!(depth = shallower, "reads stayed ahead; fewer in flight");
                }
                self.depth = shallower;
                self.quiet = 0;
            }
        } else {
            self.quiet = 0;
        }
        self.reads = 0;
        self.waited = Duration::ZERO;
        self.handing = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `windows` windows of reads, each waiting 1 ms in all, `store` of it on the read.
    fn windows(read_ahead: &ReadAhead, windows: u32, store: f64) {
        for _ in 0..windows * WINDOW {
            let waited = Duration::from_secs_f64(store / 1000.0);
            read_ahead.took(waited, Duration::from_millis(1) - waited);
        }
    }

    #[test]
    fn a_reader_that_keeps_waiting_doubles_the_depth_up_to_the_most() {
        let read_ahead = ReadAhead::new(true);
        windows(&read_ahead, 1, 0.6);
        assert_eq!(read_ahead.depth(), 2 * START);
        windows(&read_ahead, 10, 1.0);
        assert_eq!(read_ahead.depth(), MOST);
    }

    #[test]
    fn short_waits_change_nothing_and_quiet_windows_give_depth_back() {
        let read_ahead = ReadAhead::new(true);
        windows(&read_ahead, 3, 0.9);
        assert_eq!(read_ahead.depth(), 8 * START);
        windows(&read_ahead, QUIET * 2, 0.3);
        assert_eq!(read_ahead.depth(), 8 * START, "a store's share of 0.3 is neither behind nor quiet");
        windows(&read_ahead, QUIET - 1, 0.0);
        windows(&read_ahead, 1, 0.3);
        assert_eq!(read_ahead.depth(), 8 * START, "quiet windows count in a row");
        windows(&read_ahead, QUIET, 0.0);
        assert_eq!(read_ahead.depth(), 7 * START);
        windows(&read_ahead, QUIET * 30, 0.0);
        assert_eq!(read_ahead.depth(), START, "never below the start");
    }

    #[test]
    fn untuned_it_stays_at_the_start() {
        let read_ahead = ReadAhead::new(false);
        windows(&read_ahead, 10, 1.0);
        assert_eq!(read_ahead.depth(), START);
    }
}
