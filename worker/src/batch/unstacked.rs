//! One field of a batch left in its elements' buffers, for the [`super::Finish`] that rewrites it.
//!
//! A pipeline whose final `float32` normalization is finished per batch would otherwise stack its
//! `uint8` images into the batch (a copy of each image, on the assembler's one thread) only for
//! the finisher to read that copy once and write the `float32` batch. Left unstacked, the images
//! wait as they are, each in the buffer its element computed it into, and the finisher reads
//! them from there: on the training recipe the assembler's copy was 2% of the worker's CPU time.

use super::Batch;

/// The rows of one field of a [`Batch`], each its element's own buffer, in batch order; the
/// field's [`super::BatchTensor`] keeps its dtype and shape, with no data, meanwhile.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Unstacked {
    /// Index of the field in [`Batch::tensors`].
    pub(crate) tensor: usize,
    /// One buffer per element, each the field's bytes of one row.
    pub(crate) rows: Vec<Vec<u8>>,
}

impl Unstacked {
    /// Bytes of the rows.
    pub(crate) fn nbytes(&self) -> usize {
        self.rows.iter().map(Vec::len).sum()
    }
}

impl Batch {
    /// Stacks a field left unstacked into its tensor's one buffer; a batch whose fields are all
    /// stacked stays as it is. Whatever reads a batch's tensors before the finisher does calls
    /// this first.
    pub(crate) fn stack(&mut self) {
        let Some(Unstacked { tensor, rows }) = self.unstacked.take() else { return };
        let Some(t) = self.tensors.get_mut(tensor) else { return };
        let mut data = crate::buffers::take(rows.iter().map(Vec::len).sum());
        for row in &rows {
            data.extend_from_slice(row);
        }
        crate::buffers::give(std::mem::replace(&mut t.data, data));
    }
}
