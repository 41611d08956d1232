//! A float32 ImageNet batch from its elements to the finished batch: stacked into a `uint8`
//! batch and then normalized, against left unstacked and normalized from the elements' buffers,
//! in alternating rounds of the same run.
//! Run: `cargo nextest run --release -p granary-worker --run-ignored only -E 'test(bench_)' --no-capture`.

use super::Finish;
use crate::batch::BatchBuilder;
use crate::element::{Element, Value};
use crate::tensor::{Tensor, TensorData};
use granary_kernels::normalize::Layout;
use std::time::{Duration, Instant};

const SIDE: usize = 224;
const IMAGES: usize = 128;
const ROUNDS: usize = 15;

/// A batch's elements, each image in its own buffer (as the compute threads leave them), with a
/// label.
fn elements(round: usize) -> Vec<Element> {
    (0..IMAGES)
        .map(|i| {
            let seed = round * IMAGES + i;
            let pixels =
                (0..SIDE * SIDE * 3).map(|p| (p.wrapping_mul(2654435761) >> 13) as u8 ^ seed as u8).collect();
            let mut e = Element::new(format!("{seed}"));
            e.set(
                "image",
                Value::Tensor(Tensor { shape: vec![SIDE, SIDE, 3], data: TensorData::U8(pixels) }),
            );
            e.set("label", Value::Tensor(Tensor::scalar_i64(i as i64)));
            e
        })
        .collect()
}

/// Time to stack `elements` (leaving `unstacked` so) and finish the batch.
fn timed(elements: Vec<Element>, unstacked: Option<&str>, finish: &Finish) -> Duration {
    let started = Instant::now();
    let mut builder = BatchBuilder::new(IMAGES).leaving_unstacked(unstacked.map(String::from));
    for e in elements {
        if let Err(why) = builder.push(e) {
            panic!("{why}");
        }
    }
    let mut batch = builder.finish(0, None);
    if let Err(why) = finish.apply(&mut batch) {
        panic!("{why}");
    }
    let took = started.elapsed();
    drop(batch);
    took
}

#[test]
#[ignore = "a benchmark: prints figures, asserts none"]
fn bench_finishing_from_the_elements_buffers_against_a_stacked_batch() {
    let finish = Finish::new("image", [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], Layout::Chw, 1);
    let (mut stacked, mut unstacked) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        stacked.push(timed(elements(round), None, &finish));
        unstacked.push(timed(elements(round), Some("image"), &finish));
    }
    stacked.sort();
    unstacked.sort();
    let per_image = |d: Duration| d.as_secs_f64() / IMAGES as f64 * 1e6;
    let (s, u) = (stacked[ROUNDS / 2], unstacked[ROUNDS / 2]);
    println!(
        "a float32 CHW batch of {IMAGES} {SIDE}×{SIDE} images, stacked and finished: {:.1} µs/image; \
         finished from the elements' buffers: {:.1} µs/image: {:.2}× the stacked path (medians of {ROUNDS} rounds)",
        per_image(s),
        per_image(u),
        s.as_secs_f64() / u.as_secs_f64()
    );
}
