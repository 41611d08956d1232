//! The block shuffles against mirroring pixel by pixel, on a batch of ImageNet-sized images, in
//! the same run: alternating rounds, the median round of each.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{in_place_any, mirror_in_place};
use std::time::Instant;

const SIDE: usize = 224;
/// Images a round: 19 MB, like a batch of 128 (out of cache).
const IMAGES: usize = 128;
const ROUNDS: usize = 7;

/// Seconds to mirror every image of `data` with `mirror`.
fn round(data: &mut [u8], mirror: fn(&mut [u8], usize)) -> f64 {
    let started = Instant::now();
    data.chunks_exact_mut(SIDE * SIDE * 3).for_each(|one| mirror(one, SIDE));
    started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_mirror_blocks_against_pixels() {
    let mut data: Vec<u8> =
        (0..IMAGES * SIDE * SIDE * 3).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let (mut slow, mut fast) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        slow.push(round(&mut data, in_place_any));
        fast.push(round(&mut data, mirror_in_place));
    }
    let (slow, fast) = (median(slow), median(fast));
    let per = |s: f64| s / IMAGES as f64 * 1e6;
    println!(
        "mirror in place {SIDE}×{SIDE}: pixel by pixel {:.1} µs/image, blocks {:.1} µs/image: {:.2}× pixel by pixel",
        per(slow),
        per(fast),
        slow / fast
    );
}
