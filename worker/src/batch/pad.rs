//! Padding of variable-length fields (`spec.batch.pad`). Batches are stacked *ragged*: the rows
//! of the padded fields lie back to back, unpadded, with their lengths beside them. A batch is
//! padded to one width, and gets its `uint8` mask, only where it is final: where the in-process
//! engine hands it out, or in the client once every part of a slot has arrived.

use super::{Batch, BatchTensor};
use crate::tensor::DType;
use granary_crds::batch::PadSpec;
use std::sync::Arc;

/// What `spec.batch.pad` asks for, as the batch builders use it.
#[derive(Clone, Debug, PartialEq)]
pub struct Padding {
    /// Fields padded along their first axis, all to one width per batch. They share one length
    /// in each element.
    pub fields: Vec<String>,
    /// The width is rounded up to a multiple of this (at least 1).
    pub multiple_of: usize,
    /// Value of padding positions, converted to each field's dtype.
    pub value: f64,
    /// Name of the mask field: 1 at the padded fields' real positions, 0 at padding.
    pub mask: String,
}

impl Padding {
    /// The padding of a validated `spec.batch.pad`.
    pub fn from_spec(spec: &PadSpec) -> Padding {
        Padding {
            fields: spec.fields.clone(),
            multiple_of: spec.multiple_of.unwrap_or(1).max(1) as usize,
            value: spec.value,
            mask: spec.mask_name(),
        }
    }

    /// Whether field `name` is padded.
    pub fn pads(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f == name)
    }

    /// The width of a batch whose longest element has `longest` positions.
    pub fn width(&self, longest: usize) -> usize {
        longest.div_ceil(self.multiple_of) * self.multiple_of
    }
}

/// The rows of a batch's padded fields before padding.
#[derive(Clone, Debug, PartialEq)]
pub struct Ragged {
    /// Each row's length along the padded fields' first axis. A padded field's tensor holds
    /// these rows back to back, and its shape is `[rows, longest row, ...]`.
    pub lengths: Vec<usize>,
    /// The padding to apply.
    pub padding: Arc<Padding>,
}

impl Ragged {
    /// The longest row.
    pub fn longest(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    /// The byte offset of each row start in a padded field of `per` bytes per position, and the
    /// end: `rows + 1` offsets.
    pub fn offsets(&self, per: usize) -> Vec<usize> {
        let mut offsets = Vec::with_capacity(self.lengths.len() + 1);
        let mut at = 0;
        offsets.push(0);
        for &len in &self.lengths {
            at += len * per;
            offsets.push(at);
        }
        offsets
    }
}

/// The little-endian bytes of `value` as one `dtype` element.
pub(super) fn fill_bytes(dtype: DType, value: f64) -> Vec<u8> {
    match dtype {
        DType::Uint8 => vec![value as u8],
        DType::Int32 => (value as i32).to_le_bytes().to_vec(),
        DType::Int64 => (value as i64).to_le_bytes().to_vec(),
        DType::Float32 => (value as f32).to_le_bytes().to_vec(),
        DType::Float64 => value.to_le_bytes().to_vec(),
    }
}

/// Bytes per position of a padded tensor: the product of its axes after the first two, times
/// the dtype's size.
pub(super) fn per_position(t: &BatchTensor) -> usize {
    t.shape.get(2..).unwrap_or_default().iter().product::<usize>() * t.dtype.size()
}

/// Lays out rows of `data` (row `r` holding `lengths[r]` positions of `per` bytes, one after
/// another) as `rows × width` positions, filling the rest of each row with `fill`.
pub(super) fn pad_rows(data: &[u8], lengths: &[usize], per: usize, width: usize, fill: &[u8]) -> Vec<u8> {
    let mut out = crate::buffers::take(lengths.len() * width * per);
    let mut at = 0;
    for &len in lengths {
        let n = len * per;
        out.extend_from_slice(&data[at..at + n]);
        at += n;
        let missing = (width - len) * per;
        if fill.iter().all(|&b| b == 0) {
            out.resize(out.len() + missing, 0);
        } else {
            out.extend(fill.iter().copied().cycle().take(missing));
        }
    }
    out
}

/// The mask of rows of `lengths` at `width`: 1 at real positions, 0 at padding.
pub(super) fn mask(lengths: &[usize], width: usize) -> Vec<u8> {
    let mut mask = crate::buffers::take(lengths.len() * width);
    for &len in lengths {
        mask.resize(mask.len() + len, 1);
        mask.resize(mask.len() + (width - len), 0);
    }
    mask
}

/// Pads a ragged batch's padded fields to its width (its longest row, rounded up to
/// `multipleOf`) and appends the mask; a dense batch is left as it is.
pub(super) fn pad_batch(batch: &mut Batch) {
    let Some(ragged) = batch.ragged.take() else { return };
    let padding = &ragged.padding;
    let width = padding.width(ragged.longest());
    for t in batch.tensors.iter_mut().filter(|t| padding.pads(&t.name)) {
        let per = per_position(t);
        let fill = fill_bytes(t.dtype, padding.value);
        let padded = pad_rows(&t.data, &ragged.lengths, per, width, &fill);
        crate::buffers::give(std::mem::replace(&mut t.data, padded));
        if let Some(axis) = t.shape.get_mut(1) {
            *axis = width;
        }
    }
    batch.tensors.push(BatchTensor {
        name: padding.mask.clone(),
        dtype: DType::Uint8,
        shape: vec![ragged.lengths.len(), width],
        data: mask(&ragged.lengths, width),
    });
}
