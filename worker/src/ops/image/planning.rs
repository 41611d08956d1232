//! A fused image run left to the consumer (placement of the image run on trainer hosts): for a
//! task whose lease says `images_on_client`, the executor runs this operator in place of the
//! fused one. It decides everything the fused operator decides from the JPEG header and the
//! element's random draws (the size filter's verdict, the crop box, the flip), and puts the
//! plan with the encoded JPEG in the field, as one row of bytes
//! ([`granary_image::row`]); the consumer executes it with the same code, so the pixels are the
//! same bytes. An image the fast path cannot plan (a PNG, a JPEG libjpeg-turbo cannot window)
//! is made here, as the fused operator makes it, and travels as pixels; so is one whose JPEG
//! is larger than its pixels, so that the wire never carries more than it would have.
//!
//! A task whose consumer makes only a share of its images (`Lease.client_image_share`) runs
//! [`ImagePlanning::maker`] on the rest: it makes each image as the fused operator does and
//! puts its pixels in a row, so that the task's batches hold rows of both kinds.
//!
//! The rows differ in length, so their batches are ragged along the field's first axis, as
//! `spec.batch.pad`'s are; the worker's delivery turns them into `Tensor.images`.

use super::decode::encoded_bytes;
use super::fused::{FusedCropOp, ImagePath, Planned};
use super::fused_resize::FusedResizeOp;
use crate::element::{Element, Value};
use crate::ops::{Fate, OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::OpConfig;
use granary_image::row::PLAN_BYTES;

/// The fused operator whose images are planned.
#[derive(Clone, Debug)]
enum Fused {
    Crop(FusedCropOp),
    Resize(FusedResizeOp),
}

/// The planning form of a pipeline's final fused image run.
pub struct ImagePlanning {
    /// Runs in place of the fused operator on the images the consumer makes.
    pub op: Box<dyn Operator>,
    /// Runs in place of the fused operator on the other images of a task whose consumer makes
    /// a share of them: makes the image and puts its pixels in a row.
    pub maker: Box<dyn Operator>,
    /// The image field.
    pub field: String,
    /// The images' output height.
    pub height: usize,
    /// The images' output width.
    pub width: usize,
}

impl ImagePlanning {
    /// The planning form of the fused image run that is the whole of `configs` (the pipeline's
    /// last stages, a final `float32` normalization already left to the consumer): `None` when
    /// `configs` is not one such run, or when its output is not what a plan's execution makes
    /// (a normalization of its own, an output size that differs between images).
    pub fn of(configs: &[OpConfig], path: ImagePath) -> Option<ImagePlanning> {
        if path != ImagePath::Fused {
            return None;
        }
        let (fused, used, field, (height, width)) = if let Some((op, used)) = FusedCropOp::fuse(configs, path)
        {
            let (field, output) = (op.field().to_string(), op.planned_output()?);
            (Fused::Crop(op), used, field, output)
        } else {
            let (op, used) = FusedResizeOp::fuse(configs, path)?;
            let (field, output) = (op.field().to_string(), op.planned_output()?);
            (Fused::Resize(op), used, field, output)
        };
        if used != configs.len() {
            return None;
        }
        let op = PlanningOp { fused, field: field.clone(), height, width, make: false };
        let maker = PlanningOp { make: true, ..op.clone() };
        Some(ImagePlanning { op: Box::new(op), maker: Box::new(maker), field, height, width })
    }
}

/// The fused operator's planning form: see the module's documentation.
#[derive(Clone, Debug)]
struct PlanningOp {
    fused: Fused,
    field: String,
    height: usize,
    width: usize,
    /// Make every image here and send its pixels as a row ([`ImagePlanning::maker`]).
    make: bool,
}

impl PlanningOp {
    fn plan(
        &self,
        element: &Element,
        rng: &mut SeededRng,
        filter: bool,
    ) -> Result<(Planned, Vec<u8>), OpError> {
        let bytes = encoded_bytes(element, &self.field)?;
        // The wire never gets heavier: a JPEG larger than the image it makes is made here. (The
        // parts' size bound, which the consumers' streams enforce, counts pixels.)
        if PLAN_BYTES + bytes.len() > 1 + self.height * self.width * 3 {
            return Ok((Planned::Unplannable, Vec::new()));
        }
        let planned = match &self.fused {
            Fused::Crop(op) => op.plan(bytes, rng, filter)?,
            Fused::Resize(op) => op.plan(bytes, rng)?,
        };
        let mut row = Vec::new();
        if let Planned::Image(plan) = &planned {
            granary_image::row::encode_planned(plan, bytes, &mut row).map_err(OpError::new)?;
        }
        Ok((planned, row))
    }

    fn process(&self, element: &mut Element, rng: &mut SeededRng, filter: bool) -> Result<Fate, OpError> {
        let planned =
            if self.make { (Planned::Unplannable, Vec::new()) } else { self.plan(element, rng, filter)? };
        let row = match planned {
            (Planned::Image(_), row) => row,
            (Planned::Dropped, _) => return Ok(Fate::Drop),
            // Nothing was drawn for an image that cannot be planned, or that is made here: the
            // fused operator makes it with the same draws.
            (Planned::Unplannable, _) => {
                let fate = match &self.fused {
                    Fused::Crop(op) if filter => op.run(element, rng)?,
                    Fused::Crop(op) => op.apply(element, rng).map(|()| Fate::Keep)?,
                    Fused::Resize(op) => op.apply(element, rng).map(|()| Fate::Keep)?,
                };
                if fate == Fate::Drop {
                    return Ok(fate);
                }
                self.pixel_row(element)?
            }
        };
        let len = row.len();
        element.set(
            &self.field,
            Value::Tensor(Tensor { shape: vec![len], data: TensorData::U8(SmallVec::from_vec(row)) }),
        );
        Ok(Fate::Keep)
    }

    /// The row of the pixels the fused operator put in the field.
    fn pixel_row(&self, element: &Element) -> Result<Vec<u8>, OpError> {
        let field = &self.field;
        match element.get(field) {
            Some(Value::Tensor(Tensor { shape, data: TensorData::U8(pixels) }))
                if shape[..] == [self.height, self.width, 3] =>
            {
                let mut row = Vec::new();
                granary_image::row::encode_pixels(pixels, &mut row);
                Ok(row)
            }
            _ => Err(OpError::new(format!(
                "field `{field}` is not the {}×{} uint8 image the fused image run makes",
                self.width, self.height
            ))),
        }
    }
}

impl Operator for PlanningOp {
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
    use crate::seed::Stream;
    use granary_image::test_images::pattern;

    fn encoded(format: image::ImageFormat, height: usize, width: usize) -> Vec<u8> {
        let pixels = pattern(height, width);
        let img = image::RgbImage::from_raw(width as u32, height as u32, pixels).unwrap();
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    #[test]
    fn only_a_final_run_that_makes_pixels_is_planned() {
        let planned =
            |yaml: &str| ImagePlanning::of(&configs(yaml), ImagePath::Fused).map(|p| (p.height, p.width));
        assert_eq!(
            planned("[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.flip}]"),
            Some((8, 8))
        );
        assert_eq!(
            planned("[{op: image.decode}, {op: image.resize, size: 9}, {op: image.center_crop, size: 7}]"),
            Some((7, 7))
        );
        assert_eq!(planned("[{op: image.decode}, {op: image.resize, size: 9}]"), None, "sizes differ");
        assert_eq!(
            planned(
                "[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: image.normalize, dtype: uint8, layout: CHW}]"
            ),
            None,
            "a normalization of its own"
        );
        let rrc = configs("[{op: image.decode}, {op: image.random_resized_crop, size: 8}]");
        assert!(ImagePlanning::of(&rrc, ImagePath::Separate).is_none());
        assert!(ImagePlanning::of(&rrc, ImagePath::DecodeOnly).is_none());
        let more = configs(
            "[{op: image.decode}, {op: image.random_resized_crop, size: 8}, {op: filter, predicate: image.min_size, minWidth: 1}]",
        );
        assert!(ImagePlanning::of(&more, ImagePath::Fused).is_none(), "not the last stage");
    }

    /// A planned row executes to the fused operator's pixels, for a JPEG it plans and for what
    /// it makes itself (a PNG, a JPEG larger than its pixels), with the same draws either way.
    #[test]
    fn a_planned_element_executes_to_the_fused_operators_pixels() {
        use granary_image::row::{PIXELS, PLANNED};
        let jpeg = encoded(image::ImageFormat::Jpeg, 40, 52);
        let png = encoded(image::ImageFormat::Png, 31, 20);
        for (size, resize) in [(48, 56), (6, 7)] {
            for yaml in [
                format!(
                    "[{{op: image.decode}}, {{op: image.random_resized_crop, size: {size}}}, {{op: image.flip}}]"
                ),
                format!(
                    "[{{op: image.decode}}, {{op: image.resize, size: {resize}}}, {{op: image.center_crop, size: {size}}}, {{op: image.flip}}]"
                ),
            ] {
                let stages = configs(&yaml);
                let planning = ImagePlanning::of(&stages, ImagePath::Fused).unwrap();
                let (fused, _) = crate::ops::image::fuse_run(&stages, ImagePath::Fused, false).unwrap();
                // At 6×6, the JPEG is larger than its pixels: made here.
                let planned = if size * size * 3 < jpeg.len() { PIXELS } else { PLANNED };
                let cases = [(&jpeg, planned), (&png, PIXELS)];
                for (i, (bytes, kind)) in cases.into_iter().enumerate() {
                    for seed in 0..6 {
                        let mut element = Element::new(format!("{i}"));
                        element.set("image", Value::Bytes(bytes.clone().into()));
                        let mut made = element.clone();
                        let rng = || SeededRng::new(seed, Stream::SplitOrder, &[i as u64]);
                        assert_eq!(fused.run(&mut made, &mut rng()).unwrap(), Fate::Keep);
                        let mut row_made = element.clone();
                        assert_eq!(planning.op.run(&mut element, &mut rng()).unwrap(), Fate::Keep);
                        assert_eq!(planning.maker.run(&mut row_made, &mut rng()).unwrap(), Fate::Keep);
                        let Some(Value::Tensor(Tensor { data: TensorData::U8(row), .. })) =
                            element.get("image")
                        else {
                            panic!("no row")
                        };
                        assert_eq!(row[0], kind, "{yaml}, image {i}");
                        let mut out = vec![0; size * size * 3];
                        granary_image::row::execute(row, size, size, &mut out).unwrap();
                        let Some(Value::Tensor(Tensor { data: TensorData::U8(pixels), .. })) =
                            made.get("image")
                        else {
                            panic!("no pixels")
                        };
                        assert_eq!(out[..], pixels[..], "{yaml}, image {i}, seed {seed}");
                        // The maker's row holds the same pixels, made here.
                        let Some(Value::Tensor(Tensor { data: TensorData::U8(row), .. })) =
                            row_made.get("image")
                        else {
                            panic!("no row made")
                        };
                        assert_eq!(row[0], PIXELS);
                        assert_eq!(&row[1..], pixels.as_slice(), "{yaml}, image {i}, seed {seed}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_fused_size_filter_drops_from_the_header() {
        let stages = configs(
            "[{op: image.decode}, {op: filter, predicate: image.min_size, minWidth: 60}, {op: image.random_resized_crop, size: 8}]",
        );
        let planning = ImagePlanning::of(&stages, ImagePath::Fused).unwrap();
        let mut element = Element::new("small");
        element.set("image", Value::Bytes(encoded(image::ImageFormat::Jpeg, 40, 52).into()));
        let mut rng = SeededRng::new(1, Stream::SplitOrder, &[]);
        assert_eq!(planning.op.run(&mut element, &mut rng).unwrap(), Fate::Drop);
    }
}
