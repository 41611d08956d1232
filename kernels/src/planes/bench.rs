//! The block shuffles against the pixel-by-pixel split (one plane at a time, as the `float32`
//! tables' layout pass does), on a batch of ImageNet-sized images, in the same run.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::planes_into;
use crate::benchmark::{SIDE, alternate, per_image, pixels};
use crate::normalize::planar;

/// Splits every image of `data` into `out` with `split`, mirrored when `flip` is set.
fn round(data: &[u8], flip: bool, out: &mut Vec<u8>, split: fn(&[u8], usize, bool, &mut Vec<u8>)) {
    out.clear();
    data.chunks_exact(SIDE * SIDE * 3).for_each(|one| split(one, SIDE, flip, out));
}

fn pixel_by_pixel(src: &[u8], width: usize, flip: bool, out: &mut Vec<u8>) {
    planar(src, width, flip, |x| x, |x| x, |x| x, out);
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_planes_blocks_against_pixels() {
    let data = pixels();
    let out = std::cell::RefCell::new(Vec::with_capacity(data.len()));
    for flip in [false, true] {
        let (slow, fast) = alternate(
            || round(&data, flip, &mut out.borrow_mut(), pixel_by_pixel),
            || round(&data, flip, &mut out.borrow_mut(), planes_into),
        );
        println!(
            "uint8 CHW {SIDE}×{SIDE} (flip {flip}): pixel by pixel {:.1} µs/image, blocks {:.1} µs/image: {:.2}× pixel by pixel",
            per_image(slow),
            per_image(fast),
            slow / fast
        );
    }
}
