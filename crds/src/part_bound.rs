//! The largest batch part a pipeline can stream, as far as its spec fixes it: the limit a worker
//! encodes streamed messages with, and a consumer may decode them with.
//!
//! A pipeline's output is static when every batched field has a shape and dtype the spec alone
//! decides: images decoded from `files` or `webdataset` samples and cropped to a fixed square
//! (`image.center_crop`, `image.random_resized_crop`), with at most a scalar `int64` label beside
//! them. Then a part (at most `spec.batch.size` rows) is bounded by rows × bytes per element,
//! plus the element keys and the message framing. Any other pipeline (text, tables, Python
//! stages, images without a fixed-size crop, mixed sources) gets the caller's cap.

use crate::InputPipelineSpec;
use crate::ops::OpConfig;
use crate::ops::image::ImageDType;
use crate::source::SourceFormat;

/// Longest element key allowed for in a static bound: an object key or path (S3 keys are at most
/// 1,024 bytes, Linux paths 4,096).
pub const MAX_KEY_BYTES: u64 = 4096;
/// Framing per element: the key's tag and length prefix, and for an image the consumer makes
/// (`Tensor.images`), its row's kind byte and length (its plan and JPEG are never larger than its
/// pixels).
const KEY_FRAMING_BYTES: u64 = 32;
/// Framing per part: its header, and each tensor's name, dtype, shape and normalization tables.
const PART_FRAMING_BYTES: u64 = 64 << 10;
/// Bytes of the scalar `int64` label a `files` or `webdataset` sample may carry.
const LABEL_BYTES: u64 = 8;
/// Channels of a decoded image (RGB).
const CHANNELS: u64 = 3;

/// How a pipeline's largest batch part is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartBound {
    /// The output shapes are static.
    Static {
        /// Rows of a part, at most: `spec.batch.size`.
        rows: u64,
        /// Tensor bytes of one element (its images and its label).
        element_bytes: u64,
        /// The bound: rows × (element bytes + key and framing) + part framing.
        bytes: u64,
    },
    /// The output shapes depend on the data: only a cap applies.
    Capped,
}

impl PartBound {
    /// The bound of `spec`'s parts.
    pub fn of(spec: &InputPipelineSpec) -> PartBound {
        match element_bytes(spec) {
            Some(element_bytes) => {
                let rows = u64::from(spec.batch.size.max(1));
                let per_row = element_bytes.saturating_add(MAX_KEY_BYTES + KEY_FRAMING_BYTES);
                let bytes = rows.saturating_mul(per_row).saturating_add(PART_FRAMING_BYTES);
                PartBound::Static { rows, element_bytes, bytes }
            }
            None => PartBound::Capped,
        }
    }

    /// The bound of the pipeline in `manifest_json` (an `InputPipeline` as JSON, as the
    /// dispatcher keeps and sends it); [`PartBound::Capped`] when it does not parse.
    pub fn of_manifest_json(manifest_json: &str) -> PartBound {
        serde_json::from_str::<crate::InputPipeline>(manifest_json)
            .map_or(PartBound::Capped, |manifest| PartBound::of(&manifest.spec))
    }

    /// The message limit to use: the static bound, never above `cap`; `cap` otherwise.
    pub fn limit(&self, cap: usize) -> usize {
        match self {
            PartBound::Static { bytes, .. } => usize::try_from(*bytes).map_or(cap, |b| b.min(cap)),
            PartBound::Capped => cap,
        }
    }
}

/// What is known of one image field while walking the stages.
#[derive(Clone, Copy)]
struct Image {
    /// Side of the square it is cropped to, once a fixed-size crop ran.
    side: Option<u64>,
    /// Bytes per value.
    dtype_bytes: u64,
}

/// Tensor bytes of one element, when the spec fixes them.
fn element_bytes(spec: &InputPipelineSpec) -> Option<u64> {
    if spec.is_mixed() || spec.batch.pad.is_some() {
        return None;
    }
    let source = spec.source.as_ref()?;
    if !matches!(source.format, SourceFormat::Files | SourceFormat::Webdataset) {
        return None;
    }
    // Samples of these formats hold bytes (not batchable until decoded), text (never batchable)
    // and at most one scalar label: the batched fields are the decoded images and the label.
    let mut images: Vec<(String, Image)> = Vec::new();
    for (i, stage) in spec.stages.iter().enumerate() {
        let op = OpConfig::parse(stage, &format!("spec.stages[{i}]")).ok()?;
        match op {
            OpConfig::ImageDecode(d) => {
                let fresh = Image { side: None, dtype_bytes: 1 };
                match find(&images, &d.field) {
                    Some(at) => images[at].1 = fresh,
                    None => images.push((d.field, fresh)),
                }
            }
            OpConfig::ImageResize(r) => {
                // The shorter side only: the other one follows the image's aspect ratio.
                let at = find(&images, &r.field)?;
                images[at].1.side = None;
            }
            OpConfig::ImageCenterCrop(c) => {
                let at = find(&images, &c.field)?;
                images[at].1.side = Some(u64::from(c.size));
            }
            OpConfig::ImageRandomResizedCrop(c) => {
                let at = find(&images, &c.field)?;
                images[at].1.side = Some(u64::from(c.size));
            }
            OpConfig::ImageFlip(f) => {
                find(&images, &f.field)?;
            }
            OpConfig::ImageNormalize(n) => {
                let at = find(&images, &n.field)?;
                images[at].1.dtype_bytes = match n.dtype {
                    ImageDType::Uint8 => 1,
                    ImageDType::Float32 => 4,
                };
            }
            // Filters drop elements and change no shape.
            OpConfig::Filter(_) | OpConfig::PythonFilter(_) => {}
            _ => return None,
        }
    }
    if images.is_empty() {
        return None;
    }
    images.iter().try_fold(LABEL_BYTES, |sum, (_, image)| {
        let side = image.side?;
        Some(sum.saturating_add(side.saturating_mul(side).saturating_mul(CHANNELS * image.dtype_bytes)))
    })
}

/// Where `field` is among the decoded images.
fn find(images: &[(String, Image)], field: &str) -> Option<usize> {
    images.iter().position(|(name, _)| name == field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> InputPipelineSpec {
        serde_norway::from_str(yaml).expect("a spec")
    }

    const IMAGES: &str = "source: {url: 'file:///d/', format: files}\nbatch: {size: 128}\n";

    #[test]
    fn a_fixed_size_image_pipeline_gets_a_tight_bound() {
        let s = spec(&format!(
            "{IMAGES}stages: [{{op: image.decode}}, {{op: image.random_resized_crop, size: 224}}, \
             {{op: image.flip}}, {{op: image.normalize, dtype: float32, layout: CHW}}]"
        ));
        let PartBound::Static { rows, element_bytes, bytes } = PartBound::of(&s) else { panic!("static") };
        assert_eq!(rows, 128);
        assert_eq!(element_bytes, 224 * 224 * 3 * 4 + 8);
        let tensors = 128 * 224 * 224 * 3 * 4;
        assert!(bytes > tensors && bytes < tensors + tensors / 10, "{bytes} vs {tensors}");
        assert_eq!(PartBound::of(&s).limit(1 << 30), bytes as usize);
        assert_eq!(PartBound::of(&s).limit(1 << 20), 1 << 20, "never above the cap");
        // uint8 is a quarter of it, and a center crop is as fixed as a random one.
        let s = spec(&format!(
            "{IMAGES}stages: [{{op: image.decode}}, {{op: image.resize, size: 256}}, \
             {{op: image.center_crop, size: 224}}, {{op: image.normalize, dtype: uint8}}]"
        ));
        assert!(matches!(PartBound::of(&s), PartBound::Static { element_bytes: 150_536, .. }));
    }

    #[test]
    fn variable_outputs_get_the_cap() {
        let resized_only = format!("{IMAGES}stages: [{{op: image.decode}}, {{op: image.resize, size: 256}}]");
        let cropped_then_resized = format!(
            "{IMAGES}stages: [{{op: image.decode}}, {{op: image.center_crop, size: 224}}, \
             {{op: image.resize, size: 256}}]"
        );
        let python = format!(
            "{IMAGES}stages: [{{op: image.decode}}, {{op: image.center_crop, size: 224}}, \
             {{op: python.map, function: 'm:f'}}]"
        );
        let text = "source: {url: 'file:///d/', format: jsonl}\nbatch: {size: 8}\n\
                    stages: [{op: test.sleep, ms: 1}]";
        for yaml in [resized_only.as_str(), cropped_then_resized.as_str(), python.as_str(), text] {
            assert_eq!(PartBound::of(&spec(yaml)), PartBound::Capped, "{yaml}");
            assert_eq!(PartBound::of(&spec(yaml)).limit(1 << 30), 1 << 30);
        }
    }
}
