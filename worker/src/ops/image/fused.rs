//! The fast image path: `image.decode → [filter image.min_size] → image.random_resized_crop →
//! [image.flip] → [image.normalize]` on one field, run as one operator.
//!
//! - A size filter right after the decode is decided from the JPEG header: an image it drops is
//!   never decoded.
//! - The crop box is drawn from the JPEG header alone, then libjpeg-turbo decodes only that
//!   window, DCT-scaled by the smallest `n/8` that keeps the crop at least as large as the
//!   output ([`granary_image::choose_scale`]).
//! - The window is resized (bilinear, antialiased: `granary_image::resize_box`, with
//!   `fast_image_resize`'s bytes) into a per-thread buffer, reading the exact (fractional, after
//!   scaling) crop box in place.
//! - Flip, normalization and layout happen in one pass that writes the output tensor.
//!
//! The random draws are the same, in the same order, as the separate operators make, so the
//! crop boxes and flips of both paths agree; pixels differ by the decoders' rounding and the
//! DCT scaling (within a mean absolute error of 2 of torchvision, see the fixture test).
//! PNGs and JPEGs that libjpeg-turbo cannot window (CMYK, 12-bit, lossless) take the generic
//! decoder with the same draws.

use super::crop::rrc_params;
use super::decode::{JPEG_MAGIC, decode_rgb8, encoded_bytes};
use super::normalize::Form;
use super::{RgbView, check_dimensions, resize_rgb};
use crate::element::{Element, Value};
use crate::ops::{Fate, OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::OpConfig;
use granary_crds::ops::filter::Test;
use granary_image::jpeg::{JpegInfo, with_decoder};
use granary_image::{PlannedImage, WindowPlan, resize_box};
use std::cell::RefCell;

const OP: &str = "image.decode";

/// How a pipeline's image stages run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImagePath {
    /// Fuse `decode → random_resized_crop → [flip] → [normalize]` into [`FusedCropOp`].
    #[default]
    Fused,
    /// Run every stage on its own: full-size decode with the `image` crate, then one pass per
    /// stage. The reference the fast path is measured against.
    Separate,
    /// For benchmarks only: the fused operator stops after decoding the crop window and emits
    /// a 1×1 image, which measures the decoding limit of the fast path.
    DecodeOnly,
}

/// `decode → [filter image.min_size] → random_resized_crop → [flip] → [normalize]` on one field,
/// as one operator.
#[derive(Clone, Debug)]
pub struct FusedCropOp {
    field: String,
    /// The least (width, height) a fused `image.min_size` filter keeps.
    min_size: Option<(usize, usize)>,
    size: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    flip: Option<f64>,
    form: Form,
    decode_only: bool,
}

/// The `[image.flip] → [image.normalize]` on `field` at the start of `rest`, which a fused
/// image operator takes over: the flip's probability, the output's form, and how many stages.
pub(super) fn flip_and_form(rest: &[OpConfig], field: &str) -> (Option<f64>, Form, usize) {
    let mut flip = None;
    let mut form = Form::raw();
    let mut used = 0;
    let mut rest = rest.iter().peekable();
    if let Some(OpConfig::ImageFlip(f)) = rest.peek()
        && f.field == field
    {
        flip = Some(f.p);
        used += 1;
        rest.next();
    }
    if let Some(OpConfig::ImageNormalize(normalize)) = rest.peek()
        && normalize.field == field
    {
        form = Form::new(normalize);
        used += 1;
    }
    (flip, form, used)
}

impl FusedCropOp {
    /// Recognizes the fusable run at the start of `configs` and returns the operator with the
    /// number of stages it replaces; `None` when the stages do not start with
    /// `image.decode → [filter image.min_size] → image.random_resized_crop` on one field.
    pub fn fuse(configs: &[OpConfig], path: ImagePath) -> Option<(FusedCropOp, usize)> {
        if path == ImagePath::Separate {
            return None;
        }
        let [OpConfig::ImageDecode(decode), rest @ ..] = configs else { return None };
        let mut used = 1;
        let mut min_size = None;
        let mut rest = rest;
        if let [OpConfig::Filter(filter), tail @ ..] = rest
            && let Some(Test::MinSize { field, min_width, min_height }) = filter.test()
            && field == decode.field
        {
            min_size = Some((min_width as usize, min_height as usize));
            used += 1;
            rest = tail;
        }
        let [OpConfig::ImageRandomResizedCrop(rrc), rest @ ..] = rest else { return None };
        if rrc.field != decode.field {
            return None;
        }
        let mut op = FusedCropOp {
            field: decode.field.clone(),
            min_size,
            size: rrc.size as usize,
            scale: rrc.scale,
            ratio: rrc.ratio,
            flip: None,
            form: Form::raw(),
            decode_only: path == ImagePath::DecodeOnly,
        };
        let (flip, form, tail) = flip_and_form(rest, &op.field);
        (op.flip, op.form) = (flip, form);
        Some((op, used + 1 + tail))
    }

    /// The image field.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The output's `(height, width)` when it is what a plan's execution makes (`uint8` HWC
    /// pixels: no normalization of its own, not the decode-only benchmark); `None` otherwise.
    pub fn planned_output(&self) -> Option<(usize, usize)> {
        (self.form.is_raw() && !self.decode_only).then_some((self.size, self.size))
    }

    /// The output tensor for the decoded `window` of the image, planned by `plan`.
    fn finish(&self, window: RgbView<'_>, plan: &PlannedImage) -> Result<Tensor, OpError> {
        let size = self.size;
        // Resizing straight into the element's buffer (no copy out of the thread's; with the
        // buffers recycled from the batch builder, no zero-fill either) took the copy out of the
        // profile but measured the same: whole-process CPU time of the training recipe 1.003×
        // (16 pairs, one core) and 1.007× (12 pairs, two cores) of this. Not kept.
        RESIZED.with(|cell| {
            let mut resized = cell.borrow_mut();
            let crop = plan.window.crop;
            resize_box(window, crop, plan.window.edges, size, size, &mut resized).map_err(resize_failed)?;
            Ok(self.form.emit(&resized[..size * size * 3], size, size, plan.flip))
        })
    }

    /// Whether a fused size filter drops an image of `height × width` (when `filter` is on).
    fn drops(&self, filter: bool, height: usize, width: usize) -> bool {
        filter && self.min_size.is_some_and(|(min_w, min_h)| width < min_w || height < min_h)
    }

    /// The generic path: a full decode by the `image` crate, then the same filter, crop, flip
    /// and form.
    fn generic(&self, bytes: &[u8], rng: &mut SeededRng, filter: bool) -> Result<Option<Tensor>, OpError> {
        let field = &self.field;
        let (h, w, pixels) =
            decode_rgb8(bytes).map_err(|why| OpError::new(format!("`{OP}`: field `{field}` {why}")))?;
        if self.drops(filter, h, w) {
            return Ok(None);
        }
        let region = rrc_params(h, w, self.scale, self.ratio, rng);
        let src = RgbView { height: h, width: w, data: &pixels };
        let resized = resize_rgb("image.random_resized_crop", src, Some(region), self.size, self.size)?;
        let flip = self.flip.is_some_and(|p| rng.uniform() < p);
        Ok(Some(self.form.emit(&resized, self.size, self.size, flip)))
    }

    /// Everything the fast path decides for one JPEG before decoding a pixel: the size
    /// filter's verdict (when `filter`), the crop box and the flip, drawn as [`Operator::run`]
    /// draws them. Executing the plan ([`PlannedImage::execute`]) gives the pixels this
    /// operator outputs when it has no normalization of its own.
    pub fn plan(&self, bytes: &[u8], rng: &mut SeededRng, filter: bool) -> Result<Planned, OpError> {
        if !bytes.starts_with(JPEG_MAGIC) {
            return Ok(Planned::Unplannable);
        }
        let info = with_decoder(|decoder| decoder.header(bytes)).map_err(|why| corrupt(&self.field, why))?;
        self.plan_from(&info, rng, filter)
    }

    /// [`FusedCropOp::plan`] from the JPEG's header.
    fn plan_from(&self, info: &JpegInfo, rng: &mut SeededRng, filter: bool) -> Result<Planned, OpError> {
        if !info.windowable {
            return Ok(Planned::Unplannable);
        }
        check_dimensions(OP, "the JPEG", info.height, info.width)?;
        if self.drops(filter, info.height, info.width) {
            return Ok(Planned::Dropped);
        }
        let region = rrc_params(info.height, info.width, self.scale, self.ratio, rng);
        let window = WindowPlan::crop(info, region, self.size);
        let flip = self.flip.is_some_and(|p| rng.uniform() < p);
        let size = self.size;
        Ok(Planned::Image(PlannedImage {
            window,
            rows: size,
            cols: size,
            height: size,
            width: size,
            top: 0,
            left: 0,
            flip,
        }))
    }

    /// The fast path for a JPEG libjpeg-turbo can window: `Ok(None)` sends it to the generic
    /// path (before any random draw), `Ok(Some(None))` says the size filter dropped it (from the
    /// header, before decoding anything).
    fn windowed(
        &self,
        bytes: &[u8],
        rng: &mut SeededRng,
        filter: bool,
    ) -> Result<Option<Option<Tensor>>, OpError> {
        let info = with_decoder(|decoder| decoder.header(bytes)).map_err(|why| corrupt(&self.field, why))?;
        let plan = match self.plan_from(&info, rng, filter)? {
            Planned::Image(plan) => plan,
            Planned::Dropped => return Ok(Some(None)),
            Planned::Unplannable => return Ok(None),
        };
        WINDOW.with(|cell| {
            let mut buffer = cell.borrow_mut();
            let window =
                plan.window.decode(bytes, &info, &mut buffer).map_err(|why| corrupt(&self.field, why))?;
            if self.decode_only {
                let first = window.data.get(..3).unwrap_or(&[0, 0, 0]);
                return Ok(Some(Some(Tensor {
                    shape: vec![1, 1, 3],
                    data: TensorData::U8(SmallVec::from_slice(first)),
                })));
            }
            self.finish(window, &plan).map(|t| Some(Some(t)))
        })
    }
}

/// What a fused image operator decides for one image before decoding it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Planned {
    /// The image's plan.
    Image(PlannedImage),
    /// The fused size filter drops it (decided from the header).
    Dropped,
    /// libjpeg-turbo cannot decode a window of it (a PNG or WebP, or a JPEG it cannot window):
    /// the operator decodes it whole, with the same draws.
    Unplannable,
}

fn corrupt(field: &str, why: String) -> OpError {
    OpError::new(format!("`{OP}`: field `{field}` holds a corrupt or unsupported JPEG: {why}"))
}

thread_local! {
    /// Per-thread buffers, reused across elements: the decoded window and the resized image.
    static WINDOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RESIZED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn resize_failed(why: String) -> OpError {
    OpError::new(format!("`image.random_resized_crop`: {why}"))
}

impl FusedCropOp {
    /// Runs the fused stages on `element`; with `filter`, a fused size filter may drop it (and
    /// leave it as it was).
    fn process(&self, element: &mut Element, rng: &mut SeededRng, filter: bool) -> Result<Fate, OpError> {
        let bytes = encoded_bytes(element, &self.field)?;
        let fast = if bytes.starts_with(JPEG_MAGIC) { self.windowed(bytes, rng, filter)? } else { None };
        let made = match fast {
            Some(made) => made,
            None => self.generic(bytes, rng, filter)?,
        };
        let Some(tensor) = made else { return Ok(Fate::Drop) };
        element.set(&self.field, Value::Tensor(tensor));
        Ok(Fate::Keep)
    }
}

impl Operator for FusedCropOp {
    /// Decodes, crops and so on; a fused size filter only says what it decides in
    /// [`Operator::run`], as a filter's `apply` does.
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        self.process(element, rng, false).map(|_| ())
    }

    fn run(&self, element: &mut Element, rng: &mut SeededRng) -> Result<Fate, OpError> {
        self.process(element, rng, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::image::test_configs as configs;

    #[test]
    fn fuses_the_imagenet_run_and_nothing_else() {
        let all = configs(
            "[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.flip}, {op: image.normalize}]",
        );
        assert_eq!(FusedCropOp::fuse(&all, ImagePath::Fused).map(|(_, n)| n), Some(4));
        assert_eq!(FusedCropOp::fuse(&all, ImagePath::DecodeOnly).map(|(_, n)| n), Some(4));
        assert!(FusedCropOp::fuse(&all, ImagePath::Separate).is_none());
        // Optional flip and normalize.
        let short =
            configs("[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.normalize}]");
        assert_eq!(FusedCropOp::fuse(&short, ImagePath::Fused).map(|(_, n)| n), Some(3));
        let two = configs(
            "[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.resize, size: 4}]",
        );
        assert_eq!(FusedCropOp::fuse(&two, ImagePath::Fused).map(|(_, n)| n), Some(2));
        // Other fields, other orders, or no crop: not fused.
        let other = configs("[{op: image.decode}, {op: image.random_resized_crop, size: 8, field: other}]");
        assert!(FusedCropOp::fuse(&other, ImagePath::Fused).is_none());
        let resize = configs("[{op: image.decode}, {op: image.resize, size: 8}]");
        assert!(FusedCropOp::fuse(&resize, ImagePath::Fused).is_none());
        let flip_other = configs(
            "[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.flip, field: x}, {op: image.normalize}]",
        );
        assert_eq!(FusedCropOp::fuse(&flip_other, ImagePath::Fused).map(|(_, n)| n), Some(2));
        // A size filter on the field between the decode and the crop joins; others do not.
        let filtered = configs(
            "[{op: image.decode}, {op: filter, predicate: image.min_size, minWidth: 9}, {op: image.random_resized_crop, size: 8}, {op: image.flip}]",
        );
        let (op, n) = FusedCropOp::fuse(&filtered, ImagePath::Fused).unwrap();
        assert_eq!((n, op.min_size), (4, Some((9, 0))));
        let text = configs(
            "[{op: image.decode}, {op: filter, predicate: text.length, unit: chars, min: 1}, {op: image.random_resized_crop, size: 8}]",
        );
        assert!(FusedCropOp::fuse(&text, ImagePath::Fused).is_none());
        let elsewhere = configs(
            "[{op: image.decode}, {op: filter, predicate: image.min_size, minWidth: 9, field: x}, {op: image.random_resized_crop, size: 8}]",
        );
        assert!(FusedCropOp::fuse(&elsewhere, ImagePath::Fused).is_none());
    }

    #[test]
    fn corrupt_and_foreign_inputs_are_errors() {
        let op = FusedCropOp::fuse(
            &configs("[{op: image.decode}, {op: image.random_resized_crop, size: 8}]"),
            ImagePath::Fused,
        )
        .unwrap()
        .0;
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
