//! Each pass's vector kernel against the same pass byte by byte, in the same run, on an
//! ImageNet-sized crop at three scales, and the taps against the crate's form of them. As in the
//! resize, the passes read a window just decoded or just resampled and write a buffer reused
//! image after image: both stay in the caches, so one image is resampled again and again.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::{Horizontal, Kernels, Vertical};
use crate::benchmark::{IMAGES, SIDE, alternate, per_image, pixels};

/// The vector kernels this CPU runs, the widest first.
fn vector_kernels() -> impl Iterator<Item = Kernels> {
    [Kernels::Avx512, Kernels::Avx2].into_iter().filter(|&k| k <= Kernels::best())
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_resize_horizontal_vectors_against_pixels() {
    let source = pixels();
    for kernels in vector_kernels() {
        for width in [150, 300, 448] {
            let mut pass = Horizontal::default();
            pass.limit(kernels);
            pass.bilinear(width, 0.0, width as f64, SIDE);
            if pass.kernels() != kernels {
                println!("resize horizontal {width} → {SIDE}: out of {kernels:?}'s reach");
                continue;
            }
            let rows = vec![&source[..width * 3 * SIDE]; IMAGES];
            let out = std::cell::RefCell::new(vec![0u8; SIDE * SIDE * 3]);
            let taps = pass.taps().clone();
            let (slow, fast) = alternate(
                || {
                    let mut out = out.borrow_mut();
                    for image in &rows {
                        for (s, d) in image.chunks_exact(width * 3).zip(out.chunks_exact_mut(SIDE * 3)) {
                            taps.resample_row(s, d);
                        }
                    }
                },
                || rows.iter().for_each(|image| pass.run(image, &mut out.borrow_mut())),
            );
            println!(
                "resize horizontal {width} → {SIDE} ({SIDE} rows): pixel by pixel {:.1} µs/image, {kernels:?} {:.1} µs/image: {:.2}× pixel by pixel",
                per_image(slow),
                per_image(fast),
                slow / fast
            );
        }
    }
}

/// The taps of both axes for a batch of random crops, against the crate's form of them
/// ([`super::taps`]' reference: a push a weight and libm's rounding).
#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_resize_taps_against_the_crates_form() {
    use super::taps::{Taps, reference};
    // Crops of an image 448 pixels across after the DCT scaling: 150 to 448 pixels to 224.
    let boxes: Vec<(f64, f64)> = (0..IMAGES)
        .map(|i| {
            let start = (i * 37 % 97) as f64 * 0.73;
            (start, start + 150.0 + (i * 53 % 113) as f64 * 2.6)
        })
        .collect();
    let mut taps = Taps::default();
    let mut crates = Taps::default();
    let (slow, fast) = alternate(
        || {
            for &(a, b) in &boxes {
                for _axis in 0..2 {
                    reference::bilinear(&mut crates, 448, a, b, SIDE);
                }
            }
        },
        || {
            for &(a, b) in &boxes {
                for _axis in 0..2 {
                    taps.bilinear(448, a, b, SIDE);
                }
            }
        },
    );
    println!(
        "resize taps, both axes of a crop → {SIDE}: the crate's form {:.1} µs/image, ours {:.1} µs/image: {:.2}× the crate's form",
        per_image(slow),
        per_image(fast),
        slow / fast
    );
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_resize_vertical_vectors_against_bytes() {
    let source = pixels();
    // Crops that the DCT scaling left 224 to 300 rows high, their rows 240 pixels wide.
    let len = 240 * 3;
    for kernels in vector_kernels() {
        for height in [224, 256, 300] {
            let mut pass = Vertical::default();
            pass.limit(kernels);
            pass.bilinear(height, 0.0, height as f64, SIDE);
            let window = &source[..height * len];
            let out = std::cell::RefCell::new(vec![0u8; SIDE * len]);
            let taps = pass.taps().clone();
            let (slow, fast) = alternate(
                || {
                    for _ in 0..IMAGES / 8 {
                        std::hint::black_box(super::tests::vertical_reference(&taps, window, len, len));
                    }
                },
                || {
                    for _ in 0..IMAGES / 8 {
                        pass.run(window, len, len, &mut out.borrow_mut());
                    }
                },
            );
            println!(
                "resize vertical {height} → {SIDE} rows ({len} bytes each): byte by byte {:.1} µs/image, {kernels:?} {:.1} µs/image: {:.2}× byte by byte",
                per_image(slow) * 8.0,
                per_image(fast) * 8.0,
                slow / fast
            );
        }
    }
}
