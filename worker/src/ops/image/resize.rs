//! `image.resize`: shorter side to `size`, aspect ratio kept (torchvision `Resize(int)`).

use super::{resize_rgb, rgb_u8, rgb_value};
use crate::element::Element;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::image::Resize;

const OP: &str = "image.resize";

/// Resizes an image so that its shorter side is `size` pixels (bilinear, antialiased when
/// shrinking).
#[derive(Clone, Debug)]
pub struct ResizeOp {
    size: usize,
    field: String,
}

impl ResizeOp {
    /// The operator for `config`.
    pub fn new(config: &Resize) -> ResizeOp {
        ResizeOp { size: config.size as usize, field: config.field.clone() }
    }
}

/// Output `(height, width)` of resizing a `height × width` image so that its shorter side is
/// `size`, exactly as torchvision's `_compute_resized_output_size`: the longer side becomes
/// `int(size * long / short)` (truncated). A square image becomes `size × size`.
pub fn resized_size(height: usize, width: usize, size: usize) -> (usize, usize) {
    let (short, long) = if width <= height { (width, height) } else { (height, width) };
    if short == 0 {
        return (0, 0);
    }
    // Exact integer floor; the same as Python's `int(size * long / short)` for all sizes
    // up to 2^26 (the float quotient is never within an ulp of an integer it is not).
    let new_long = ((size as u128 * long as u128) / short as u128).min(usize::MAX as u128) as usize;
    if width <= height { (new_long, size) } else { (size, new_long) }
}

impl Operator for ResizeOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let src = rgb_u8(OP, element, &self.field)?;
        let (out_h, out_w) = resized_size(src.height, src.width, self.size);
        if (out_h, out_w) == (src.height, src.width) {
            return Ok(());
        }
        let data = resize_rgb(OP, src, None, out_h, out_w)?;
        element.set(&self.field, rgb_value(out_h, out_w, data));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Value;
    use crate::ops::image::test_images::pattern;
    use crate::tensor::{Tensor, TensorData};

    fn run(size: u32, h: usize, w: usize, data: Vec<u8>) -> Result<Tensor, OpError> {
        let mut e = Element::new("k");
        e.set("img", rgb_value(h, w, data));
        let op = ResizeOp::new(&Resize { size, field: "img".into() });
        op.apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0))?;
        match e.take("img") {
            Some(Value::Tensor(t)) => Ok(t),
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    #[test]
    fn output_size_follows_torchvision() {
        // Landscape, portrait, square, and truncation of the longer side.
        assert_eq!(resized_size(480, 640, 256), (256, 341)); // 341.33
        assert_eq!(resized_size(640, 480, 256), (341, 256));
        assert_eq!(resized_size(375, 500, 256), (256, 341)); // 341.33
        assert_eq!(resized_size(333, 500, 256), (256, 384)); // 384.38
        assert_eq!(resized_size(100, 100, 224), (224, 224));
        assert_eq!(resized_size(3, 200, 1), (1, 66)); // 66.67 truncated
        assert_eq!(resized_size(7, 5, 10), (14, 10));
    }

    #[test]
    fn shapes_for_landscape_portrait_and_exact() {
        let t = run(16, 30, 50, pattern(30, 50)).unwrap();
        assert_eq!(t.shape, vec![16, 26, 3]);
        let t = run(16, 50, 30, pattern(50, 30)).unwrap();
        assert_eq!(t.shape, vec![26, 16, 3]);
        // Upscaling works too.
        let t = run(40, 10, 20, pattern(10, 20)).unwrap();
        assert_eq!(t.shape, vec![40, 80, 3]);
        assert_eq!(t.len(), 40 * 80 * 3);
        // Already the right size: unchanged, bit for bit.
        let src = pattern(16, 21);
        let t = run(16, 16, 21, src.clone()).unwrap();
        assert_eq!((t.shape, t.data), (vec![16, 21, 3], TensorData::U8(src.into())));
    }

    #[test]
    fn constant_colour_stays_constant() {
        let src: Vec<u8> = (0..37 * 53).flat_map(|_| [12u8, 200, 77]).collect();
        for size in [5, 20, 37, 80] {
            let t = run(size, 37, 53, src.clone()).unwrap();
            let TensorData::U8(out) = &t.data else { panic!("not uint8") };
            assert!(out.chunks(3).all(|p| p == [12, 200, 77]), "size {size}");
        }
    }

    #[test]
    fn shrinking_is_antialiased() {
        // A 1-pixel checkerboard shrunk by 4 must average to grey, not alias to black/white.
        let src: Vec<u8> = (0..64 * 64)
            .flat_map(|i| {
                let v = if (i % 64 + i / 64) % 2 == 0 { 0 } else { 255 };
                [v, v, v]
            })
            .collect();
        let t = run(16, 64, 64, src).unwrap();
        let TensorData::U8(out) = &t.data else { panic!("not uint8") };
        assert!(out.iter().all(|&v| (120..=135).contains(&v)), "{:?}", &out[..12]);
    }

    #[test]
    fn wrong_input_is_an_error() {
        let mut e = Element::new("k");
        e.set("image", Value::Bytes(bytes::Bytes::from_static(b"\x89PNG")));
        let op = ResizeOp::new(&Resize { size: 8, field: "image".into() });
        let err = op.apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap_err();
        assert!(err.0.contains("`image.resize` needs a decoded image in field `image`"), "{err}");
        assert!(err.0.contains("add `image.decode` before it"), "{err}");

        // An extreme aspect ratio whose longer side would exceed the limit.
        let err = run(200, 1, 100, vec![0; 300]).unwrap_err();
        assert!(err.0.contains("over the limit"), "{err}");
        // An empty image.
        assert!(run(8, 0, 5, Vec::new()).is_err());
    }
}
