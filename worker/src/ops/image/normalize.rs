//! `image.normalize`: the final image tensor, `float32` `(x / 255 - mean) / std` or `uint8`,
//! in HWC or CHW layout.

use super::rgb_u8;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{Tensor, TensorData};
use granary_crds::ops::image::{ImageDType, Layout, Normalize};

const OP: &str = "image.normalize";

/// Per-channel lookup tables: `lut[c][x]` is the `float32` output for value `x` of channel `c`.
pub type Lut = [[f32; 256]; 3];

/// Converts a decoded RGB `uint8` image to the output tensor.
#[derive(Clone, Debug)]
pub struct NormalizeOp {
    /// `Some` for `float32` output.
    lut: Option<Box<Lut>>,
    layout: Layout,
    field: String,
}

impl NormalizeOp {
    /// The operator for `config`.
    pub fn new(config: &Normalize) -> NormalizeOp {
        let lut = match config.dtype {
            ImageDType::Float32 => Some(Box::new(lut(config.mean3(), config.std3()))),
            ImageDType::Uint8 => None,
        };
        NormalizeOp { lut, layout: config.layout, field: config.field.clone() }
    }
}

/// The tables of `(x / 255 - mean[c]) / std[c]` for every `uint8` value `x`, each entry
/// computed in `f64` and rounded once to `f32`, so that the output is the correctly rounded
/// value of the formula (a straightforward `f32` computation is within a few ulp of it).
pub fn lut(mean: [f32; 3], std: [f32; 3]) -> Lut {
    let mut lut = [[0.0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        let (m, s) = (f64::from(mean[c]), f64::from(std[c]));
        for (x, entry) in table.iter_mut().enumerate() {
            *entry = ((x as f64 / 255.0 - m) / s) as f32;
        }
    }
    lut
}

/// `src` (`[h, w, 3]` interleaved) through the tables, keeping the HWC order.
fn f32_hwc(src: &[u8], lut: &Lut) -> Vec<f32> {
    let [l0, l1, l2] = lut;
    let mut out = vec![0.0f32; src.len()];
    let (pixels, _) = src.as_chunks::<3>();
    let (outs, _) = out.as_chunks_mut::<3>();
    for (o, p) in outs.iter_mut().zip(pixels) {
        *o = [l0[usize::from(p[0])], l1[usize::from(p[1])], l2[usize::from(p[2])]];
    }
    out
}

/// Splits interleaved pixels into three planes (`[h, w, 3]` → `[3, h, w]`), mapping each
/// channel's values through `fr`, `fg` and `fb` (generic, so that they inline).
fn planar<T: Copy + Default>(
    src: &[u8],
    fr: impl Fn(u8) -> T,
    fg: impl Fn(u8) -> T,
    fb: impl Fn(u8) -> T,
) -> Vec<T> {
    let (pixels, _) = src.as_chunks::<3>();
    let plane = pixels.len();
    let mut out = vec![T::default(); plane * 3];
    let (r, rest) = out.split_at_mut(plane);
    let (g, b) = rest.split_at_mut(plane);
    for (((p, r), g), b) in pixels.iter().zip(r).zip(g).zip(b) {
        *r = fr(p[0]);
        *g = fg(p[1]);
        *b = fb(p[2]);
    }
    out
}

/// `src` (`[h, w, 3]` interleaved) through the tables, as planes `[3, h, w]`.
fn f32_chw(src: &[u8], lut: &Lut) -> Vec<f32> {
    let [l0, l1, l2] = lut;
    planar(src, |x| l0[usize::from(x)], |x| l1[usize::from(x)], |x| l2[usize::from(x)])
}

/// `src` (`[h, w, 3]` interleaved) as planes `[3, h, w]`.
fn u8_chw(src: &[u8]) -> Vec<u8> {
    planar(src, |x| x, |x| x, |x| x)
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
        let (h, w) = (src.height, src.width);
        let shape = match self.layout {
            Layout::HWC => vec![h, w, 3],
            Layout::CHW => vec![3, h, w],
        };
        let data = match (&self.lut, self.layout) {
            // Already uint8 HWC: nothing to do.
            (None, Layout::HWC) => return Ok(()),
            (None, Layout::CHW) => TensorData::U8(u8_chw(src.data)),
            (Some(lut), Layout::HWC) => TensorData::F32(f32_hwc(src.data, lut)),
            (Some(lut), Layout::CHW) => TensorData::F32(f32_chw(src.data, lut)),
        };
        element.set(field, Value::Tensor(Tensor { shape, data }));
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
            assert_eq!(got, &exact, "{layout:?}");
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
        assert_eq!(t.data, TensorData::F32(expected));
        // One value for all channels.
        let t = run(
            &config(ImageDType::Float32, Layout::CHW, Some(vec![0.5]), Some(vec![0.25])),
            h,
            w,
            src.clone(),
        )
        .unwrap();
        let expected = reference(&src, h, w, Layout::CHW, |x, _| ((x as f64 / 255.0 - 0.5) / 0.25) as f32);
        assert_eq!(t.data, TensorData::F32(expected));
    }

    #[test]
    fn uint8_hwc_is_unchanged_and_chw_is_an_exact_transpose() {
        let (h, w, src) = test_image();
        let t = run(&config(ImageDType::Uint8, Layout::HWC, None, None), h, w, src.clone()).unwrap();
        assert_eq!((t.shape, t.data), (vec![h, w, 3], TensorData::U8(src.clone())));
        let t = run(&config(ImageDType::Uint8, Layout::CHW, None, None), h, w, src.clone()).unwrap();
        assert_eq!(t.shape, vec![3, h, w]);
        assert_eq!(t.data, TensorData::U8(reference(&src, h, w, Layout::CHW, |x, _| x)));
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
}
