//! `image.flip` then `image.normalize` on the same field, in one pass: the mirrored image is
//! written straight in its final form instead of being mirrored in place first. The fused crop
//! operator does the same after its crop; this one serves pipelines where something else comes
//! between (a user's `python.map`, a centre crop), so that the image is written once instead of
//! twice. The flip draws exactly what `image.flip` draws, and the output is the same bytes.

use super::flip::FlipOp;
use super::normalize::{Form, NormalizeOp};
use super::rgb_u8;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::OpConfig;

/// `image.flip` and `image.normalize` of one field, fused.
#[derive(Clone, Debug)]
pub struct FlipNormalizeOp {
    flip: FlipOp,
    normalize: NormalizeOp,
    form: Form,
    field: String,
}

impl FlipNormalizeOp {
    /// The fused operator when `configs` starts with `image.flip` and then `image.normalize` of
    /// the same field, with how many configs it takes (2).
    pub fn fuse(configs: &[OpConfig]) -> Option<(FlipNormalizeOp, usize)> {
        let [OpConfig::ImageFlip(flip), OpConfig::ImageNormalize(normalize), ..] = configs else {
            return None;
        };
        if flip.field != normalize.field {
            return None;
        }
        let op = FlipNormalizeOp {
            flip: FlipOp::new(flip),
            normalize: NormalizeOp::new(normalize),
            form: Form::new(normalize),
            field: flip.field.clone(),
        };
        Some((op, 2))
    }
}

impl Operator for FlipNormalizeOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        let flip = self.flip.draw(rng);
        let tensor = match rgb_u8("image.normalize", element, &self.field) {
            Ok(_) if self.form.is_identity() => None,
            Ok(src) => Some(self.form.emit(src.data, src.height, src.width, flip)),
            // Not a decoded image: the stages one after the other, which say what is wrong (or
            // mirror a float32 image before the normalization refuses it).
            Err(_) => {
                self.flip.mirror(element, flip)?;
                return self.normalize.apply(element, rng);
            }
        };
        match tensor {
            Some(tensor) => element.set(&self.field, Value::Tensor(tensor)),
            None => self.flip.mirror(element, flip)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::image::rgb_value;
    use crate::ops::image::test_images::pattern;
    use crate::tensor::{Tensor, TensorData};
    use granary_crds::ops::image::{Flip, ImageDType, Layout, Normalize};
    use smallvec::smallvec;

    fn configs(p: f64, dtype: ImageDType, layout: Layout) -> Vec<OpConfig> {
        let field = "image".to_string();
        vec![
            OpConfig::ImageFlip(Flip { p, field: field.clone() }),
            OpConfig::ImageNormalize(Normalize { mean: None, std: None, dtype, layout, field }),
        ]
    }

    /// The element after the fused operator and after the two stages one by one, from the same
    /// stream; and whether the streams ended in the same place.
    fn both(
        configs: &[OpConfig],
        value: Value,
        seed: u64,
    ) -> (Result<Element, OpError>, Result<Element, OpError>, bool) {
        let (fused, _) = FlipNormalizeOp::fuse(configs).unwrap();
        let mut a = Element::new("k");
        a.set("image", value.clone());
        let mut ra = SeededRng::for_element(5, 0, 1, seed);
        let fused = fused.apply(&mut a, &mut ra).map(|()| a);
        let (OpConfig::ImageFlip(f), OpConfig::ImageNormalize(n)) = (&configs[0], &configs[1]) else {
            panic!("flip then normalize")
        };
        let mut b = Element::new("k");
        b.set("image", value);
        let mut rb = SeededRng::for_element(5, 0, 1, seed);
        let separate =
            FlipOp::new(f).apply(&mut b, &mut rb).and_then(|()| NormalizeOp::new(n).apply(&mut b, &mut rb));
        (fused, separate.map(|()| b), ra.next_u64() == rb.next_u64())
    }

    #[test]
    fn gives_the_bytes_of_flip_then_normalize_in_every_form() {
        let (h, w) = (5, 7);
        for (dtype, layout) in [
            (ImageDType::Uint8, Layout::HWC),
            (ImageDType::Uint8, Layout::CHW),
            (ImageDType::Float32, Layout::HWC),
            (ImageDType::Float32, Layout::CHW),
        ] {
            for p in [0.0, 0.5, 1.0] {
                for seed in 0..8 {
                    let (fused, separate, same_stream) =
                        both(&configs(p, dtype, layout), rgb_value(h, w, pattern(h, w)), seed);
                    assert_eq!(fused.unwrap(), separate.unwrap(), "{dtype:?} {layout:?} p={p} seed={seed}");
                    assert!(same_stream, "the same draws");
                }
            }
        }
    }

    #[test]
    fn what_the_stages_refuse_it_refuses_with_their_words() {
        let float = Value::Tensor(Tensor { shape: vec![2, 2, 3], data: TensorData::F32(smallvec![0.5; 12]) });
        let (fused, separate, _) = both(&configs(1.0, ImageDType::Uint8, Layout::CHW), float, 0);
        let (fused, separate) = (fused.unwrap_err(), separate.unwrap_err());
        assert_eq!(fused.0, separate.0);
        assert!(fused.0.contains("already normalized"), "{fused}");
        let bytes = Value::Bytes(bytes::Bytes::from_static(b"jpeg"));
        let (fused, separate, _) = both(&configs(1.0, ImageDType::Uint8, Layout::CHW), bytes, 0);
        assert_eq!(fused.unwrap_err().0, separate.unwrap_err().0);
    }

    #[test]
    fn fuses_only_flip_then_normalize_of_one_field() {
        let mut c = configs(0.5, ImageDType::Uint8, Layout::CHW);
        assert_eq!(FlipNormalizeOp::fuse(&c).map(|(_, n)| n), Some(2));
        assert!(FlipNormalizeOp::fuse(&c[..1]).is_none());
        c.swap(0, 1);
        assert!(FlipNormalizeOp::fuse(&c).is_none());
        let mut c = configs(0.5, ImageDType::Uint8, Layout::CHW);
        if let OpConfig::ImageNormalize(n) = &mut c[1] {
            n.field = "other".into();
        }
        assert!(FlipNormalizeOp::fuse(&c).is_none());
    }
}
