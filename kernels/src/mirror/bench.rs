//! The block shuffles against mirroring pixel by pixel, on a batch of ImageNet-sized images, in
//! the same run.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{in_place_any, mirror_in_place};
use crate::benchmark::{SIDE, alternate, per_image, pixels};

/// Mirrors every image of `data` with `mirror`.
fn round(data: &mut [u8], mirror: fn(&mut [u8], usize)) {
    data.chunks_exact_mut(SIDE * SIDE * 3).for_each(|one| mirror(one, SIDE));
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_mirror_blocks_against_pixels() {
    let data = std::cell::RefCell::new(pixels());
    let (slow, fast) = alternate(
        || round(&mut data.borrow_mut(), in_place_any),
        || round(&mut data.borrow_mut(), mirror_in_place),
    );
    println!(
        "mirror in place {SIDE}×{SIDE}: pixel by pixel {:.1} µs/image, blocks {:.1} µs/image: {:.2}× pixel by pixel",
        per_image(slow),
        per_image(fast),
        slow / fast
    );
}
