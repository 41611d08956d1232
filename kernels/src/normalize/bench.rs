//! The arithmetic form against the tables, on a batch of ImageNet-sized images, in the same
//! run: alternating rounds, the median round of each.
//! Run: `cargo nextest run -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{Layout, Lut, lut, normalize_over};
use std::time::Instant;

const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];
const SIDE: usize = 224;
/// Images a round: 19 MB of `uint8` and 77 MB of `float32`, like a batch of 128 (out of cache).
const IMAGES: usize = 128;
const ROUNDS: usize = 7;

/// Seconds to write every image of `src` over `out` through `table`.
fn round(src: &[u8], out: &mut [f32], table: &Lut, layout: Layout) -> f64 {
    let image = SIDE * SIDE * 3;
    let started = Instant::now();
    for (one, values) in src.chunks_exact(image).zip(out.chunks_exact_mut(image)) {
        normalize_over(one, table, layout, values);
    }
    started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_normalize_arithmetic_against_tables() {
    let table = lut(MEAN, STD);
    if table.arithmetic().is_none() {
        println!("this CPU runs the tables only (no AVX2): nothing to compare");
        return;
    }
    let tables_only = Lut { affine: None, ..table.clone() };
    let src: Vec<u8> =
        (0..IMAGES * SIDE * SIDE * 3).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let mut out = vec![0.0f32; src.len()];
    for layout in [Layout::Chw, Layout::Hwc] {
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            slow.push(round(&src, &mut out, &tables_only, layout));
            fast.push(round(&src, &mut out, &table, layout));
        }
        let (fast, slow) = (median(fast), median(slow));
        let per = |s: f64| s / IMAGES as f64 * 1e6;
        println!(
            "normalize {layout:?} {SIDE}×{SIDE}: tables {:.1} µs/image, arithmetic {:.1} µs/image: {:.2}× the tables",
            per(slow),
            per(fast),
            slow / fast
        );
    }
}
