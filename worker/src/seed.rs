//! Seeded randomness: one independent stream per (seed, epoch, split) and per element, so that
//! re-running a split gives the same output on any thread count.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// SplitMix64 finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Derives a 64-bit stream seed from a pipeline seed and a path of indices.
pub fn derive(seed: u64, path: &[u64]) -> u64 {
    path.iter().fold(mix(seed ^ 0x0067_7261_6e61_7279), |acc, &p| {
        mix(acc ^ mix(p.wrapping_add(0x9e37_79b9_7f4a_7c15)))
    })
}

/// Purposes of the streams, so that no two uses share one.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Stream {
    /// Order of splits within an epoch.
    SplitOrder = 1,
    /// Shuffle buffer of one split.
    Shuffle = 2,
    /// Augmentations of one element.
    Element = 3,
    /// A batched stage's call on a group of consecutive elements.
    Group = 4,
    /// The stages after `text.pack` on one packed row.
    Row = 5,
}

/// A seeded random number generator with the few draws the operators need.
pub struct SeededRng(ChaCha8Rng);

impl SeededRng {
    /// The stream for `purpose` at `path` under `seed`.
    pub fn new(seed: u64, purpose: Stream, path: &[u64]) -> SeededRng {
        let mut full = Vec::with_capacity(path.len() + 1);
        full.push(purpose as u64);
        full.extend_from_slice(path);
        SeededRng(ChaCha8Rng::seed_from_u64(derive(seed, &full)))
    }

    /// The augmentation stream of element `index` of `split` in `epoch`.
    pub fn for_element(seed: u64, epoch: u64, split: u64, index: u64) -> SeededRng {
        SeededRng::new(seed, Stream::Element, &[epoch, split, index])
    }

    /// A uniform 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`, 53 bits of precision.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform_range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in `[0, n)`; `n` must be > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift with rejection: unbiased.
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = (self.next_u64() as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| SeededRng::for_element(7, 0, 3, 9).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let b = SeededRng::for_element(7, 1, 3, 9).next_u64();
        let c = SeededRng::for_element(7, 0, 4, 9).next_u64();
        let d = SeededRng::new(7, Stream::Shuffle, &[0, 3, 9]).next_u64();
        assert!(a[0] != b && a[0] != c && b != c && d != a[0]);
    }

    #[test]
    fn below_stays_in_range_and_shuffle_permutes() {
        let mut rng = SeededRng::new(1, Stream::Shuffle, &[]);
        assert!((0..1000).all(|_| rng.below(7) < 7));
        let mut v: Vec<u32> = (0..100).collect();
        rng.shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }
}
