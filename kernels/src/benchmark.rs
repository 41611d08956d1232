//! What the kernels' benchmarks share: a batch of ImageNet-sized images (128 of 224×224, 19 MB
//! of `uint8`, out of the caches like a real batch) and alternating timed rounds, the median
//! round of each side.

use std::time::Instant;

/// Side of each image.
pub const SIDE: usize = 224;
/// Images in the batch.
pub const IMAGES: usize = 128;
/// Rounds of each side.
const ROUNDS: usize = 7;

/// The batch's `uint8` RGB pixels, pseudo-random.
pub fn pixels() -> Vec<u8> {
    (0..IMAGES * SIDE * SIDE * 3).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// Median seconds of `slow` and of `fast` over alternating rounds.
pub fn alternate(mut slow: impl FnMut(), mut fast: impl FnMut()) -> (f64, f64) {
    let (mut slow_s, mut fast_s) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        slow_s.push(timed(&mut slow));
        fast_s.push(timed(&mut fast));
    }
    (median(slow_s), median(fast_s))
}

/// Microseconds per image of a round that took `seconds`.
pub fn per_image(seconds: f64) -> f64 {
    seconds / IMAGES as f64 * 1e6
}

fn timed(f: &mut impl FnMut()) -> f64 {
    let started = Instant::now();
    f();
    started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
