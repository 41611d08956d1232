//! How many complete batches the client assembles ahead of the trainer, tuned while it runs.
//!
//! The client handles its worker streams' messages only while it holds fewer complete batches
//! than this depth, and its heartbeats ask the dispatcher for data only below it. A fixed depth
//! covers a producer with a steady pace. One whose pace comes in bursts (a store's slow spell, a
//! worker restarted or its cores taken, splits of uneven cost) empties it, and the trainer waits
//! though the workers keep up on average.
//!
//! As tf.data's prefetch autotuner does, the depth doubles when the trainer finds no batch ready
//! after the buffer was full since the last change: a burst took what the buffer held, and a
//! deeper one would have covered more of it. A producer slower than the trainer throughout never
//! fills the buffer, so the depth stays: batches held ahead of such a trainer would only be
//! memory. The depth never goes below [`START`] (the fixed depth before it was tuned), and it
//! deepens only within a memory budget ([`crate::ClientOptions::prefetch_bytes`]) over the
//! largest batch delivered so far, and to [`MOST`] batches at most. A budget of 0 keeps it at
//! [`START`].
//!
//! The batches and their order do not depend on the depth: it changes only how far ahead the
//! client reads.

/// Complete batches held ahead when the client starts, and the fewest it holds ahead.
pub(crate) const START: u32 = 4;

/// The most complete batches held ahead, whatever the budget.
pub(crate) const MOST: u32 = 64;

/// The memory budget when the options name none: 1 GiB, 13 batches of 128 float32 ImageNet
/// images at 224×224 (77 MB each).
pub const DEFAULT_PREFETCH_BYTES: u64 = 1 << 30;

/// The tuned depth.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prefetch {
    depth: u32,
    budget: u64,
    /// Bytes of the largest batch delivered so far (0 before the first).
    largest: u64,
    /// The buffer held `depth` batches since the depth last changed.
    filled: bool,
}

impl Prefetch {
    /// A depth of [`START`], tuned within `budget` bytes (0: not tuned).
    pub(crate) fn new(budget: u64) -> Prefetch {
        Prefetch { depth: START, budget, largest: 0, filled: false }
    }

    /// Complete batches to hold ahead of the trainer now.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The deepest the budget allows for batches the size of the largest so far; [`START`]
    /// before any batch was delivered, as nothing says yet what a batch holds.
    fn most(&self) -> u32 {
        if self.largest == 0 {
            return START;
        }
        let batches = u32::try_from(self.budget / self.largest).unwrap_or(u32::MAX);
        batches.clamp(START, MOST)
    }

    /// The trainer asked for a batch with `ready` complete batches ahead of it, before any
    /// wait. Returns the new depth when it changed.
    pub(crate) fn asked(&mut self, ready: usize) -> Option<u32> {
        if self.budget == 0 {
            return None;
        }
        if ready >= self.depth as usize {
            self.filled = true;
            return None;
        }
        if ready > 0 || !self.filled {
            return None;
        }
        self.filled = false;
        let deeper = self.depth.saturating_mul(2).min(self.most());
        if deeper <= self.depth {
            return None;
        }
        tracing::debug!(
            depth = deeper,
            "the trainer emptied a full prefetch buffer; holding more batches ahead"
        );
        self.depth = deeper;
        Some(deeper)
    }

    /// A batch of `bytes` was delivered. A larger batch than before can lower the most the
    /// budget allows, and with it the depth; returns the new depth when it changed.
    pub(crate) fn delivered(&mut self, bytes: u64) -> Option<u32> {
        if bytes <= self.largest {
            return None;
        }
        self.largest = bytes;
        let most = self.most();
        if self.depth <= most {
            return None;
        }
        self.depth = most;
        Some(most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BATCH: u64 = 100 << 20;

    /// A prefetch that knows its batches: 100 MiB each, in a budget of `batches` of them.
    fn sized(batches: u64) -> Prefetch {
        let mut prefetch = Prefetch::new(batches * BATCH);
        assert_eq!(prefetch.delivered(BATCH), None, "4 batches fit every budget used here");
        prefetch
    }

    /// `times` bursts: the trainer finds the buffer full at its depth, then empty.
    fn fill_and_empty(prefetch: &mut Prefetch, times: usize) {
        for _ in 0..times {
            prefetch.asked(prefetch.depth() as usize);
            prefetch.asked(0);
        }
    }

    #[test]
    fn a_full_buffer_that_the_trainer_empties_doubles_the_depth() {
        let mut prefetch = sized(100);
        assert_eq!(prefetch.asked(4), None, "full");
        assert_eq!(prefetch.asked(2), None);
        assert_eq!(prefetch.asked(0), Some(8), "emptied after it was full");
        assert_eq!(prefetch.asked(0), None, "not full since the change");
        assert_eq!(prefetch.asked(7), None);
        assert_eq!(prefetch.asked(0), None);
        assert_eq!(prefetch.asked(8), None, "full at the new depth");
        assert_eq!(prefetch.asked(0), Some(16));
        assert_eq!(prefetch.depth(), 16);
    }

    #[test]
    fn a_producer_slower_than_the_trainer_leaves_the_depth() {
        let mut prefetch = sized(100);
        for ready in [0, 1, 0, 3, 0, 2, 0, 0, 1, 3] {
            assert_eq!(prefetch.asked(ready), None);
        }
        assert_eq!(prefetch.depth(), START);
    }

    #[test]
    fn the_depth_stays_within_the_budget_and_the_most() {
        let mut prefetch = sized(10);
        fill_and_empty(&mut prefetch, 10);
        assert_eq!(prefetch.depth(), 10, "8, then the budget's 10, not 16");

        let mut prefetch = Prefetch::new(u64::MAX);
        prefetch.delivered(1);
        fill_and_empty(&mut prefetch, 20);
        assert_eq!(prefetch.depth(), MOST);
    }

    #[test]
    fn nothing_deepens_before_a_batch_says_its_size_or_without_a_budget() {
        let mut prefetch = Prefetch::new(DEFAULT_PREFETCH_BYTES);
        assert_eq!((prefetch.asked(4), prefetch.asked(0)), (None, None));
        let mut prefetch = Prefetch::new(0);
        prefetch.delivered(1);
        assert_eq!((prefetch.asked(4), prefetch.asked(0)), (None, None));
        assert_eq!(prefetch.depth(), START);
    }

    #[test]
    fn a_larger_batch_brings_the_depth_back_within_the_budget_never_below_the_start() {
        let mut prefetch = sized(16);
        fill_and_empty(&mut prefetch, 3);
        assert_eq!(prefetch.depth(), 16);
        assert_eq!(prefetch.delivered(BATCH / 2), None, "smaller: the depth stays");
        assert_eq!(prefetch.delivered(2 * BATCH), Some(8));
        assert_eq!(prefetch.delivered(16 * BATCH), Some(START), "never below the start");
        assert_eq!(prefetch.delivered(32 * BATCH), None);
    }
}
