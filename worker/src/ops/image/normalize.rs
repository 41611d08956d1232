//! `image.normalize`: the final image tensor, `float32` `(x / 255 - mean) / std` or `uint8`,
//! in HWC or CHW layout.

use super::rgb_u8;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::ops::image::{ImageDType, Layout, Normalize};

const OP: &str = "image.normalize";

use granary_kernels::mirror;
use granary_kernels::normalize as kernel;
pub use granary_kernels::normalize::{Lut, lut};
use granary_kernels::planes::planes_into;

/// The final form of an image tensor: element type (with its tables for `float32`) and layout.
#[derive(Clone, Debug)]
pub struct Form {
    /// `Some` for `float32` output.
    lut: Option<Box<Lut>>,
    layout: Layout,
}

impl Form {
    /// The form `config` asks for.
    pub fn new(config: &Normalize) -> Form {
        let lut = match config.dtype {
            ImageDType::Float32 => Some(Box::new(lut(config.mean3(), config.std3()))),
            ImageDType::Uint8 => None,
        };
        Form { lut, layout: config.layout }
    }

    /// `uint8` HWC: the decoded pixels as they are (a pipeline without `image.normalize`).
    pub fn raw() -> Form {
        Form { lut: None, layout: Layout::HWC }
    }

    /// Whether this is [`Form::raw`]: `uint8` HWC pixels, as a planned image's execution makes.
    pub fn is_raw(&self) -> bool {
        self.lut.is_none() && self.layout == Layout::HWC
    }

    /// Shape of an `h × w` image in this form.
    pub fn shape(&self, h: usize, w: usize) -> Vec<usize> {
        match self.layout {
            Layout::HWC => vec![h, w, 3],
            Layout::CHW => vec![3, h, w],
        }
    }

    /// Converts `src` (`[h, w, 3]` interleaved RGB) to this form in one pass, mirrored left to
    /// right when `flip` is set.
    pub fn emit(&self, src: &[u8], h: usize, w: usize, flip: bool) -> Tensor {
        let data = match (&self.lut, self.layout) {
            (None, Layout::HWC) => {
                // The pixels as they are: one copy, then the mirror in place. A mirroring copy
                // costs more: its stores into memory the caches do not hold yet read each line
                // first, where a plain copy's do not.
                let mut out = src.to_vec();
                if flip {
                    mirror::mirror_in_place(&mut out, w);
                }
                TensorData::U8(SmallVec::from_vec(out))
            }
            (None, Layout::CHW) => {
                let mut out = Vec::new();
                planes_into(src, w, flip, &mut out);
                TensorData::U8(SmallVec::from_vec(out))
            }
            (Some(lut), layout) => {
                let mut out = Vec::new();
                kernel::normalize_into(src, w, lut, kernel_layout(layout), flip, &mut out);
                TensorData::F32(SmallVec::from_vec(out))
            }
        };
        Tensor { shape: self.shape(h, w), data }
    }

    /// Whether converting to this form leaves the pixels as they are.
    pub fn is_identity(&self) -> bool {
        self.lut.is_none() && self.layout == Layout::HWC
    }
}

/// The kernels' name for a spec layout.
pub fn kernel_layout(layout: Layout) -> kernel::Layout {
    match layout {
        Layout::HWC => kernel::Layout::Hwc,
        Layout::CHW => kernel::Layout::Chw,
    }
}

/// Converts a decoded RGB `uint8` image to the output tensor.
#[derive(Clone, Debug)]
pub struct NormalizeOp {
    form: Form,
    field: String,
}

impl NormalizeOp {
    /// The operator for `config`.
    pub fn new(config: &Normalize) -> NormalizeOp {
        NormalizeOp { form: Form::new(config), field: config.field.clone() }
    }
}

impl Operator for NormalizeOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let field = &self.field;
        let src = match rgb_u8(OP, element, field) {
            Ok(src) => src,
            Err(err) => {
                return Err(match element.get(field) {
                    Some(Value::Tensor(t)) => OpError::new(format!(
                        "`{OP}` needs a decoded image (uint8, shape [height, width, 3]) in field \
                         `{field}`, but it holds a {} tensor of shape {:?}: already normalized? \
                         Use a single `image.normalize`, as the last image stage",
                        t.dtype().name(),
                        t.shape
                    )),
                    _ => err,
                });
            }
        };
        if self.form.is_identity() {
            return Ok(());
        }
        let tensor = self.form.emit(src.data, src.height, src.width, false);
        element.set(field, Value::Tensor(tensor));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::image::rgb_value;
    use crate::ops::image::test_images::pattern;

    const MEAN: [f64; 3] = [0.485, 0.456, 0.406];
    const STD: [f64; 3] = [0.229, 0.224, 0.225];

    fn config(dtype: ImageDType, layout: Layout, mean: Option<Vec<f64>>, std: Option<Vec<f64>>) -> Normalize {
        Normalize { mean, std, dtype, layout, field: "image".into() }
    }

    fn run(config: &Normalize, h: usize, w: usize, src: Vec<u8>) -> Result<Tensor, OpError> {
        let mut e = Element::new("k");
        e.set("image", rgb_value(h, w, src));
        NormalizeOp::new(config).apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0))?;
        match e.take("image") {
            Some(Value::Tensor(t)) => Ok(t),
            other => panic!("expected a tensor, got {other:?}"),
        }
    }

    /// Scalar reference, element by element: (y, x, c) → `f(x, c)`, in the given layout.
    fn reference<T>(src: &[u8], h: usize, w: usize, layout: Layout, f: impl Fn(u8, usize) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(src.len());
        match layout {
            Layout::HWC => {
                for y in 0..h {
                    for x in 0..w {
                        for c in 0..3 {
                            out.push(f(src[(y * w + x) * 3 + c], c));
                        }
                    }
                }
            }
            Layout::CHW => {
                for c in 0..3 {
                    for y in 0..h {
                        for x in 0..w {
                            out.push(f(src[(y * w + x) * 3 + c], c));
                        }
                    }
                }
            }
        }
        out
    }

    /// Every byte value in every channel, plus a pattern.
    fn test_image() -> (usize, usize, Vec<u8>) {
        let (h, w) = (16, 29);
        let mut src = pattern(h, w);
        for (i, v) in src.iter_mut().take(256 * 3).enumerate() {
            *v = (i / 3) as u8;
        }
        (h, w, src)
    }

    #[test]
    fn float32_matches_scalar_formula_in_both_layouts() {
        let (h, w, src) = test_image();
        let mean32 = MEAN.map(|m| m as f32);
        let std32 = STD.map(|s| s as f32);
        for layout in [Layout::HWC, Layout::CHW] {
            let t = run(
                &config(ImageDType::Float32, layout, Some(MEAN.to_vec()), Some(STD.to_vec())),
                h,
                w,
                src.clone(),
            )
            .unwrap();
            let expected_shape = if layout == Layout::HWC { vec![h, w, 3] } else { vec![3, h, w] };
            assert_eq!(t.shape, expected_shape);
            let TensorData::F32(got) = &t.data else { panic!("not float32") };
            // Exact: the correctly rounded value of the formula.
            let exact = reference(&src, h, w, layout, |x, c| {
                ((x as f64 / 255.0 - mean32[c] as f64) / std32[c] as f64) as f32
            });
            assert_eq!(got[..], exact[..], "{layout:?}");
            // And within 1e-6 (relative, absolute near 0) of the plain f32 formula.
            let plain = reference(&src, h, w, layout, |x, c| (x as f32 / 255.0 - mean32[c]) / std32[c]);
            for (i, (a, b)) in got.iter().zip(&plain).enumerate() {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{layout:?} [{i}]: {a} vs {b}");
            }
        }
    }

    #[test]
    fn float32_defaults_and_single_values() {
        let (h, w, src) = test_image();
        // Defaults: mean 0, std 1, so x / 255.
        let t = run(&config(ImageDType::Float32, Layout::HWC, None, None), h, w, src.clone()).unwrap();
        let expected = reference(&src, h, w, Layout::HWC, |x, _| (x as f64 / 255.0) as f32);
        assert_eq!(t.data, TensorData::F32(expected.into()));
        // One value for all channels.
        let t = run(
            &config(ImageDType::Float32, Layout::CHW, Some(vec![0.5]), Some(vec![0.25])),
            h,
            w,
            src.clone(),
        )
        .unwrap();
        let expected = reference(&src, h, w, Layout::CHW, |x, _| ((x as f64 / 255.0 - 0.5) / 0.25) as f32);
        assert_eq!(t.data, TensorData::F32(expected.into()));
    }

    #[test]
    fn uint8_hwc_is_unchanged_and_chw_is_an_exact_transpose() {
        let (h, w, src) = test_image();
        let t = run(&config(ImageDType::Uint8, Layout::HWC, None, None), h, w, src.clone()).unwrap();
        assert_eq!((t.shape, t.data), (vec![h, w, 3], TensorData::U8(src.clone().into())));
        let t = run(&config(ImageDType::Uint8, Layout::CHW, None, None), h, w, src.clone()).unwrap();
        assert_eq!(t.shape, vec![3, h, w]);
        assert_eq!(t.data, TensorData::U8(reference(&src, h, w, Layout::CHW, |x, _| x).into()));
    }

    #[test]
    fn wrong_input_is_an_error() {
        let c = config(ImageDType::Float32, Layout::CHW, None, None);
        let op = NormalizeOp::new(&c);
        let mut rng = SeededRng::for_element(0, 0, 0, 0);
        let mut e = Element::new("k");
        e.set("image", rgb_value(2, 2, vec![0; 12]));
        op.apply(&mut e, &mut rng).unwrap();
        // A second normalize sees a float32 CHW tensor.
        let err = op.apply(&mut e, &mut rng).unwrap_err();
        assert!(err.0.contains("already normalized?"), "{err}");

        let mut e = Element::new("k");
        e.set("image", Value::Bytes(bytes::Bytes::from_static(b"\xff\xd8\xff")));
        let err = op.apply(&mut e, &mut rng).unwrap_err();
        assert!(err.0.contains("add `image.decode` before it"), "{err}");
        let mut e = Element::new("k");
        assert!(op.apply(&mut e, &mut rng).unwrap_err().0.contains("no field `image`"));
    }

    /// Scalar reference of the fused pass: output (y, x) is input (y, w - 1 - x) when flipped.
    fn reference_flipped<T>(
        src: &[u8],
        h: usize,
        w: usize,
        layout: Layout,
        flip: bool,
        f: impl Fn(u8, usize) -> T,
    ) -> Vec<T> {
        let mut mirrored = Vec::with_capacity(src.len());
        for y in 0..h {
            for x in 0..w {
                let sx = if flip { w - 1 - x } else { x };
                mirrored.extend_from_slice(&src[(y * w + sx) * 3..][..3]);
            }
        }
        reference(&mirrored, h, w, layout, f)
    }

    #[test]
    fn emit_with_flip_is_exact_in_every_form() {
        let (h, w, src) = test_image();
        let mean32 = MEAN.map(|m| m as f32);
        let std32 = STD.map(|s| s as f32);
        let exact = |x: u8, c: usize| ((x as f64 / 255.0 - mean32[c] as f64) / std32[c] as f64) as f32;
        for flip in [false, true] {
            for layout in [Layout::HWC, Layout::CHW] {
                let f32_form =
                    Form::new(&config(ImageDType::Float32, layout, Some(MEAN.to_vec()), Some(STD.to_vec())));
                let t = f32_form.emit(&src, h, w, flip);
                assert_eq!(t.shape, f32_form.shape(h, w));
                assert_eq!(
                    t.data,
                    TensorData::F32(reference_flipped(&src, h, w, layout, flip, exact).into()),
                    "{layout:?} flip {flip}"
                );
                let u8_form = Form::new(&config(ImageDType::Uint8, layout, None, None));
                let t = u8_form.emit(&src, h, w, flip);
                assert_eq!(
                    t.data,
                    TensorData::U8(reference_flipped(&src, h, w, layout, flip, |x, _| x).into()),
                    "{layout:?} flip {flip}"
                );
            }
        }
        // A flip really mirrors: row 0 of the flipped HWC output ends with the first pixel.
        let t = Form::raw().emit(&src, h, w, true);
        let TensorData::U8(out) = t.data else { panic!("not uint8") };
        assert_eq!(&out[(w - 1) * 3..w * 3], &src[..3]);
    }
}
