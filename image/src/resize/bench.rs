//! The resize of a planned box (both passes by `granary_kernels`, with each vector kernel this
//! CPU runs) against `fast_image_resize` doing both passes, in the same run: crops of the sizes
//! the training recipe's windows have, to 224×224.
//! Run: `cargo nextest run --release -p granary-image --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{Job, limit_kernels, resize_box};
use crate::test_images::pattern;
use crate::{Edges, RgbView};
use granary_kernels::resize::Kernels;
use std::time::Instant;

/// Resizes per round, and rounds of each side.
const IMAGES: usize = 128;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_resize_box_against_the_crate() {
    for kernels in [Kernels::Avx512, Kernels::Avx2].into_iter().filter(|&k| k <= Kernels::best()) {
        limit_kernels(kernels);
        for side in [150, 300, 448] {
            let (height, width) = (side + 40, side + 60);
            let data = pattern(height, width);
            let src = RgbView { height, width, data: &data };
            let crop = [20.5, 10.25, side as f64, side as f64 - 0.5];
            let job = Job::of_box(src, crop, Edges::Box, 224, 224);
            let mut out = vec![0u8; 224 * 224 * 3];
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let started = Instant::now();
                for _ in 0..IMAGES {
                    job.with_crate(&mut out).unwrap();
                }
                theirs.push(started.elapsed().as_secs_f64());
                let started = Instant::now();
                for _ in 0..IMAGES {
                    resize_box(src, crop, Edges::Box, 224, 224, &mut out).unwrap();
                }
                ours.push(started.elapsed().as_secs_f64());
            }
            let (ours, theirs) = (median(ours), median(theirs));
            println!(
                "resize box {side}×{side} → 224×224: fast_image_resize {:.1} µs/image, {kernels:?} kernels {:.1} µs/image: {:.2}× the crate",
                theirs / IMAGES as f64 * 1e6,
                ours / IMAGES as f64 * 1e6,
                theirs / ours
            );
        }
    }
    limit_kernels(Kernels::best());
}
