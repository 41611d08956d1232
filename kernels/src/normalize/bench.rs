//! The arithmetic form against the tables, and each form's stores through the caches against
//! streaming, on a batch of ImageNet-sized images (77 MB of `float32` written a round), in the
//! same run.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{Layout, Lut, Stores, lut, normalize_over};
use crate::benchmark::{SIDE, alternate, per_image, pixels};

const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Writes every image of `src` over `out` through `table`.
fn round(src: &[u8], out: &mut [f32], table: &Lut, layout: Layout, stores: Stores) {
    let image = SIDE * SIDE * 3;
    for (one, values) in src.chunks_exact(image).zip(out.chunks_exact_mut(image)) {
        normalize_over(one, table, layout, stores, values);
    }
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
    let src = pixels();
    let out = std::cell::RefCell::new(vec![0.0f32; src.len()]);
    for layout in [Layout::Chw, Layout::Hwc] {
        let (slow, fast) = alternate(
            || round(&src, &mut out.borrow_mut(), &tables_only, layout, Stores::Cached),
            || round(&src, &mut out.borrow_mut(), &table, layout, Stores::Cached),
        );
        println!(
            "normalize {layout:?} {SIDE}×{SIDE}: tables {:.1} µs/image, arithmetic {:.1} µs/image: {:.2}× the tables",
            per_image(slow),
            per_image(fast),
            slow / fast
        );
    }
    for layout in [Layout::Chw, Layout::Hwc] {
        let (cached, streaming) = alternate(
            || round(&src, &mut out.borrow_mut(), &table, layout, Stores::Cached),
            || round(&src, &mut out.borrow_mut(), &table, layout, Stores::Streaming),
        );
        println!(
            "normalize {layout:?} {SIDE}×{SIDE}, a 77 MB batch: through the caches {:.1} µs/image, streaming {:.1} µs/image: {:.2}× through the caches",
            per_image(cached),
            per_image(streaming),
            cached / streaming
        );
    }
}
