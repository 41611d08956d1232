//! Image operators: decode, resize, crops, flip and normalize (ImageNet-style preprocessing).
//!
//! A decoded image is a [`Value::Tensor`] of dtype `uint8` and shape `[height, width, 3]`
//! (row-major HWC, RGB). Every operator but `image.decode` reads such a tensor from its
//! configured field and writes its result back to the same field; `image.normalize` produces
//! the final tensor (`float32` or `uint8`, HWC or CHW) and so comes last.
//!
//! The helpers here read and write that field and name what is wrong with an element (missing
//! field, encoded bytes where a decoded image belongs, wrong dtype or shape) together with the
//! fix, so that every operator reports problems the same way.

pub mod crop;
pub mod decode;
pub mod flip;
pub mod flip_normalize;
pub mod fused;
pub mod fused_resize;
pub mod normalize;
pub mod planning;
pub mod resize;

use crate::element::{Element, Value};
use crate::ops::OpError;
use crate::tensor::{SmallVec, Tensor, TensorData};

/// The fused operator that runs the stages at the start of `configs` in one pass, with how many
/// it takes: decode with a random crop (and the flip and normalization after it), or a flip and
/// the normalization after it; none on the reference path ([`fused::ImagePath::Separate`]).
/// The deterministic decode → resize → centre crop run stays separate here: see [`fuse_run`].
pub fn fuse(
    configs: &[granary_crds::OpConfig],
    path: fused::ImagePath,
) -> Option<(Box<dyn crate::ops::Operator>, usize)> {
    fuse_run(configs, path, true)
}

/// As [`fuse`], and also decode with a resize and/or a centre crop (and the flip and
/// normalization after it, [`fused_resize::FusedResizeOp`]) unless `keep_cuts` is set.
///
/// `keep_cuts` says that a cache may cut the pipeline after any stage of its deterministic
/// prefix (`policy: auto`), so those stages must stay apart: the decode → resize → centre crop
/// run is all deterministic. The random crop's run is fused regardless: only its decode could
/// be cached, which is never worth it.
pub fn fuse_run(
    configs: &[granary_crds::OpConfig],
    path: fused::ImagePath,
    keep_cuts: bool,
) -> Option<(Box<dyn crate::ops::Operator>, usize)> {
    if let Some((op, used)) = fused::FusedCropOp::fuse(configs, path) {
        return Some((Box::new(op), used));
    }
    if !keep_cuts && let Some((op, used)) = fused_resize::FusedResizeOp::fuse(configs, path) {
        return Some((Box::new(op), used));
    }
    if path == fused::ImagePath::Separate {
        return None;
    }
    flip_normalize::FlipNormalizeOp::fuse(configs)
        .map(|(op, used)| (Box::new(op) as Box<dyn crate::ops::Operator>, used))
}

pub use granary_image::{CropBox, MAX_PIXELS, MAX_SIDE, RgbView};

/// The error for an element that lacks the field an operator reads, listing the fields it has.
pub fn missing_field(op: &str, field: &str, element: &Element) -> OpError {
    let names: Vec<String> = element.fields.iter().map(|(n, _)| format!("`{n}`")).collect();
    let has = if names.is_empty() { "none".to_string() } else { names.join(", ") };
    OpError::new(format!(
        "`{op}`: the element has no field `{field}`; its fields are: {has}. Set the stage's \
         `field` to the one holding the image"
    ))
}

/// Checks that `shape` describes an image that is not empty and within [`MAX_SIDE`] and
/// [`MAX_PIXELS`]; `what` names it in the message.
pub fn check_dimensions(op: &str, what: &str, height: usize, width: usize) -> Result<(), OpError> {
    if height == 0 || width == 0 {
        return Err(OpError::new(format!(
            "`{op}`: {what} is empty ({height}×{width} pixels); drop such samples from the source"
        )));
    }
    if height > MAX_SIDE || width > MAX_SIDE || height.saturating_mul(width) > MAX_PIXELS {
        return Err(OpError::new(format!(
            "`{op}`: {what} would be {width}×{height} pixels, over the limit of {MAX_SIDE} \
             pixels a side and {MAX_PIXELS} pixels in all; lower `size` or drop oversized \
             samples from the source"
        )));
    }
    Ok(())
}

/// Describes what an image field holds when it is not what `op` needs, and the fix.
fn wrong_value(op: &str, field: &str, value: &Value) -> OpError {
    match value {
        Value::Bytes(_) => OpError::new(format!(
            "`{op}` needs a decoded image in field `{field}`, but it holds encoded bytes; add \
             `image.decode` before it"
        )),
        Value::Text(_) => OpError::new(format!(
            "`{op}` needs a decoded image in field `{field}`, but it holds text; set the \
             stage's `field` to the image field"
        )),
        Value::Tensor(t) => {
            let hint = if t.dtype() != crate::tensor::DType::Uint8 {
                "; `image.normalize` converts the image to its final form and must be the last \
                 image stage, so move this stage before it"
            } else if t.shape.len() == 3 && t.shape[0] == 3 && t.shape[2] != 3 {
                "; it looks like a CHW image made by `image.normalize`, which must be the last \
                 image stage, so move this stage before it"
            } else {
                "; add `image.decode` before it, or set `field` to the decoded image"
            };
            OpError::new(format!(
                "`{op}` needs a decoded image (uint8, shape [height, width, 3]) in field \
                 `{field}`, but it holds a {} tensor of shape {:?}{hint}",
                t.dtype().name(),
                t.shape
            ))
        }
    }
}

/// Whether `t` has shape `[height, width, 3]` with as many elements as the shape says.
fn is_hwc3(t: &Tensor) -> bool {
    t.shape.len() == 3 && t.shape[2] == 3 && t.len() == t.shape.iter().product::<usize>()
}

/// The decoded image in `field`: an RGB `uint8` tensor of shape `[height, width, 3]`.
pub fn rgb_u8<'a>(op: &str, element: &'a Element, field: &str) -> Result<RgbView<'a>, OpError> {
    let value = element.get(field).ok_or_else(|| missing_field(op, field, element))?;
    match value {
        Value::Tensor(t @ Tensor { data: TensorData::U8(data), .. }) if is_hwc3(t) => {
            Ok(RgbView { height: t.shape[0], width: t.shape[1], data })
        }
        other => Err(wrong_value(op, field, other)),
    }
}

/// The image tensor in `field`, mutably, when it is `[height, width, 3]` of dtype `uint8` or
/// `float32` (the two element types an HWC image can have in a pipeline).
pub fn hwc_tensor_mut<'a>(
    op: &str,
    element: &'a mut Element,
    field: &str,
) -> Result<&'a mut Tensor, OpError> {
    let Some(value) = element.get(field) else {
        return Err(missing_field(op, field, element));
    };
    let ok = matches!(
        value,
        Value::Tensor(t @ Tensor { data: TensorData::U8(_) | TensorData::F32(_), .. }) if is_hwc3(t)
    );
    if !ok {
        return Err(wrong_value(op, field, value));
    }
    match element.get_mut(field) {
        Some(Value::Tensor(t)) => Ok(t),
        // Unreachable: the field was just found holding a tensor.
        _ => Err(OpError::new(format!("`{op}`: field `{field}` changed while being read"))),
    }
}

/// An RGB `uint8` image value of shape `[height, width, 3]`; `data` must hold
/// `height * width * 3` bytes.
pub fn rgb_value(height: usize, width: usize, data: Vec<u8>) -> Value {
    Value::Tensor(Tensor { shape: vec![height, width, 3], data: TensorData::U8(SmallVec::from_vec(data)) })
}

/// Resizes the `region` of `src` (the whole image when `None`) to `out_height × out_width`
/// with bilinear interpolation, antialiased when shrinking (PIL's and torchvision's
/// `antialias=True` convolution). The region is read in place, as if cropped first: the filter
/// does not reach pixels outside it.
pub fn resize_rgb(
    op: &str,
    src: RgbView<'_>,
    region: Option<CropBox>,
    out_height: usize,
    out_width: usize,
) -> Result<Vec<u8>, OpError> {
    check_dimensions(op, "the output image", out_height, out_width)?;
    check_dimensions(op, "the input image", src.height, src.width)?;
    granary_image::resize_region(src, region, out_height, out_width)
        .map_err(|why| OpError::new(format!("`{op}`: {why}")))
}

#[cfg(test)]
pub(crate) use granary_image::test_images;

/// A YAML list of stages, parsed as a spec's are (`s[i]` names each), for the image operators'
/// tests.
#[cfg(test)]
pub(crate) fn test_configs(yaml: &str) -> Vec<granary_crds::OpConfig> {
    let stages: Vec<granary_crds::StageSpec> = serde_norway::from_str(yaml).unwrap();
    stages
        .iter()
        .enumerate()
        .map(|(i, s)| granary_crds::OpConfig::parse(s, &format!("s[{i}]")).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    #[test]
    fn rgb_u8_reports_missing_field_bytes_and_wrong_tensors() {
        let mut e = Element::new("k");
        e.set("label", Value::Text("cat".into()));
        let err = rgb_u8("image.resize", &e, "image").unwrap_err();
        assert!(err.0.contains("no field `image`") && err.0.contains("`label`"), "{err}");

        e.set("image", Value::Bytes(bytes::Bytes::from_static(b"\xff\xd8\xff")));
        let err = rgb_u8("image.resize", &e, "image").unwrap_err();
        assert!(err.0.contains("add `image.decode` before it"), "{err}");

        e.set(
            "image",
            Value::Tensor(Tensor { shape: vec![3, 4, 5], data: TensorData::F32(smallvec![0.0; 60]) }),
        );
        let err = rgb_u8("image.flip", &e, "image").unwrap_err();
        assert!(err.0.contains("float32") && err.0.contains("move this stage before it"), "{err}");

        e.set("image", Value::Tensor(Tensor { shape: vec![4, 5], data: TensorData::U8(smallvec![0; 20]) }));
        assert!(rgb_u8("image.flip", &e, "image").is_err());

        // Shape and data length disagree: an error, not a panic later.
        e.set(
            "image",
            Value::Tensor(Tensor { shape: vec![4, 5, 3], data: TensorData::U8(smallvec![0; 59]) }),
        );
        assert!(rgb_u8("image.flip", &e, "image").is_err());

        e.set("image", rgb_value(4, 5, vec![7; 60]));
        let v = rgb_u8("image.flip", &e, "image").unwrap();
        assert_eq!((v.height, v.width, v.data.len()), (4, 5, 60));
    }

    #[test]
    fn check_dimensions_rejects_empty_and_huge() {
        assert!(check_dimensions("op", "x", 0, 5).is_err());
        assert!(check_dimensions("op", "x", MAX_SIDE + 1, 5).is_err());
        assert!(check_dimensions("op", "x", 5, MAX_SIDE + 1).is_err());
        assert!(check_dimensions("op", "x", MAX_SIDE, MAX_SIDE).is_ok());
    }
}
