//! Batches as the trainer receives them, and how they are put together from batch parts.

use bytes::BytesMut;
use granary_proto::v1::BatchPart;

use crate::pad::Column;
use crate::tensor::{Tensor, dimensions};

/// One batch of a consumer's epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The epoch it belongs to.
    pub epoch: u32,
    /// Its slot in the consumer's epoch plan.
    pub slot: u64,
    /// Element keys, in row order.
    pub keys: Vec<String>,
    /// The stacked fields.
    pub tensors: Vec<Tensor>,
    /// Tensor payload bytes this batch took on the wire: less than its tensors' bytes when the
    /// client finished a deferred `image.normalize`, or made images from the workers' plans.
    pub wire_bytes: u64,
}

/// A batch part as it arrived, with the tensor bytes it took on the wire: fewer or more than its
/// tensors hold now when its images were made on this host from the workers' plans.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Arrived {
    pub(crate) part: BatchPart,
    pub(crate) wire_bytes: u64,
}

impl From<BatchPart> for Arrived {
    /// A part taken as it came: its tensors are what crossed the wire.
    fn from(part: BatchPart) -> Arrived {
        let wire_bytes = part.tensors.iter().map(|t| t.data.len() as u64).sum();
        Arrived { part, wire_bytes }
    }
}

impl std::ops::Deref for Arrived {
    type Target = BatchPart;

    fn deref(&self) -> &BatchPart {
        &self.part
    }
}

impl Batch {
    /// Rows in the batch (the tensors' leading axis, else the number of keys).
    pub fn len(&self) -> usize {
        match self.tensors.first().and_then(|tensor| tensor.shape.first()) {
            Some(&rows) => rows,
            None => self.keys.len(),
        }
    }

    /// Whether the batch has no rows (the last round of an epoch may hold empty batches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes its tensors' values hold in memory.
    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(|tensor| tensor.data.len() as u64).sum()
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|tensor| tensor.name == name)
    }

    /// [`Batch::from_arrived`] of parts taken as they came.
    #[cfg(test)]
    pub(crate) fn from_parts(epoch: u32, slot: u64, parts: Vec<BatchPart>) -> Result<Batch, String> {
        Batch::from_arrived(epoch, slot, parts.into_iter().map(Arrived::from).collect())
    }

    /// Joins the parts of a slot, given in plan order, along the leading axis. A single part is
    /// used as is, without copying its data; a tensor whose final `image.normalize` the worker
    /// left to the client is normalized here, straight into the batch's buffer; the fields of
    /// `spec.batch.pad` are padded to the slot's longest row, and their mask added last.
    pub(crate) fn from_arrived(epoch: u32, slot: u64, arrived: Vec<Arrived>) -> Result<Batch, String> {
        let wire_bytes = arrived.iter().map(|a| a.wire_bytes).sum();
        let parts = arrived.into_iter().map(|a| a.part).collect::<Vec<_>>();
        let mut parts: Vec<BatchPart> = if parts.len() > 1 {
            // Empty parts carry nothing, and may carry no tensors at all.
            let (full, empty): (Vec<_>, Vec<_>) = parts.into_iter().partition(|part| part.hi > part.lo);
            if full.is_empty() { empty.into_iter().take(1).collect() } else { full }
        } else {
            parts
        };
        let Some(first) = parts.first() else {
            return Ok(Batch { epoch, slot, keys: Vec::new(), tensors: Vec::new(), wire_bytes: 0 });
        };
        let columns = first.tensors.len();
        if let Some(part) = parts.iter().find(|part| part.tensors.len() != columns) {
            return Err(format!(
                "part at {}..{} of split {} has {} tensors, the first part has {columns}",
                part.lo,
                part.hi,
                part.split,
                part.tensors.len(),
            ));
        }
        let keys = parts.iter_mut().flat_map(|part| std::mem::take(&mut part.keys)).collect();
        let mut pieces: Vec<Vec<granary_proto::v1::Tensor>> =
            (0..columns).map(|_| Vec::with_capacity(parts.len())).collect();
        for part in parts {
            for (column, tensor) in pieces.iter_mut().zip(part.tensors) {
                column.push(tensor);
            }
        }
        let columns = pieces
            .into_iter()
            .map(|column| match column.first().is_some_and(|t| t.padding.is_some()) {
                true => crate::pad::join(column).map(Column::Ragged),
                false => join(column).map(Column::Dense),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tensors = crate::pad::finish(columns)?;
        Ok(Batch { epoch, slot, keys, tensors, wire_bytes })
    }
}

/// Checks that the pieces of one tensor agree (name, dtype, finishing and row shape); returns
/// their rows and payload bytes.
fn check_alike(pieces: &[granary_proto::v1::Tensor]) -> Result<(u64, usize), String> {
    let Some(head) = pieces.first() else {
        return Err("a tensor with no parts".to_string());
    };
    let trailing = head.shape.get(1..).unwrap_or_default();
    let (mut rows, mut bytes) = (0u64, 0usize);
    for tensor in pieces {
        if tensor.name != head.name || tensor.dtype != head.dtype || tensor.normalize != head.normalize {
            return Err(format!(
                "tensor `{}` ({}) in one part is `{}` ({}) in another, or is finished differently",
                head.name, head.dtype, tensor.name, tensor.dtype
            ));
        }
        if tensor.shape.get(1..).unwrap_or_default() != trailing {
            return Err(format!(
                "tensor `{}` has shape {:?} in one part and {:?} in another",
                head.name, head.shape, tensor.shape
            ));
        }
        rows += tensor.shape.first().copied().unwrap_or_default();
        bytes += tensor.data.len();
    }
    Ok((rows, bytes))
}

/// Joins pieces of which some carry a deferred normalization. When all do alike, they are
/// normalized into the batch's buffer at once; a slot whose parts were placed differently (the
/// worker normalized some, per its lease, and left others to the client) has each deferred piece
/// normalized on its own, and then the pieces joined.
fn finish_and_join(pieces: Vec<granary_proto::v1::Tensor>) -> Result<Tensor, String> {
    if pieces.iter().all(|p| p.normalize.is_some() && p.normalize == pieces[0].normalize) {
        let (rows, _) = check_alike(&pieces)?;
        return crate::expand::normalize(&pieces, rows);
    }
    let finished = pieces
        .into_iter()
        .map(|piece| {
            if piece.normalize.is_none() {
                return Ok(piece);
            }
            let rows = piece.shape.first().copied().unwrap_or_default();
            let done = crate::expand::normalize(std::slice::from_ref(&piece), rows)?;
            Ok(granary_proto::v1::Tensor {
                name: done.name,
                dtype: done.dtype,
                shape: done.shape.iter().map(|&d| d as u64).collect(),
                data: done.data,
                normalize: None,
                padding: piece.padding,
                images: None,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    join(finished)
}

/// Joins the pieces of one tensor (one per part, same name, dtype and row shape) along rows,
/// finishing those the worker left to the client.
fn join(mut pieces: Vec<granary_proto::v1::Tensor>) -> Result<Tensor, String> {
    if pieces.iter().any(|p| p.normalize.is_some()) {
        let stretch = crate::host::Finishing::start();
        let joined = finish_and_join(pieces);
        stretch.end();
        return joined;
    }
    let (rows, bytes) = check_alike(&pieces)?;
    let trailing = pieces[0].shape.get(1..).unwrap_or_default();
    let shape = std::iter::once(rows).chain(trailing.iter().copied()).collect::<Vec<_>>();
    let shape = dimensions(&shape)?;
    let data = if pieces.len() == 1 {
        std::mem::take(&mut pieces[0].data)
    } else {
        let mut data = BytesMut::with_capacity(bytes);
        for piece in &pieces {
            data.extend_from_slice(&piece.data);
        }
        data.freeze()
    };
    let head = pieces.swap_remove(0);
    Ok(Tensor { name: head.name, dtype: head.dtype, shape, data })
}

/// Checks that every tensor of `part` has `hi - lo` rows and a payload that splits into them.
pub(crate) fn check_part(part: &BatchPart) -> Result<(), String> {
    let rows = part.hi.saturating_sub(part.lo);
    for tensor in &part.tensors {
        if tensor.shape.first() != Some(&rows) {
            return Err(format!(
                "tensor `{}` of the part at {}..{} of split {} has shape {:?}, expected {rows} rows",
                tensor.name, part.lo, part.hi, part.split, tensor.shape
            ));
        }
        let elements = tensor.shape.iter().try_fold(1u64, |total, &dimension| total.checked_mul(dimension));
        if tensor.padding.is_some() {
            // Ragged rows: their lengths, not the shape, give the bytes (checked when joined).
            continue;
        }
        let bytes = tensor.data.len() as u64;
        let matches = match (elements, dtype_bytes(&tensor.dtype)) {
            (Some(elements), Some(size)) => elements.checked_mul(size) == Some(bytes),
            (Some(0), None) => bytes == 0,
            (Some(elements), None) => bytes.is_multiple_of(elements),
            (None, _) => false,
        };
        if !matches {
            return Err(format!(
                "tensor `{}` of the part at {}..{} of split {} has {} bytes for shape {:?}",
                tensor.name,
                part.lo,
                part.hi,
                part.split,
                tensor.data.len(),
                tensor.shape
            ));
        }
    }
    Ok(())
}

/// Bytes per value of the dtypes workers send; `None` for others.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    match dtype {
        "uint8" | "int8" | "bool" => Some(1),
        "int16" | "uint16" | "float16" | "bfloat16" => Some(2),
        "int32" | "uint32" | "float32" => Some(4),
        "int64" | "uint64" | "float64" => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn part(split: u64, lo: u64, hi: u64, fill: u8) -> BatchPart {
        let rows = hi - lo;
        BatchPart {
            epoch: 0,
            split,
            lo,
            hi,
            slot: 0,
            keys: (lo..hi).map(|i| format!("{split}/{i}")).collect(),
            tensors: vec![
                granary_proto::v1::Tensor {
                    name: "image".into(),
                    dtype: "uint8".into(),
                    shape: vec![rows, 2],
                    data: Bytes::from(vec![fill; rows as usize * 2]),
                    normalize: None,
                    padding: None,
                    images: None,
                },
                granary_proto::v1::Tensor {
                    name: "label".into(),
                    dtype: "int64".into(),
                    shape: vec![rows],
                    data: Bytes::from(vec![fill; rows as usize * 8]),
                    normalize: None,
                    padding: None,
                    images: None,
                },
            ],
        }
    }

    /// A part of `rows` 2×2 RGB images, left for the client to normalize to CHW.
    fn image_part(split: u64, rows: u64, seed: u8) -> BatchPart {
        let n = rows as usize * 12;
        BatchPart {
            epoch: 0,
            split,
            lo: 0,
            hi: rows,
            slot: 0,
            keys: (0..rows).map(|i| format!("{split}/{i}")).collect(),
            tensors: vec![granary_proto::v1::Tensor {
                name: "image".into(),
                dtype: "uint8".into(),
                shape: vec![rows, 2, 2, 3],
                data: Bytes::from(
                    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect::<Vec<_>>(),
                ),
                normalize: Some(granary_proto::v1::Normalize {
                    mean: vec![0.485, 0.456, 0.406],
                    std: vec![0.229, 0.224, 0.225],
                    layout: "CHW".into(),
                }),
                padding: None,
                images: None,
            }],
        }
    }

    #[test]
    fn a_slot_whose_parts_were_finished_in_different_places_gets_the_same_bits() {
        let (a, b) = (image_part(1, 2, 3), image_part(2, 3, 90));
        let client = Batch::from_parts(0, 0, vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(client.tensors[0].dtype, "float32");
        assert_eq!(client.tensors[0].shape, vec![5, 3, 2, 2]);
        // The first part as a worker sends it when placement put the normalization there.
        let on_worker = Batch::from_parts(0, 0, vec![a.clone()]).unwrap().tensors.remove(0);
        let mut worker_part = a;
        worker_part.tensors[0] = granary_proto::v1::Tensor {
            name: "image".into(),
            dtype: "float32".into(),
            shape: vec![2, 3, 2, 2],
            data: on_worker.data,
            normalize: None,
            padding: None,
            images: None,
        };
        let mixed = Batch::from_parts(0, 0, vec![worker_part, b]).unwrap();
        assert_eq!(mixed.tensors, client.tensors);
    }

    #[test]
    fn deferred_parts_of_different_image_sizes_are_refused() {
        let a = image_part(1, 2, 3);
        let mut b = image_part(2, 1, 4);
        b.tensors[0].shape = vec![1, 1, 4, 3];
        let error = Batch::from_parts(0, 0, vec![a, b]).unwrap_err();
        assert!(error.contains("shape"), "{error}");
    }

    #[test]
    fn single_part_reuses_the_payload() {
        let one = part(3, 0, 4, 7);
        let pointer = one.tensors[0].data.as_ptr();
        let batch = Batch::from_parts(0, 0, vec![one]).unwrap();
        assert_eq!(batch.tensor("image").unwrap().data.as_ptr(), pointer);
        assert_eq!(batch.len(), 4);
        assert_eq!(batch.tensor("image").unwrap().shape, vec![4, 2]);
    }

    #[test]
    fn parts_concatenate_along_rows() {
        let batch = Batch::from_parts(0, 0, vec![part(1, 6, 8, 1), part(2, 0, 3, 2)]).unwrap();
        assert_eq!(batch.len(), 5);
        assert_eq!(batch.keys, vec!["1/6", "1/7", "2/0", "2/1", "2/2"]);
        let image = batch.tensor("image").unwrap();
        assert_eq!(image.shape, vec![5, 2]);
        assert_eq!(&image.data[..], &[1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert_eq!(batch.tensor("label").unwrap().data.len(), 40);
        assert_eq!(batch.wire_bytes, 10 + 40, "the parts' payloads as sent");
    }

    #[test]
    fn mismatched_parts_are_refused() {
        let mut other = part(2, 0, 3, 2);
        other.tensors[0].shape = vec![3, 3];
        assert!(Batch::from_parts(0, 0, vec![part(1, 0, 2, 1), other]).unwrap_err().contains("shape"));
        let mut other = part(2, 0, 3, 2);
        other.tensors[1].dtype = "float32".into();
        assert!(Batch::from_parts(0, 0, vec![part(1, 0, 2, 1), other]).is_err());
        let mut other = part(2, 0, 3, 2);
        other.tensors.pop();
        assert!(Batch::from_parts(0, 0, vec![part(1, 0, 2, 1), other]).is_err());
        let mut other = part(2, 0, 3, 2);
        other.tensors.push(other.tensors[0].clone());
        assert!(Batch::from_parts(0, 0, vec![part(1, 0, 2, 1), other]).is_err());
    }

    #[test]
    fn empty_parts_are_skipped() {
        let mut empty = part(4, 5, 5, 0);
        empty.tensors.clear();
        let batch = Batch::from_parts(0, 0, vec![part(1, 0, 2, 1), empty.clone()]).unwrap();
        assert_eq!(batch.len(), 2);
        let batch = Batch::from_parts(0, 0, vec![empty]).unwrap();
        assert!(batch.is_empty());
        assert!(Batch::from_parts(0, 0, vec![]).unwrap().is_empty());
    }

    #[test]
    fn checks_part_shapes() {
        assert!(check_part(&part(1, 0, 2, 1)).is_ok());
        let mut bad = part(1, 0, 2, 1);
        bad.tensors[0].shape = vec![3, 2];
        assert!(check_part(&bad).is_err());
        let mut bad = part(1, 0, 2, 1);
        bad.tensors[0].data = Bytes::from_static(&[1, 2, 3]);
        assert!(check_part(&bad).is_err());
    }
}
