//! Image operators: decode, resize, crops, flip, normalize (ImageNet-style preprocessing).

use super::default_image_field;
use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `image.decode`: decodes JPEG or PNG bytes into an RGB `uint8` image (height × width × 3).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decode {
    /// Field holding the encoded bytes, replaced by the decoded image. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// `image.resize`: resizes so that the shorter side is `size`, keeping the aspect ratio
/// (bilinear, antialiased when shrinking).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resize {
    /// Target length of the shorter side, in pixels.
    pub size: u32,
    /// Image field. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// `image.center_crop`: crops a `size` × `size` square from the centre.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CenterCrop {
    /// Side of the square crop, in pixels.
    pub size: u32,
    /// Image field. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// `image.random_resized_crop`: torchvision's RandomResizedCrop: a random box covering a
/// fraction `scale` of the area with aspect ratio in `ratio` (log-uniform), resized to
/// `size` × `size` (bilinear, antialiased).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RandomResizedCrop {
    /// Output side, in pixels.
    pub size: u32,
    /// Range of the crop's area as a fraction of the image's. Defaults to `[0.08, 1.0]`.
    #[serde(default = "default_scale")]
    pub scale: [f64; 2],
    /// Range of the crop's aspect ratio (width / height). Defaults to `[0.75, 1.3333]`.
    #[serde(default = "default_ratio")]
    pub ratio: [f64; 2],
    /// Image field. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// `image.flip`: mirrors the image left to right with probability `p`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Flip {
    /// Probability of flipping. Defaults to 0.5.
    #[serde(default = "default_p")]
    pub p: f64,
    /// Image field. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// `image.normalize`: converts to the output tensor: `float32` computes `(x / 255 - mean) / std`
/// per channel; `uint8` keeps the pixel values. `layout` orders the axes.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Normalize {
    /// Per-channel mean on the 0–1 scale (3 values, or 1 for all channels). Only for `float32`.
    /// Defaults to `[0, 0, 0]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Vec<f64>>,
    /// Per-channel standard deviation on the 0–1 scale (3 values, or 1), each > 0. Only for
    /// `float32`. Defaults to `[1, 1, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<Vec<f64>>,
    /// Output element type: `float32` or `uint8`. Defaults to `float32`.
    #[serde(default)]
    pub dtype: ImageDType,
    /// Axis order of the output: `HWC` (height, width, channels) or `CHW`. Defaults to `HWC`.
    #[serde(default)]
    pub layout: Layout,
    /// Image field. Defaults to `image`.
    #[serde(default = "default_image_field")]
    pub field: String,
}

/// Element type of a normalized image.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ImageDType {
    /// Pixel values 0–255.
    Uint8,
    /// `(x / 255 - mean) / std`.
    #[default]
    Float32,
}

/// Axis order of an image tensor.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Layout {
    /// Height, width, channels.
    #[default]
    HWC,
    /// Channels, height, width (PyTorch's convention).
    CHW,
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_p() -> f64 {
    0.5
}

fn check_size(size: u32, path: &str, problems: &mut Vec<Problem>) {
    if size == 0 {
        problems.push(Problem::new(format!("{path}.size"), "must be > 0"));
    } else if size > 16384 {
        problems.push(Problem::new(format!("{path}.size"), "must be at most 16384 pixels"));
    }
}

fn check_field(field: &str, path: &str, problems: &mut Vec<Problem>) {
    if field.is_empty() {
        problems.push(Problem::new(format!("{path}.field"), "must not be empty"));
    }
}

impl Decode {
    /// The `op` name: `image.decode`.
    pub const OP: &str = "image.decode";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_field(&self.field, path, problems);
    }
}

impl Resize {
    /// The `op` name: `image.resize`.
    pub const OP: &str = "image.resize";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_size(self.size, path, problems);
        check_field(&self.field, path, problems);
    }
}

impl CenterCrop {
    /// The `op` name: `image.center_crop`.
    pub const OP: &str = "image.center_crop";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_size(self.size, path, problems);
        check_field(&self.field, path, problems);
    }
}

impl RandomResizedCrop {
    /// The `op` name: `image.random_resized_crop`.
    pub const OP: &str = "image.random_resized_crop";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_size(self.size, path, problems);
        check_field(&self.field, path, problems);
        let [lo, hi] = self.scale;
        if !(lo > 0.0 && lo <= hi && hi <= 1.0) {
            problems.push(Problem::new(
                format!("{path}.scale"),
                format!("must be [min, max] with 0 < min <= max <= 1, got [{lo}, {hi}]"),
            ));
        }
        let [lo, hi] = self.ratio;
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            problems.push(Problem::new(
                format!("{path}.ratio"),
                format!("must be [min, max] with 0 < min <= max, got [{lo}, {hi}]"),
            ));
        }
    }
}

impl Flip {
    /// The `op` name: `image.flip`.
    pub const OP: &str = "image.flip";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_field(&self.field, path, problems);
        if !(0.0..=1.0).contains(&self.p) {
            problems.push(Problem::new(
                format!("{path}.p"),
                format!("must be a probability between 0 and 1, got {}", self.p),
            ));
        }
    }
}

impl Normalize {
    /// The `op` name: `image.normalize`.
    pub const OP: &str = "image.normalize";

    /// Per-channel mean for 3 channels.
    pub fn mean3(&self) -> [f32; 3] {
        per_channel(self.mean.as_deref(), 0.0)
    }

    /// Per-channel standard deviation for 3 channels.
    pub fn std3(&self) -> [f32; 3] {
        per_channel(self.std.as_deref(), 1.0)
    }

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_field(&self.field, path, problems);
        for (name, values) in [("mean", &self.mean), ("std", &self.std)] {
            let Some(values) = values else { continue };
            if self.dtype == ImageDType::Uint8 {
                problems.push(Problem::new(
                    format!("{path}.{name}"),
                    "applies only to `dtype: float32`; remove it or set `dtype: float32`",
                ));
            } else if values.len() != 3 && values.len() != 1 {
                problems.push(Problem::new(
                    format!("{path}.{name}"),
                    format!("must have 3 values (one per RGB channel) or 1, got {}", values.len()),
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if !v.is_finite() || (name == "std" && *v <= 0.0) {
                    let rule = if name == "std" { "> 0" } else { "finite" };
                    problems.push(Problem::new(
                        format!("{path}.{name}[{i}]"),
                        format!("must be {rule}, got {v}"),
                    ));
                }
            }
        }
    }
}

fn per_channel(values: Option<&[f64]>, default: f32) -> [f32; 3] {
    match values {
        Some([v]) => [*v as f32; 3],
        Some([a, b, c]) => [*a as f32, *b as f32, *c as f32],
        _ => [default; 3],
    }
}
