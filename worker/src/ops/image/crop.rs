//! `image.center_crop` and `image.random_resized_crop`, as torchvision does them.

pub use super::CropBox;
use super::{check_dimensions, resize_rgb, rgb_u8, rgb_value};
use crate::element::Element;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::image::{CenterCrop, RandomResizedCrop};

/// Crops a `size × size` square from the centre of an image, padding with zeros (black) where
/// the image is smaller than `size`, as torchvision's `CenterCrop` does.
#[derive(Clone, Debug)]
pub struct CenterCropOp {
    size: usize,
    field: String,
}

impl CenterCropOp {
    /// The operator for `config`.
    pub fn new(config: &CenterCrop) -> CenterCropOp {
        CenterCropOp { size: config.size as usize, field: config.field.clone() }
    }
}

/// Python's `int(round(x))`: rounds half to even.
fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

/// Where output index 0 of a centre crop of length `crop` falls in an axis of length `len`:
/// torchvision pads `(crop - len) // 2` zeros before when the crop is longer (so the offset is
/// negative), and otherwise starts at `round((len - crop) / 2)`.
fn center_offset(len: usize, crop: usize) -> i64 {
    if crop > len { -(((crop - len) / 2) as i64) } else { py_round((len - crop) as f64 / 2.0) }
}

/// Copies the `out_h × out_w` window of `src` (`h × w × 3`) whose top-left corner is at
/// (`top`, `left`), possibly negative or past the edge, filling what falls outside with zeros.
fn window(src: &[u8], h: usize, w: usize, top: i64, left: i64, out_h: usize, out_w: usize) -> Vec<u8> {
    let mut out = vec![0u8; out_h * out_w * 3];
    // Output columns [x0, x1) come from source columns [x0 + left, x1 + left).
    let x0 = (-left).clamp(0, out_w as i64) as usize;
    let x1 = (w as i64 - left).clamp(x0 as i64, out_w as i64) as usize;
    if x0 == x1 {
        return out;
    }
    let sx0 = (x0 as i64 + left) as usize;
    for (y, row) in out.chunks_exact_mut(out_w * 3).enumerate() {
        let sy = y as i64 + top;
        if sy < 0 || sy >= h as i64 {
            continue;
        }
        let start = (sy as usize * w + sx0) * 3;
        let len = (x1 - x0) * 3;
        row[x0 * 3..x0 * 3 + len].copy_from_slice(&src[start..start + len]);
    }
    out
}

impl Operator for CenterCropOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        const OP: &str = "image.center_crop";
        let src = rgb_u8(OP, element, &self.field)?;
        let (h, w, size) = (src.height, src.width, self.size);
        check_dimensions(OP, "the output image", size, size)?;
        if (h, w) == (size, size) {
            return Ok(());
        }
        let top = center_offset(h, size);
        let left = center_offset(w, size);
        let data = window(src.data, h, w, top, left, size, size);
        element.set(&self.field, rgb_value(size, size, data));
        Ok(())
    }
}

/// Crops a random box (area fraction in `scale`, aspect ratio log-uniform in `ratio`) and
/// resizes it to `size × size`, as torchvision's `RandomResizedCrop`.
#[derive(Clone, Debug)]
pub struct RandomResizedCropOp {
    size: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    field: String,
}

impl RandomResizedCropOp {
    /// The operator for `config`.
    pub fn new(config: &RandomResizedCrop) -> RandomResizedCropOp {
        RandomResizedCropOp {
            size: config.size as usize,
            scale: config.scale,
            ratio: config.ratio,
            field: config.field.clone(),
        }
    }
}

/// The crop box of torchvision's `RandomResizedCrop.get_params` for a `height × width` image,
/// drawing from `rng`: up to 10 attempts at a box whose area is a fraction
/// `uniform(scale[0], scale[1])` of the image's and whose aspect ratio (width / height) is
/// `exp(uniform(ln ratio[0], ln ratio[1]))`, placed uniformly at random; when none fits, the
/// central box of the whole image with its ratio clamped into `ratio`.
///
/// Each attempt draws two values, and a fitting one two more (top, then left), so the stream
/// advances by a variable amount. The box is always inside the image and at least 1×1 for a
/// non-empty image (torchvision could return an empty box in the fallback for absurd ratios).
pub fn rrc_params(
    height: usize,
    width: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut SeededRng,
) -> CropBox {
    let area = (height * width) as f64;
    let (log_lo, log_hi) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform_range(scale[0], scale[1]);
        let aspect = rng.uniform_range(log_lo, log_hi).exp();
        let w = py_round((target_area * aspect).sqrt());
        let h = py_round((target_area / aspect).sqrt());
        if 0 < w && w as usize <= width && 0 < h && h as usize <= height {
            let (h, w) = (h as usize, w as usize);
            let top = rng.below((height - h + 1) as u64) as usize;
            let left = rng.below((width - w + 1) as u64) as usize;
            return CropBox { top, left, height: h, width: w };
        }
    }
    // Fallback: central crop with the ratio clamped.
    let in_ratio = width as f64 / height as f64;
    let (min_ratio, max_ratio) = (ratio[0].min(ratio[1]), ratio[0].max(ratio[1]));
    let (h, w) = if in_ratio < min_ratio {
        (py_round(width as f64 / min_ratio).max(0) as usize, width)
    } else if in_ratio > max_ratio {
        (height, py_round(height as f64 * max_ratio).max(0) as usize)
    } else {
        (height, width)
    };
    let (h, w) = (h.clamp(1.min(height), height), w.clamp(1.min(width), width));
    CropBox { top: (height - h) / 2, left: (width - w) / 2, height: h, width: w }
}

impl Operator for RandomResizedCropOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        const OP: &str = "image.random_resized_crop";
        let src = rgb_u8(OP, element, &self.field)?;
        check_dimensions(OP, "the input image", src.height, src.width)?;
        let region = rrc_params(src.height, src.width, self.scale, self.ratio, rng);
        let data = resize_rgb(OP, src, Some(region), self.size, self.size)?;
        element.set(&self.field, rgb_value(self.size, self.size, data));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Value;
    use crate::ops::image::test_images::pattern;
    use crate::tensor::{Tensor, TensorData};

    const DEFAULT_SCALE: [f64; 2] = [0.08, 1.0];
    const DEFAULT_RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];

    fn rng(i: u64) -> SeededRng {
        SeededRng::for_element(42, 0, 1, i)
    }

    fn center_crop(size: u32, h: usize, w: usize, data: Vec<u8>) -> Tensor {
        let mut e = Element::new("k");
        e.set("image", rgb_value(h, w, data));
        CenterCropOp::new(&CenterCrop { size, field: "image".into() }).apply(&mut e, &mut rng(0)).unwrap();
        match e.take("image") {
            Some(Value::Tensor(t)) => t,
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    /// Pixel (y, x) of an `h × w` image, or zeros outside it.
    fn px(data: &[u8], h: usize, w: usize, y: i64, x: i64) -> [u8; 3] {
        if y < 0 || x < 0 || y >= h as i64 || x >= w as i64 {
            return [0; 3];
        }
        let i = (y as usize * w + x as usize) * 3;
        [data[i], data[i + 1], data[i + 2]]
    }

    #[test]
    fn center_crop_matches_manual_slicing() {
        // (h, w, size, expected top, expected left), torchvision's round-half-even anchors.
        for (h, w, size, top, left) in
            [(10, 14, 6, 2, 4), (9, 12, 6, 2, 3), (7, 8, 6, 0, 1), (11, 11, 8, 2, 2)]
        {
            let src = pattern(h, w);
            let t = center_crop(size as u32, h, w, src.clone());
            assert_eq!(t.shape, vec![size, size, 3]);
            let expected: Vec<u8> = (0..size)
                .flat_map(|y| {
                    let start = ((top + y) * w + left) * 3;
                    src[start..start + size * 3].to_vec()
                })
                .collect();
            assert_eq!(t.data, TensorData::U8(expected.into()), "{h}x{w} -> {size}");
        }
    }

    #[test]
    fn center_crop_pads_with_zeros_like_torchvision() {
        // Smaller on both sides: pad (size - len) // 2 before, the rest after.
        let (h, w, size) = (3usize, 4usize, 7usize);
        let src = pattern(h, w);
        let t = center_crop(size as u32, h, w, src.clone());
        let TensorData::U8(out) = &t.data else { panic!("not uint8") };
        let (pad_top, pad_left) = (2i64, 1i64);
        for y in 0..size {
            for x in 0..size {
                let got = px(out, size, size, y as i64, x as i64);
                assert_eq!(got, px(&src, h, w, y as i64 - pad_top, x as i64 - pad_left), "({y},{x})");
            }
        }
        // Smaller on one side only: pad rows, crop columns.
        let (h, w, size) = (4usize, 12usize, 7usize);
        let src = pattern(h, w);
        let t = center_crop(size as u32, h, w, src.clone());
        let TensorData::U8(out) = &t.data else { panic!("not uint8") };
        // rows: pad (7-4)//2 = 1 before; columns: round((12-7)/2) = round(2.5) = 2.
        for y in 0..size {
            for x in 0..size {
                let got = px(out, size, size, y as i64, x as i64);
                assert_eq!(got, px(&src, h, w, y as i64 - 1, x as i64 + 2), "({y},{x})");
            }
        }
    }

    #[test]
    fn center_crop_of_exact_size_is_identity() {
        let src = pattern(5, 5);
        assert_eq!(center_crop(5, 5, 5, src.clone()).data, TensorData::U8(src.into()));
    }

    #[test]
    fn center_crop_wrong_input_is_an_error() {
        let mut e = Element::new("k");
        e.set("image", Value::Text("no".into()));
        let op = CenterCropOp::new(&CenterCrop { size: 4, field: "image".into() });
        assert!(op.apply(&mut e, &mut rng(0)).is_err());
        let mut e = Element::new("k");
        assert!(op.apply(&mut e, &mut rng(0)).unwrap_err().0.contains("no field `image`"));
    }

    #[test]
    fn rrc_box_is_inside_and_reproducible() {
        for (i, (h, w)) in
            [(1, 1), (2, 3), (50, 80), (480, 640), (1000, 10), (7, 333)].into_iter().enumerate()
        {
            for j in 0..200 {
                let b = rrc_params(h, w, DEFAULT_SCALE, DEFAULT_RATIO, &mut rng((i * 1000 + j) as u64));
                assert!(b.height >= 1 && b.width >= 1, "{b:?}");
                assert!(b.top + b.height <= h && b.left + b.width <= w, "{h}x{w}: {b:?}");
                let again = rrc_params(h, w, DEFAULT_SCALE, DEFAULT_RATIO, &mut rng((i * 1000 + j) as u64));
                assert_eq!(b, again);
            }
        }
        // Different streams give different boxes (overwhelmingly).
        let boxes: std::collections::HashSet<_> = (0..50)
            .map(|i| rrc_params(480, 640, DEFAULT_SCALE, DEFAULT_RATIO, &mut rng(i)))
            .map(|b| (b.top, b.left, b.height, b.width))
            .collect();
        assert!(boxes.len() > 45);
    }

    #[test]
    fn rrc_distribution_is_sane() {
        // With scale [0.08, 1] a uniform area fraction would average (0.08 + 1) / 2 = 0.54,
        // but big boxes with a ratio away from 1 do not fit a square image and are drawn
        // again, which pulls the mean down to 0.478 (torchvision's get_params simulated 400k
        // times; the standard error of a 2000-draw mean is 0.005).
        let (h, w) = (1000usize, 1000usize);
        let mut sum = 0.0;
        let (mut sum_ratio_log, mut wide, mut tall) = (0.0, 0, 0);
        for i in 0..2000 {
            let b = rrc_params(h, w, DEFAULT_SCALE, DEFAULT_RATIO, &mut rng(i));
            sum += (b.height * b.width) as f64 / (h * w) as f64;
            let r = b.width as f64 / b.height as f64;
            sum_ratio_log += r.ln();
            assert!((0.74..=1.35).contains(&r), "ratio {r}");
            if r > 1.0 {
                wide += 1;
            } else if r < 1.0 {
                tall += 1;
            }
        }
        let mean = sum / 2000.0;
        assert!((0.458..0.498).contains(&mean), "mean area fraction {mean}");
        assert!((sum_ratio_log / 2000.0).abs() < 0.03, "mean log ratio {}", sum_ratio_log / 2000.0);
        assert!(wide > 800 && tall > 800, "wide {wide} tall {tall}");

        // A narrow scale range pins the area.
        for i in 0..200 {
            let b = rrc_params(h, w, [0.25, 0.25], [1.0, 1.0], &mut rng(i));
            assert_eq!((b.height, b.width), (500, 500));
        }
    }

    #[test]
    fn rrc_falls_back_to_a_clamped_central_crop() {
        // Ratio range far from a tall image's: every attempt's width exceeds the image, so the
        // fallback takes the whole width and height = round(width / min ratio), centred.
        let b = rrc_params(100, 10, [0.9, 1.0], [4.0, 5.0], &mut rng(3));
        assert_eq!(b, CropBox { top: 49, left: 0, height: 2, width: 10 }); // round(10/4) = round(2.5) = 2
        // Wide image, ratios below its own: full height, width = round(height * max ratio).
        let b = rrc_params(10, 100, [0.9, 1.0], [0.5, 0.8], &mut rng(4));
        assert_eq!(b, CropBox { top: 0, left: 46, height: 10, width: 8 });
        // In-range ratio but the area can never fit (scale > 1 is invalid for specs, but the
        // function stays total): the whole image.
        let b = rrc_params(20, 20, [1.5, 2.0], [1.0, 1.0], &mut rng(5));
        assert_eq!(b, CropBox { top: 0, left: 0, height: 20, width: 20 });
        // Absurd ratio on a 1-pixel-wide image: still a non-empty box.
        let b = rrc_params(1, 1, [0.08, 1.0], [50.0, 60.0], &mut rng(6));
        assert_eq!(b, CropBox { top: 0, left: 0, height: 1, width: 1 });
    }

    fn rrc(size: u32, h: usize, w: usize, data: Vec<u8>, seed: u64) -> Tensor {
        let mut e = Element::new("k");
        e.set("image", rgb_value(h, w, data));
        let config =
            RandomResizedCrop { size, scale: DEFAULT_SCALE, ratio: DEFAULT_RATIO, field: "image".into() };
        RandomResizedCropOp::new(&config).apply(&mut e, &mut rng(seed)).unwrap();
        match e.take("image") {
            Some(Value::Tensor(t)) => t,
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    #[test]
    fn rrc_output_shape_and_determinism() {
        for seed in 0..20 {
            let t = rrc(24, 40, 60, pattern(40, 60), seed);
            assert_eq!(t.shape, vec![24, 24, 3]);
            assert_eq!(t.len(), 24 * 24 * 3);
            assert_eq!(t, rrc(24, 40, 60, pattern(40, 60), seed));
        }
        // Tiny input, upscaled.
        assert_eq!(rrc(16, 1, 1, vec![9, 8, 7], 0).data, TensorData::U8([9, 8, 7].repeat(256).into()));
    }

    #[test]
    fn rrc_equals_crop_then_resize() {
        // Resizing the box in place must equal copying the box out and resizing the copy
        // (torchvision's crop-then-resize: the filter never reads outside the box).
        let (h, w, size) = (40usize, 60usize, 24usize);
        let src = pattern(h, w);
        for seed in 0..10 {
            let b = rrc_params(h, w, DEFAULT_SCALE, DEFAULT_RATIO, &mut rng(seed));
            let crop = window(&src, h, w, b.top as i64, b.left as i64, b.height, b.width);
            let view = super::super::RgbView { height: b.height, width: b.width, data: &crop };
            let expected = resize_rgb("test", view, None, size, size).unwrap();
            assert_eq!(
                rrc(size as u32, h, w, src.clone(), seed).data,
                TensorData::U8(expected.into()),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn rrc_wrong_input_is_an_error() {
        let mut e = Element::new("k");
        e.set("image", Value::Bytes(bytes::Bytes::from_static(b"\xff\xd8\xff")));
        let config =
            RandomResizedCrop { size: 8, scale: DEFAULT_SCALE, ratio: DEFAULT_RATIO, field: "image".into() };
        let err = RandomResizedCropOp::new(&config).apply(&mut e, &mut rng(0)).unwrap_err();
        assert!(err.0.contains("add `image.decode` before it"), "{err}");
    }
}
