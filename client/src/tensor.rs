//! A batch's stacked fields as the trainer receives them.

use bytes::Bytes;

/// A stacked field of a batch. The leading axis is the batch's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Field name.
    pub name: String,
    /// `uint8`, `int32`, `int64`, `float32` or `float64`.
    pub dtype: String,
    /// Dimensions, leading axis first.
    pub shape: Vec<usize>,
    /// Row-major little-endian values.
    pub data: Bytes,
}

/// `shape` as in-memory dimensions; an error names a dimension too large for this host.
pub(crate) fn dimensions(shape: &[u64]) -> Result<Vec<usize>, String> {
    shape
        .iter()
        .map(|&dimension| {
            usize::try_from(dimension).map_err(|_| format!("dimension {dimension} is too large"))
        })
        .collect()
}
