//! How much a consumer's queue holds before its job counts as backed up.
//!
//! A count of parts alone fits one size of batch only: four parts of 600 KB images hold a good
//! second of a trainer's reading, four parts of 24 KB thumbnails hold 10 ms, and a trainer whose
//! reads are late by more than that (its process is descheduled on a busy machine) finds its
//! queue empty while the worker, backed up on the few parts it holds, leases nothing. So a queue
//! backs up once it holds at least [`Capacity::min_parts`] parts *and* either
//! [`Capacity::bytes`] of payload or [`Capacity::max_parts`] parts: small parts queue up to a
//! byte allowance, large ones stop at the minimum count.

/// When a consumer's queue counts as backed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Parts a queue always holds before it backs up, however large.
    pub min_parts: usize,
    /// Parts at which a queue backs up, however small (at least `min_parts`).
    pub max_parts: usize,
    /// Payload bytes at which a queue holding `min_parts` backs up.
    pub bytes: usize,
}

impl Default for Capacity {
    /// 4 parts, or up to 64 while they hold under 1 MiB: the queues of a thousand consumers
    /// that ask for data and never read hold 1 GiB at most when parts are small, and large parts
    /// are held 4 deep as before.
    fn default() -> Self {
        Capacity { min_parts: 4, max_parts: 64, bytes: 1 << 20 }
    }
}

impl Capacity {
    /// Backed up at exactly `n` parts (at least 1), whatever their size.
    pub fn parts(n: usize) -> Capacity {
        let n = n.max(1);
        Capacity { min_parts: n, max_parts: n, bytes: 0 }
    }

    /// The same, with `max_parts` at least `min_parts` and both at least 1.
    pub fn normalized(self) -> Capacity {
        let min_parts = self.min_parts.max(1);
        Capacity { min_parts, max_parts: self.max_parts.max(min_parts), bytes: self.bytes }
    }

    /// Whether a queue holding `parts` parts of `bytes` payload bytes is backed up.
    pub fn full(&self, parts: usize, bytes: usize) -> bool {
        parts >= self.min_parts && (bytes >= self.bytes || parts >= self.max_parts)
    }

    /// The parts a queue holding `parts` parts of `bytes` bytes backs up at, for parts of the
    /// size it holds now (`min_parts` when it holds none, `max_parts` for empty parts): what the
    /// metrics call its capacity.
    pub fn parts_for(&self, parts: usize, bytes: usize) -> usize {
        if parts == 0 {
            return self.min_parts;
        }
        if bytes == 0 {
            return if self.bytes == 0 { self.min_parts } else { self.max_parts };
        }
        let per_part = bytes.div_ceil(parts);
        self.bytes.div_ceil(per_part).clamp(self.min_parts, self.max_parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_fill_to_the_byte_allowance_and_large_ones_to_the_minimum() {
        let c = Capacity { min_parts: 4, max_parts: 64, bytes: 1 << 20 };
        let small = 24 << 10;
        assert!(!c.full(4, 4 * small), "4 thumbnails' batches are 96 KiB, not backed up");
        assert!(c.full(43, 43 * small), "43 of them reach 1 MiB");
        assert_eq!(c.parts_for(4, 4 * small), 43);
        let large = 19 << 20;
        assert!(!c.full(3, 3 * large), "under the minimum count, however large");
        assert!(c.full(4, 4 * large));
        assert_eq!(c.parts_for(1, large), 4);
        assert!(c.full(64, 64), "tiny parts stop at the maximum count");
        assert_eq!(c.parts_for(1, 1), 64);
        assert_eq!(c.parts_for(0, 0), 4, "an empty queue counts its minimum");
    }

    #[test]
    fn a_count_of_parts_ignores_their_size() {
        let c = Capacity::parts(2);
        assert!(!c.full(1, usize::MAX));
        assert!(c.full(2, 0));
        assert_eq!(c.parts_for(0, 0), 2);
        assert_eq!(c.parts_for(5, 10), 2);
        assert_eq!(Capacity::parts(0), Capacity::parts(1));
        let odd = Capacity { min_parts: 0, max_parts: 0, bytes: 7 }.normalized();
        assert_eq!((odd.min_parts, odd.max_parts), (1, 1));
    }
}
