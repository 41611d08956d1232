//! The fast path of the deterministic image recipes: `image.decode → image.resize →
//! image.center_crop → [image.flip] → [image.normalize]` on one field (the ImageNet validation
//! recipe), and the shorter runs `decode → resize` and `decode → center_crop`, as one operator.
//!
//! - The geometry comes from the JPEG header alone ([`Geometry`]): the output size, and the box
//!   of the source image that ends up in it (the centre crop mapped back through the resize,
//!   fractional). Where the crop is larger than the (resized) image, the rest is zero padding,
//!   as torchvision's `CenterCrop` pads.
//! - libjpeg-turbo decodes only the window covering that box (plus the reach of the resize
//!   filter, its left edge on an iMCU boundary), DCT-scaled by the smallest SIMD scale `n/8` that
//!   keeps the box at least as large as its share of the output ([`granary_image::choose_scale`]).
//! - The exact box is resized in one call (bilinear, antialiased: `granary_image::resize_box`,
//!   with `fast_image_resize`'s bytes) into a per-thread buffer; the filter reads the window's
//!   pixels around the box, as it reads the neighbours of the crop in a full-size resize.
//! - Flip, normalization and layout happen in one pass that writes the output tensor.
//!
//! The only random draw is the flip's, made as `image.flip` makes it, so flips agree with the
//! separate operators. Pixels differ by the decoders' rounding and the DCT scaling. PNGs,
//! WebPs and JPEGs libjpeg-turbo cannot window take the generic decoder, then the same geometry.

use super::decode::{JPEG_MAGIC, decode_rgb8, encoded_bytes};
use super::fused::{ImagePath, Planned, flip_and_form};
use super::normalize::Form;
use super::resize::resized_size;
use super::{RgbView, check_dimensions};
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::OpConfig;
use granary_image::jpeg::{JpegInfo, with_decoder};
use granary_image::planned::pad_into;
use granary_image::{Edges, PlannedImage, WindowPlan, resize_box};
use std::cell::RefCell;

const OP: &str = "image.decode";

/// `image.decode` then `image.resize` and/or `image.center_crop`, then optionally `image.flip`
/// and `image.normalize`, on one field, as one operator.
#[derive(Clone, Debug)]
pub struct FusedResizeOp {
    field: String,
    /// `image.resize`'s `size`: the shorter side, in pixels.
    resize: Option<usize>,
    /// `image.center_crop`'s `size`: the side of the square crop, in pixels.
    crop: Option<usize>,
    flip: Option<f64>,
    form: Form,
    decode_only: bool,
}

impl FusedResizeOp {
    /// Recognizes the fusable run at the start of `configs` and returns the operator with the
    /// number of stages it replaces; `None` when the stages do not start with `image.decode`
    /// followed by `image.resize` and/or `image.center_crop` (in that order) on its field, or
    /// on the reference path ([`ImagePath::Separate`]).
    pub fn fuse(configs: &[OpConfig], path: ImagePath) -> Option<(FusedResizeOp, usize)> {
        if path == ImagePath::Separate {
            return None;
        }
        let [OpConfig::ImageDecode(decode), rest @ ..] = configs else { return None };
        let field = decode.field.clone();
        let mut rest = rest.iter().peekable();
        let mut op = FusedResizeOp {
            resize: None,
            crop: None,
            flip: None,
            form: Form::raw(),
            decode_only: path == ImagePath::DecodeOnly,
            field,
        };
        let mut used = 1;
        if let Some(OpConfig::ImageResize(resize)) = rest.peek()
            && resize.field == op.field
        {
            op.resize = Some(resize.size as usize);
            used += 1;
            rest.next();
        }
        if let Some(OpConfig::ImageCenterCrop(crop)) = rest.peek()
            && crop.field == op.field
        {
            op.crop = Some(crop.size as usize);
            used += 1;
            rest.next();
        }
        if op.resize.is_none() && op.crop.is_none() {
            return None;
        }
        let (flip, form, tail) = flip_and_form(configs.get(used..).unwrap_or_default(), &op.field);
        (op.flip, op.form) = (flip, form);
        used += tail;
        Some((op, used))
    }
}

/// Python's `int(round(x))`: rounds half to even.
fn py_round(x: f64) -> i64 {
    x.round_ties_even() as i64
}

/// Where output index 0 of a centre crop of length `crop` falls in an axis of length `len`, as
/// `image.center_crop` places it: torchvision pads `(crop - len) // 2` zeros before when the
/// crop is longer (a negative offset), and otherwise starts at `round((len - crop) / 2)`.
fn center_offset(len: usize, crop: usize) -> i64 {
    if crop > len { -(((crop - len) / 2) as i64) } else { py_round((len - crop) as f64 / 2.0) }
}

/// One axis of a [`Geometry`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct Axis {
    /// Output length.
    out: usize,
    /// First output index the image covers (the padding before it).
    place: usize,
    /// Output indices the image covers.
    count: usize,
    /// Start of the source interval those indices come from, in full-size source pixels.
    start: f64,
    /// Length of that interval.
    extent: f64,
}

impl Axis {
    /// An axis of `len` source pixels, resized to `resized`, then centre-cropped to `crop`.
    fn new(len: usize, resized: usize, crop: Option<usize>) -> Axis {
        let (out, offset) = match crop {
            Some(c) => (c, center_offset(resized, c)),
            None => (resized, 0),
        };
        // Resized indices [first, end) are inside both the resized image and the crop.
        let first = offset.max(0) as usize;
        let end = (offset + out as i64).min(resized as i64).max(first as i64) as usize;
        let count = end - first;
        let place = (first as i64 - offset) as usize;
        let scale = len as f64 / resized as f64;
        Axis { out, place, count, start: first as f64 * scale, extent: count as f64 * scale }
    }
}

/// What the fused stages make of a `height × width` image: the output size, and where in it
/// the image lands, from which box of the source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    /// Rows of the output.
    pub out_height: usize,
    /// Columns of the output.
    pub out_width: usize,
    /// First output row the image covers (zero padding above it).
    pub top: usize,
    /// First output column the image covers (zero padding left of it).
    pub left: usize,
    /// Output rows the image covers.
    pub rows: usize,
    /// Output columns the image covers.
    pub cols: usize,
    /// The box of the source image resized into those rows and columns, as `[left, top,
    /// width, height]` in full-size source pixels (fractional).
    pub source: [f64; 4],
    /// Whether the box is resized at scale 1 (no `image.resize`, or one that keeps the size):
    /// the box is whole pixels and is copied.
    pub unscaled: bool,
}

impl Geometry {
    /// The geometry of `image.resize` to `resize` (shorter side), then `image.center_crop` to
    /// `crop`, of a `height × width` image; the same checks of the output sizes as the
    /// separate operators make.
    pub fn new(
        height: usize,
        width: usize,
        resize: Option<usize>,
        crop: Option<usize>,
    ) -> Result<Geometry, OpError> {
        check_dimensions(OP, "the input image", height, width)?;
        let (rh, rw) = match resize {
            Some(size) => {
                let (rh, rw) = resized_size(height, width, size);
                check_dimensions("image.resize", "the output image", rh, rw)?;
                (rh, rw)
            }
            None => (height, width),
        };
        if let Some(size) = crop {
            check_dimensions("image.center_crop", "the output image", size, size)?;
        }
        let y = Axis::new(height, rh, crop);
        let x = Axis::new(width, rw, crop);
        Ok(Geometry {
            out_height: y.out,
            out_width: x.out,
            top: y.place,
            left: x.place,
            rows: y.count,
            cols: x.count,
            source: [x.start, y.start, x.extent, y.extent],
            unscaled: (rh, rw) == (height, width),
        })
    }

    /// Whether the image leaves part of the output to padding.
    pub fn padded(&self) -> bool {
        (self.rows, self.cols) != (self.out_height, self.out_width)
    }
}

thread_local! {
    /// Per-thread buffers, reused across elements: the decoded window, the resized box and the
    /// padded output.
    static WINDOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RESIZED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static PADDED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Plans the decode of the image `info` for the geometry `g`.
pub fn plan_window(info: &JpegInfo, g: &Geometry) -> WindowPlan {
    WindowPlan::resize(info, g.source, g.rows, g.cols, g.unscaled)
}

fn corrupt(field: &str, why: String) -> OpError {
    OpError::new(format!("`{OP}`: field `{field}` holds a corrupt or unsupported JPEG: {why}"))
}

impl FusedResizeOp {
    /// The output tensor for the box `crop` of `src` (a decoded window or the whole image), in
    /// the geometry `g`: resized, padded, flipped and put in its final form.
    fn finish(&self, src: RgbView<'_>, crop: [f64; 4], g: &Geometry, flip: bool) -> Result<Tensor, OpError> {
        let (h, w) = (g.out_height, g.out_width);
        RESIZED.with(|cell| {
            let mut resized = cell.borrow_mut();
            resize_box(src, crop, Edges::Image, g.rows, g.cols, &mut resized)
                .map_err(|why| OpError::new(format!("`image.resize`: {why}")))?;
            let resized = &resized[..g.rows * g.cols * 3];
            if !g.padded() {
                return Ok(self.form.emit(resized, h, w, flip));
            }
            PADDED.with(|cell| {
                let mut padded = cell.borrow_mut();
                padded.resize(h * w * 3, 0);
                pad_into(resized, g.cols, g.top, g.left, w, &mut padded);
                Ok(self.form.emit(&padded, h, w, flip))
            })
        })
    }

    /// The generic path: a full decode by the `image` crate, then the same geometry, flip and
    /// form.
    fn generic(&self, bytes: &[u8], rng: &mut SeededRng) -> Result<Tensor, OpError> {
        let field = &self.field;
        let (h, w, pixels) =
            decode_rgb8(bytes).map_err(|why| OpError::new(format!("`{OP}`: field `{field}` {why}")))?;
        let g = Geometry::new(h, w, self.resize, self.crop)?;
        let src = RgbView { height: h, width: w, data: &pixels };
        let flip = self.flip.is_some_and(|p| rng.uniform() < p);
        self.finish(src, g.source, &g, flip)
    }

    /// The image field.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The output's `(height, width)` when every image gets the same one (a centre crop ends
    /// the run) and it is what a plan's execution makes (`uint8` HWC pixels: no normalization
    /// of its own, not the decode-only benchmark); `None` otherwise.
    pub fn planned_output(&self) -> Option<(usize, usize)> {
        let side = self.crop?;
        (self.form.is_raw() && !self.decode_only).then_some((side, side))
    }

    /// Everything the fast path decides for one JPEG before decoding a pixel: the geometry and
    /// the flip, drawn as [`Operator::apply`] draws it. Executing the plan
    /// ([`PlannedImage::execute`]) gives the pixels this operator outputs when it has no
    /// normalization of its own.
    pub fn plan(&self, bytes: &[u8], rng: &mut SeededRng) -> Result<Planned, OpError> {
        if !bytes.starts_with(JPEG_MAGIC) {
            return Ok(Planned::Unplannable);
        }
        let info = with_decoder(|decoder| decoder.header(bytes)).map_err(|why| corrupt(&self.field, why))?;
        Ok(self.plan_from(&info, rng)?.map_or(Planned::Unplannable, |(plan, _)| Planned::Image(plan)))
    }

    /// [`FusedResizeOp::plan`] from the JPEG's header, with the geometry; `None` for a JPEG
    /// libjpeg-turbo cannot window (before any draw).
    fn plan_from(
        &self,
        info: &JpegInfo,
        rng: &mut SeededRng,
    ) -> Result<Option<(PlannedImage, Geometry)>, OpError> {
        if !info.windowable {
            return Ok(None);
        }
        let g = Geometry::new(info.height, info.width, self.resize, self.crop)?;
        let window = plan_window(info, &g);
        let flip = self.flip.is_some_and(|p| rng.uniform() < p);
        let plan = PlannedImage {
            window,
            rows: g.rows,
            cols: g.cols,
            height: g.out_height,
            width: g.out_width,
            top: g.top,
            left: g.left,
            flip,
        };
        Ok(Some((plan, g)))
    }

    /// The fast path for a JPEG libjpeg-turbo can window; `Ok(None)` sends it to the generic
    /// path (before any random draw).
    fn windowed(&self, bytes: &[u8], rng: &mut SeededRng) -> Result<Option<Tensor>, OpError> {
        let field = &self.field;
        let info = with_decoder(|decoder| decoder.header(bytes)).map_err(|why| corrupt(field, why))?;
        let Some((plan, g)) = self.plan_from(&info, rng)? else { return Ok(None) };
        WINDOW.with(|cell| {
            let mut buffer = cell.borrow_mut();
            let window = plan.window.decode(bytes, &info, &mut buffer).map_err(|why| corrupt(field, why))?;
            if self.decode_only {
                let first = window.data.get(..3).unwrap_or(&[0, 0, 0]);
                return Ok(Some(Tensor {
                    shape: vec![1, 1, 3],
                    data: TensorData::U8(SmallVec::from_slice(first)),
                }));
            }
            self.finish(window, plan.window.crop, &g, plan.flip).map(Some)
        })
    }
}

impl Operator for FusedResizeOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        let bytes = encoded_bytes(element, &self.field)?;
        let fast = if bytes.starts_with(JPEG_MAGIC) { self.windowed(bytes, rng)? } else { None };
        let tensor = match fast {
            Some(tensor) => tensor,
            None => self.generic(bytes, rng)?,
        };
        element.set(&self.field, Value::Tensor(tensor));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::image::crop::CenterCropOp;
    use crate::ops::image::decode::DecodeOp;
    use crate::ops::image::flip::FlipOp;
    use crate::ops::image::normalize::NormalizeOp;
    use crate::ops::image::resize::ResizeOp;
    use crate::ops::image::test_configs as configs;
    use crate::ops::image::test_images::pattern;
    use image::{ExtendedColorType, ImageEncoder};

    fn used(yaml: &str, path: ImagePath) -> Option<usize> {
        FusedResizeOp::fuse(&configs(yaml), path).map(|(_, n)| n)
    }

    /// A smooth image with some texture: what photos look like to a JPEG encoder, so that the
    /// decoders' differences stay small and a misplaced box or a missed flip shows.
    fn photo(h: usize, w: usize) -> Vec<u8> {
        let mut data = Vec::with_capacity(h * w * 3);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f64 / w as f64, y as f64 / h as f64);
                let wave = ((x as f64 / 9.0).sin() * (y as f64 / 13.0).cos() * 40.0) as i32;
                data.push((fx * 200.0) as i32 as u8 + 20);
                data.push(((fy * 180.0) as i32 + 30 + wave).clamp(0, 255) as u8);
                data.push((((fx + fy) * 90.0) as i32 + 20 - wave / 2).clamp(0, 255) as u8);
            }
        }
        data
    }

    fn jpeg(h: usize, w: usize) -> Vec<u8> {
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 92)
            .write_image(&photo(h, w), w as u32, h as u32, ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    fn png(h: usize, w: usize) -> Vec<u8> {
        let mut out = Vec::new();
        image::codecs::png::PngEncoder::new(&mut out)
            .write_image(&pattern(h, w), w as u32, h as u32, ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    #[test]
    fn fuses_the_deterministic_recipes_and_nothing_else() {
        let val = "[{op: image.decode}, {op: image.resize, size: 256}, {op: image.center_crop, size: 224}, {op: image.flip}, {op: image.normalize}]";
        assert_eq!(used(val, ImagePath::Fused), Some(5));
        assert_eq!(used(val, ImagePath::DecodeOnly), Some(5));
        assert_eq!(used(val, ImagePath::Separate), None);
        let short = "[{op: image.decode}, {op: image.resize, size: 256}, {op: image.normalize}]";
        assert_eq!(used(short, ImagePath::Fused), Some(3));
        let crop = "[{op: image.decode}, {op: image.center_crop, size: 8}, {op: image.flip}]";
        assert_eq!(used(crop, ImagePath::Fused), Some(3));
        let resize = "[{op: image.decode}, {op: image.resize, size: 8}]";
        assert_eq!(used(resize, ImagePath::Fused), Some(2));
        // A crop before the resize: the crop joins, the resize stays on its own.
        let crop_first =
            "[{op: image.decode}, {op: image.center_crop, size: 8}, {op: image.resize, size: 4}]";
        assert_eq!(used(crop_first, ImagePath::Fused), Some(2));
        // No geometric stage, another field, or the training recipe: not this operator.
        assert_eq!(used("[{op: image.decode}, {op: image.normalize}]", ImagePath::Fused), None);
        assert_eq!(
            used("[{op: image.decode}, {op: image.resize, size: 8, field: x}]", ImagePath::Fused),
            None
        );
        assert_eq!(
            used("[{op: image.decode}, {op: image.random_resized_crop, size: 8}]", ImagePath::Fused),
            None
        );
        let crop_other =
            "[{op: image.decode}, {op: image.resize, size: 8}, {op: image.center_crop, size: 4, field: x}]";
        assert_eq!(used(crop_other, ImagePath::Fused), Some(2));
        let flip_other = "[{op: image.decode}, {op: image.resize, size: 8}, {op: image.flip, field: x}, {op: image.normalize}]";
        assert_eq!(used(flip_other, ImagePath::Fused), Some(2));
        let (op, _) = FusedResizeOp::fuse(&configs(val), ImagePath::Fused).unwrap();
        assert_eq!((op.resize, op.crop, op.flip), (Some(256), Some(224), Some(0.5)));
    }

    #[test]
    fn fuse_run_keeps_the_run_apart_where_a_cache_may_cut_it() {
        let all = configs(
            "[{op: image.decode}, {op: image.resize, size: 8}, {op: image.center_crop, size: 8}, {op: image.flip}, {op: image.normalize}]",
        );
        let used = |keep_cuts, path| super::super::fuse_run(&all, path, keep_cuts).map(|(_, n)| n);
        assert_eq!(used(false, ImagePath::Fused), Some(5));
        assert_eq!(used(false, ImagePath::DecodeOnly), Some(5));
        assert_eq!(used(false, ImagePath::Separate), None);
        assert_eq!(used(true, ImagePath::Fused), None);
        assert_eq!(super::super::fuse(&all, ImagePath::Fused).map(|(_, n)| n), None);
    }

    #[test]
    fn geometry_maps_the_centre_crop_back_through_the_resize() {
        // Landscape 500×375 → 341×256 → crop 224 at (16, round(58.5) = 58).
        let g = Geometry::new(375, 500, Some(256), Some(224)).unwrap();
        assert_eq!((g.out_height, g.out_width, g.top, g.left, g.rows, g.cols), (224, 224, 0, 0, 224, 224));
        let (sx, sy) = (500.0 / 341.0, 375.0 / 256.0);
        let expected = [58.0 * sx, 16.0 * sy, 224.0 * sx, 224.0 * sy];
        for (a, b) in g.source.iter().zip(expected) {
            assert!((a - b).abs() < 1e-9, "{:?} vs {expected:?}", g.source);
        }
        assert!(!g.unscaled && !g.padded());
        // Portrait: the same, transposed.
        let p = Geometry::new(500, 375, Some(256), Some(224)).unwrap();
        assert_eq!(p.source, [g.source[1], g.source[0], g.source[3], g.source[2]]);
        // Odd sizes: 333×501 → 256×385, crop 223 at (round(16.5) = 16, 81).
        let o = Geometry::new(333, 501, Some(256), Some(223)).unwrap();
        assert!(
            (o.source[0] - 81.0 * 501.0 / 385.0).abs() < 1e-9
                && (o.source[1] - 16.0 * 333.0 / 256.0).abs() < 1e-9
        );
        // Resize only: the whole image, to torchvision's size.
        let r = Geometry::new(375, 500, Some(256), None).unwrap();
        assert_eq!((r.out_height, r.out_width), (256, 341));
        assert_eq!(r.source, [0.0, 0.0, 500.0, 375.0]);
        // Centre crop only: whole pixels, copied.
        let c = Geometry::new(375, 500, None, Some(224)).unwrap();
        assert!(c.unscaled);
        assert_eq!(c.source, [138.0, 76.0, 224.0, 224.0]); // round(138), round(75.5) = 76
        // A resize that keeps the size is a copy too.
        assert!(Geometry::new(256, 300, Some(256), Some(224)).unwrap().unscaled);
    }

    #[test]
    fn small_images_are_padded_like_center_crop() {
        // 100×60, crop 80: rows 0..100 cropped to 80 from 10, columns padded (80 - 60) / 2 = 10.
        let g = Geometry::new(100, 60, None, Some(80)).unwrap();
        assert_eq!((g.top, g.left, g.rows, g.cols), (0, 10, 80, 60));
        assert_eq!(g.source, [0.0, 10.0, 60.0, 80.0]);
        assert!(g.padded());
        // Odd padding: 7 more, 3 before and 4 after.
        let g = Geometry::new(5, 5, None, Some(12)).unwrap();
        assert_eq!((g.top, g.left, g.rows, g.cols, g.out_height), (3, 3, 5, 5, 12));
        // After a resize to 64 the crop of 80 pads a resized image.
        let g = Geometry::new(30, 40, Some(64), Some(80)).unwrap();
        assert_eq!((g.top, g.left, g.rows, g.cols), (8, 0, 64, 80));
        assert!((g.source[0] - 2.0 * 40.0 / 85.0).abs() < 1e-9 && g.source[1] == 0.0);
        // Over the limits: the separate operators' errors.
        assert!(Geometry::new(1, 100, Some(200), None).unwrap_err().0.contains("`image.resize`"));
        assert!(Geometry::new(10, 10, None, Some(0)).unwrap_err().0.contains("`image.center_crop`"));
    }

    #[test]
    fn scale_and_window_cover_the_box_and_the_filter() {
        let big = JpegInfo { width: 2000, height: 1500, mcu_width: 16, windowable: true };
        let small = JpegInfo { width: 500, height: 375, mcu_width: 16, windowable: true };
        let cases = [
            // (info, resize, crop, expected scale)
            (big, Some(256), Some(224), 2), // box 1312 px → 328 at 2/8, 164 at 1/8
            (big, Some(128), Some(112), 1),
            (big, Some(1000), None, 8), // 1500 → 1000 rows: 750 at 4/8 is too few
            (small, Some(256), Some(224), 8),
            (small, None, Some(224), 8),
            (small, Some(64), None, 2), // 375 → 64 rows: 47 at 1/8, 94 at 2/8
        ];
        for (info, resize, crop, num) in cases {
            let g = Geometry::new(info.height, info.width, resize, crop).unwrap();
            let plan = plan_window(&info, &g);
            assert_eq!(plan.num, num, "{info:?} {resize:?} {crop:?}");
            let s = plan.num as f64 / 8.0;
            let w = plan.window;
            assert_eq!(w.left % info.scaled_mcu_width(plan.num), 0);
            assert!(w.left + w.width <= JpegInfo::scaled(info.width, plan.num));
            assert!(w.top + w.height <= JpegInfo::scaled(info.height, plan.num));
            let [cl, ct, cw, ch] = plan.crop;
            assert!((w.left as f64 + cl - g.source[0] * s).abs() < 1e-9);
            assert!((w.top as f64 + ct - g.source[1] * s).abs() < 1e-9);
            assert!(cw >= g.cols as f64 - 1e-9 && ch >= g.rows as f64 - 1e-9, "never enlarged");
            // The filter's reach around the box is inside the window, unless at the image edge
            // (a copy reaches nothing).
            let (reach_x, reach_y) = if g.unscaled {
                (0.0, 0.0)
            } else {
                ((cw / g.cols as f64).max(1.0), (ch / g.rows as f64).max(1.0))
            };
            let (sw, sh) = (JpegInfo::scaled(info.width, plan.num), JpegInfo::scaled(info.height, plan.num));
            assert!(cl >= reach_x || w.left == 0, "{plan:?}");
            assert!(ct >= reach_y || w.top == 0, "{plan:?}");
            assert!(cl + cw + reach_x <= w.width as f64 || w.left + w.width == sw, "{plan:?}");
            assert!(ct + ch + reach_y <= w.height as f64 || w.top + w.height == sh, "{plan:?}");
        }
    }

    /// The fused operator's output, and the separate operators' (decode, resize, centre crop,
    /// flip, normalize) from the same stream, for `yaml`'s stages on `bytes`.
    fn both(yaml: &str, bytes: &[u8], seed: u64) -> (Tensor, Tensor) {
        let configs = configs(yaml);
        let (fused, n) = FusedResizeOp::fuse(&configs, ImagePath::Fused).unwrap();
        assert_eq!(n, configs.len());
        let input = || {
            let mut e = Element::new("k");
            e.set("image", Value::Bytes(bytes::Bytes::copy_from_slice(bytes)));
            e
        };
        let mut a = input();
        let mut rng_a = SeededRng::for_element(3, 0, 1, seed);
        fused.apply(&mut a, &mut rng_a).unwrap();
        let mut b = input();
        let mut rng_b = SeededRng::for_element(3, 0, 1, seed);
        for config in &configs {
            let op: Box<dyn Operator> = match config {
                OpConfig::ImageDecode(c) => Box::new(DecodeOp::new(c)),
                OpConfig::ImageResize(c) => Box::new(ResizeOp::new(c)),
                OpConfig::ImageCenterCrop(c) => Box::new(CenterCropOp::new(c)),
                OpConfig::ImageFlip(c) => Box::new(FlipOp::new(c)),
                OpConfig::ImageNormalize(c) => Box::new(NormalizeOp::new(c)),
                other => panic!("unexpected {other:?}"),
            };
            op.apply(&mut b, &mut rng_b).unwrap();
        }
        assert_eq!(rng_a.uniform(), rng_b.uniform(), "the streams advanced alike");
        let take = |mut e: Element| match e.take("image") {
            Some(Value::Tensor(t)) => t,
            other => panic!("expected a tensor, got {other:?}"),
        };
        (take(a), take(b))
    }

    fn mae(a: &Tensor, b: &Tensor) -> f64 {
        assert_eq!(a.shape, b.shape);
        let (TensorData::U8(a), TensorData::U8(b)) = (&a.data, &b.data) else { panic!("not uint8") };
        a.iter().zip(b).map(|(x, y)| f64::from(x.abs_diff(*y))).sum::<f64>() / a.len() as f64
    }

    #[test]
    fn jpegs_match_the_separate_operators() {
        let recipes = [
            "[{op: image.decode}, {op: image.resize, size: 64}, {op: image.center_crop, size: 56}, {op: image.flip}]",
            "[{op: image.decode}, {op: image.resize, size: 40}]",
            "[{op: image.decode}, {op: image.center_crop, size: 56}, {op: image.flip}]",
            "[{op: image.decode}, {op: image.resize, size: 48}, {op: image.center_crop, size: 60}]",
        ];
        // Landscape, portrait, odd, large enough for DCT scaling, smaller than the crop.
        let mut worst = 0.0f64;
        for (h, w) in [(75, 100), (100, 75), (67, 101), (333, 500), (40, 30), (56, 56)] {
            let bytes = jpeg(h, w);
            for (r, recipe) in recipes.iter().enumerate() {
                for seed in 0..4 {
                    let (fused, separate) = both(recipe, &bytes, seed);
                    let e = mae(&fused, &separate);
                    assert!(e < 2.0, "{h}×{w}, recipe {r}, seed {seed}: MAE {e:.3}");
                    worst = worst.max(e);
                }
            }
        }
        eprintln!("worst MAE {worst:.3}");
    }

    #[test]
    fn pngs_take_the_generic_decoder_and_the_same_geometry() {
        let recipe = "[{op: image.decode}, {op: image.resize, size: 24}, {op: image.center_crop, size: 20}, {op: image.flip}]";
        for (h, w) in [(30, 47), (47, 30), (12, 9)] {
            for seed in 0..4 {
                let (fused, separate) = both(recipe, &png(h, w), seed);
                // The same pixels, the same filter: equal up to the resizer's rounding.
                let e = mae(&fused, &separate);
                assert!(e < 0.05, "{h}×{w}, seed {seed}: MAE {e:.3}");
            }
        }
        let pad = "[{op: image.decode}, {op: image.center_crop, size: 16}]";
        let (fused, separate) = both(pad, &png(9, 21), 0);
        assert_eq!(fused, separate, "a centre crop alone is a copy");
    }

    #[test]
    fn normalized_output_has_the_separate_shape_and_form() {
        let recipe = "[{op: image.decode}, {op: image.resize, size: 32}, {op: image.center_crop, size: 28}, {op: image.flip}, {op: image.normalize, dtype: float32, layout: CHW}]";
        let (fused, separate) = both(recipe, &jpeg(60, 90), 1);
        assert_eq!((fused.shape.clone(), fused.dtype()), (separate.shape.clone(), separate.dtype()));
        assert_eq!(fused.shape, vec![3, 28, 28]);
    }

    #[test]
    fn decode_only_emits_one_pixel() {
        let yaml = "[{op: image.decode}, {op: image.resize, size: 32}, {op: image.center_crop, size: 28}]";
        let (op, _) = FusedResizeOp::fuse(&configs(yaml), ImagePath::DecodeOnly).unwrap();
        let mut e = Element::new("k");
        e.set("image", Value::Bytes(jpeg(60, 90).into()));
        op.apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap();
        let Some(Value::Tensor(t)) = e.get("image") else { panic!("no tensor") };
        assert_eq!(t.shape, vec![1, 1, 3]);
    }

    #[test]
    fn corrupt_and_foreign_inputs_are_errors() {
        let yaml = "[{op: image.decode}, {op: image.resize, size: 8}, {op: image.center_crop, size: 8}]";
        let (op, _) = FusedResizeOp::fuse(&configs(yaml), ImagePath::Fused).unwrap();
        let mut rng = SeededRng::for_element(0, 0, 0, 0);
        for bytes in [&b"\xff\xd8\xffgarbage"[..], b"GIF89a....", b""] {
            let mut e = Element::new("k");
            e.set("image", Value::Bytes(bytes::Bytes::copy_from_slice(bytes)));
            let err = op.apply(&mut e, &mut rng).unwrap_err();
            assert!(err.0.starts_with("`image.decode`: field `image`"), "{err}");
        }
        let mut e = Element::new("k");
        assert!(op.apply(&mut e, &mut rng).unwrap_err().0.contains("no field `image`"));
    }
}
