//! The horizontal pass's vector kernel against the same pass pixel by pixel, in the same run,
//! on 224 rows of an ImageNet-sized crop at three scales. As in the resize, the pass reads what
//! the vertical pass just wrote and writes a buffer reused image after image: both stay in the
//! caches, so one image is resampled again and again.
//! Run: `cargo nextest run --release -p granary-kernels --run-ignored only -E 'test(bench_)' --no-capture`.

use super::Horizontal;
use crate::benchmark::{IMAGES, SIDE, alternate, per_image, pixels};

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_resize_horizontal_vectors_against_pixels() {
    let source = pixels();
    for width in [150, 300, 448] {
        let mut pass = Horizontal::default();
        pass.bilinear(width, 0.0, width as f64, SIDE);
        if !pass.vectors() {
            println!("resize horizontal {width} → {SIDE}: this CPU has no AVX-512 VBMI, nothing to compare");
            return;
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
            "resize horizontal {width} → {SIDE} ({SIDE} rows): pixel by pixel {:.1} µs/image, vectors {:.1} µs/image: {:.2}× pixel by pixel",
            per_image(slow),
            per_image(fast),
            slow / fast
        );
    }
}
