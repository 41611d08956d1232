//! `image.flip`: mirrors the image left to right with probability `p`.

use super::hwc_tensor_mut;
use crate::element::Element;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::TensorData;
use granary_crds::ops::image::Flip;
use granary_kernels::mirror;

const OP: &str = "image.flip";

/// Mirrors an HWC image (`uint8` or `float32`, 3 channels) left to right, in place, with
/// probability `p`.
#[derive(Clone, Debug)]
pub struct FlipOp {
    p: f64,
    field: String,
}

impl FlipOp {
    /// The operator for `config`.
    pub fn new(config: &Flip) -> FlipOp {
        FlipOp { p: config.p, field: config.field.clone() }
    }
}

/// Reverses the order of the pixels of each row of a `[height, width, 3]` image (for `float32`;
/// `uint8` images take `granary_kernels::mirror`, sixteen pixels at a time).
fn mirror_hwc3<T: Copy>(data: &mut [T], width: usize) {
    if width == 0 {
        return;
    }
    for row in data.chunks_exact_mut(width * 3) {
        let (pixels, _) = row.as_chunks_mut::<3>();
        pixels.reverse();
    }
}

impl FlipOp {
    /// Whether this element is mirrored: exactly one draw from `rng` whatever the outcome, so
    /// later draws do not depend on it.
    pub fn draw(&self, rng: &mut SeededRng) -> bool {
        rng.uniform() < self.p
    }

    /// Mirrors the element's image in place when `flip` is set (after checking it is one).
    pub fn mirror(&self, element: &mut Element, flip: bool) -> Result<(), OpError> {
        let tensor = hwc_tensor_mut(OP, element, &self.field)?;
        if flip {
            let width = tensor.shape[1];
            match &mut tensor.data {
                TensorData::U8(data) => mirror::mirror_in_place(data, width),
                TensorData::F32(data) => mirror_hwc3(data, width),
                // `hwc_tensor_mut` lets only uint8 and float32 through.
                TensorData::I32(_) | TensorData::I64(_) | TensorData::F64(_) => {}
            }
        }
        Ok(())
    }
}

impl Operator for FlipOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        let flip = self.draw(rng);
        self.mirror(element, flip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Value;
    use crate::ops::image::rgb_value;
    use crate::ops::image::test_images::pattern;
    use crate::tensor::Tensor;
    use smallvec::smallvec;

    fn flip(p: f64, value: Value, seed: u64) -> Result<Value, OpError> {
        let mut e = Element::new("k");
        e.set("image", value);
        FlipOp::new(&Flip { p, field: "image".into() })
            .apply(&mut e, &mut SeededRng::for_element(1, 0, 0, seed))?;
        Ok(e.take("image").unwrap())
    }

    /// Scalar reference: out[y][x][c] = in[y][w - 1 - x][c].
    fn reference<T: Copy>(data: &[T], h: usize, w: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(data.len());
        for y in 0..h {
            for x in 0..w {
                for c in 0..3 {
                    out.push(data[(y * w + (w - 1 - x)) * 3 + c]);
                }
            }
        }
        out
    }

    #[test]
    fn p1_mirrors_exactly_and_twice_is_identity() {
        for (h, w) in [(1, 1), (5, 8), (7, 13)] {
            let src = pattern(h, w);
            let once = flip(1.0, rgb_value(h, w, src.clone()), 0).unwrap();
            assert_eq!(once, rgb_value(h, w, reference(&src, h, w)), "{h}x{w}");
            let twice = flip(1.0, once, 1).unwrap();
            assert_eq!(twice, rgb_value(h, w, src));
        }
    }

    #[test]
    fn float32_hwc_is_mirrored_too() {
        let (h, w) = (3, 5);
        let src: Vec<f32> = (0..h * w * 3).map(|i| i as f32 * 0.5 - 3.0).collect();
        let value = Value::Tensor(Tensor { shape: vec![h, w, 3], data: TensorData::F32(src.clone().into()) });
        let out = flip(1.0, value, 0).unwrap();
        let expected = Value::Tensor(Tensor {
            shape: vec![h, w, 3],
            data: TensorData::F32(reference(&src, h, w).into()),
        });
        assert_eq!(out, expected);
    }

    #[test]
    fn p0_never_flips_p1_always_and_half_about_half() {
        let src = pattern(4, 6);
        let mirrored = rgb_value(4, 6, reference(&src, 4, 6));
        let mut flipped = 0;
        for seed in 0..1000 {
            assert_eq!(flip(0.0, rgb_value(4, 6, src.clone()), seed).unwrap(), rgb_value(4, 6, src.clone()));
            assert_eq!(flip(1.0, rgb_value(4, 6, src.clone()), seed).unwrap(), mirrored);
            let out = flip(0.5, rgb_value(4, 6, src.clone()), seed).unwrap();
            if out == mirrored {
                flipped += 1;
            } else {
                assert_eq!(out, rgb_value(4, 6, src.clone()));
            }
        }
        assert!((440..=560).contains(&flipped), "flipped {flipped} of 1000");
    }

    #[test]
    fn draws_exactly_one_value_whatever_the_outcome() {
        for p in [0.0, 0.5, 1.0] {
            for seed in 0..20 {
                let mut e = Element::new("k");
                e.set("image", rgb_value(2, 2, pattern(2, 2)));
                let mut rng = SeededRng::for_element(1, 0, 0, seed);
                FlipOp::new(&Flip { p, field: "image".into() }).apply(&mut e, &mut rng).unwrap();
                let mut fresh = SeededRng::for_element(1, 0, 0, seed);
                fresh.next_u64();
                assert_eq!(rng.next_u64(), fresh.next_u64());
            }
        }
    }

    #[test]
    fn wrong_input_is_an_error() {
        let chw = Value::Tensor(Tensor { shape: vec![3, 4, 5], data: TensorData::F32(smallvec![0.0; 60]) });
        let err = flip(1.0, chw, 0).unwrap_err();
        assert!(err.0.contains("move this stage before it"), "{err}");
        let int = Value::Tensor(Tensor { shape: vec![4, 5, 3], data: TensorData::I64(smallvec![0; 60]) });
        assert!(flip(1.0, int, 0).is_err());
        assert!(flip(0.0, Value::Bytes(bytes::Bytes::from_static(b"x")), 0).is_err());
        let mut e = Element::new("k");
        let err = FlipOp::new(&Flip { p: 1.0, field: "img".into() })
            .apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0))
            .unwrap_err();
        assert!(err.0.contains("no field `img`"), "{err}");
    }
}
