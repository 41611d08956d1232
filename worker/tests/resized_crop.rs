//! The fast image path against torchvision: for each checked-in fixture (a JPEG and a crop
//! box), the fused decode-and-crop output must be within a mean absolute error of 2 levels of
//! torchvision v2 `resized_crop` (bilinear, antialias=True) applied to a full decode.
//! `fixtures/resized_crop/generate.py` made the fixtures.

use granary_image::{CropBox, resized_crop};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/resized_crop")
}

#[test]
fn fast_path_matches_torchvision_resized_crop() {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir().join("cases.json")).unwrap()).unwrap();
    let cases = meta["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "at least 20 fixtures, found {}", cases.len());
    let mut scales = BTreeSet::new();
    let mut worst = 0.0f64;
    for case in cases {
        let field = |k: &str| case[k].as_u64().unwrap() as usize;
        let name = case["image"].as_str().unwrap();
        let jpeg = std::fs::read(dir().join(name)).unwrap();
        let expected = image::open(dir().join(case["expected"].as_str().unwrap())).unwrap().into_rgb8();
        let size = field("size");
        assert_eq!((expected.width() as usize, expected.height() as usize), (size, size));
        let region = CropBox {
            top: field("top"),
            left: field("left"),
            height: field("height"),
            width: field("width"),
        };
        let (got, num) = resized_crop(&jpeg, region, size).unwrap();
        scales.insert(num);
        let expected = expected.into_raw();
        assert_eq!(got.len(), expected.len());
        let mae =
            got.iter().zip(&expected).map(|(a, b)| f64::from(a.abs_diff(*b))).sum::<f64>() / got.len() as f64;
        eprintln!("{name}: crop {}×{} → {size}, scale {num}/8, MAE {mae:.3}", region.width, region.height);
        assert!(mae <= 2.0, "{name}: mean absolute error {mae:.3} > 2 against torchvision");
        worst = worst.max(mae);
    }
    eprintln!("worst MAE {worst:.3}; DCT scales used: {scales:?}");
    // The fixtures exercise the DCT-scaled decodes, not just full-size windows.
    assert!(scales.contains(&8) && scales.contains(&4) && scales.contains(&2), "{scales:?}");
}
