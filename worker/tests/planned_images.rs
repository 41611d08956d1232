//! A fused image operator's plan, executed on its own (`granary_image::PlannedImage`, as a
//! process other than the worker would run it), gives the bytes the operator outputs: the plan
//! holds every decision (the crop box, the DCT scale and window, the placement, the flip), drawn
//! from the element's stream as the operator draws them.

use granary_crds::{OpConfig, StageSpec};
use granary_worker::element::{Element, Value};
use granary_worker::ops::Operator;
use granary_worker::ops::image::fused::{FusedCropOp, ImagePath, Planned};
use granary_worker::ops::image::fused_resize::FusedResizeOp;
use granary_worker::seed::SeededRng;
use granary_worker::tensor::TensorData;

fn configs(yaml: &str) -> Vec<OpConfig> {
    let stages: Vec<StageSpec> = serde_norway::from_str(yaml).unwrap();
    stages.iter().enumerate().map(|(i, s)| OpConfig::parse(s, &format!("s[{i}]")).unwrap()).collect()
}

/// A `w × h` JPEG with gradients and texture, so that a wrong crop, scale or flip shows.
fn jpeg(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let t = (x * 7 + y * 13 + seed) % 64;
        image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, (t * 3 + (x ^ y) % 61) as u8])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode_image(&img).unwrap();
    out
}

/// Sizes that take every DCT scale of a 32-pixel output, a crop smaller than the output, and
/// (for the centre crop) padding.
const SIZES: [(u32, u32); 6] = [(20, 24), (40, 31), (97, 64), (160, 200), (300, 260), (700, 520)];

fn element(bytes: &[u8]) -> Element {
    let mut e = Element::new("k");
    e.set("image", Value::Bytes(bytes::Bytes::copy_from_slice(bytes)));
    e
}

fn output(e: &Element) -> Vec<u8> {
    match e.get("image") {
        Some(Value::Tensor(t)) => match &t.data {
            TensorData::U8(data) => data.to_vec(),
            other => panic!("not uint8: {other:?}"),
        },
        other => panic!("no image tensor: {other:?}"),
    }
}

#[test]
fn a_random_resized_crop_plan_gives_the_operators_bytes() {
    let op = FusedCropOp::fuse(
        &configs("[{op: image.decode}, {op: image.random_resized_crop, size: 32}, {op: image.flip}]"),
        ImagePath::Fused,
    )
    .unwrap()
    .0;
    let (mut flips, mut scales) = (0, std::collections::BTreeSet::new());
    for (i, (w, h)) in SIZES.into_iter().enumerate() {
        let bytes = jpeg(w, h, i as u32);
        for index in 0..8 {
            let mut computed = element(&bytes);
            op.apply(&mut computed, &mut SeededRng::for_element(1, 2, index, 7)).unwrap();
            let mut rng = SeededRng::for_element(1, 2, index, 7);
            let Planned::Image(plan) = op.plan(&bytes, &mut rng, true).unwrap() else {
                panic!("not planned")
            };
            let mut out = vec![0; plan.output_len()];
            plan.execute(&bytes, &mut out).unwrap();
            assert_eq!(out, output(&computed), "{w}×{h}, element {index}");
            flips += usize::from(plan.flip);
            scales.insert(plan.window.num);
        }
    }
    assert!(flips > 0 && flips < SIZES.len() * 8, "both flips drawn: {flips}");
    assert!(scales.len() >= 3, "several DCT scales: {scales:?}");
}

#[test]
fn a_resize_and_centre_crop_plan_gives_the_operators_bytes_padding_included() {
    let op = FusedResizeOp::fuse(
        &configs("[{op: image.decode}, {op: image.resize, size: 36}, {op: image.center_crop, size: 32}, {op: image.flip}]"),
        ImagePath::Fused,
    )
    .unwrap()
    .0;
    let padded = FusedResizeOp::fuse(
        &configs("[{op: image.decode}, {op: image.center_crop, size: 48}]"),
        ImagePath::Fused,
    )
    .unwrap()
    .0;
    for (i, (w, h)) in SIZES.into_iter().enumerate() {
        let bytes = jpeg(w, h, i as u32);
        for (op, name) in [(&op, "resize 36, crop 32, flip"), (&padded, "crop 48")] {
            for index in 0..4 {
                let mut computed = element(&bytes);
                op.apply(&mut computed, &mut SeededRng::for_element(0, 5, index, 3)).unwrap();
                let mut rng = SeededRng::for_element(0, 5, index, 3);
                let Planned::Image(plan) = op.plan(&bytes, &mut rng).unwrap() else { panic!("not planned") };
                let mut out = vec![0; plan.output_len()];
                plan.execute(&bytes, &mut out).unwrap();
                assert_eq!(out, output(&computed), "{name}: {w}×{h}, element {index}");
            }
        }
    }
}

#[test]
fn other_images_are_not_planned_and_a_size_filter_drops_from_the_header() {
    let op = FusedCropOp::fuse(
        &configs(
            "[{op: image.decode}, {op: filter, predicate: image.min_size, minWidth: 100}, {op: image.random_resized_crop, size: 32}]",
        ),
        ImagePath::Fused,
    )
    .unwrap()
    .0;
    let mut rng = SeededRng::for_element(0, 0, 0, 0);
    assert_eq!(op.plan(&jpeg(60, 60, 0), &mut rng, true).unwrap(), Planned::Dropped);
    assert!(matches!(op.plan(&jpeg(160, 60, 0), &mut rng, true).unwrap(), Planned::Image(_)));
    let mut png = Vec::new();
    image::RgbImage::new(8, 8)
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    assert_eq!(op.plan(&png, &mut rng, true).unwrap(), Planned::Unplannable, "a PNG is decoded whole");
    assert!(op.plan(b"\xff\xd8\xffgarbage", &mut rng, true).is_err());
}
