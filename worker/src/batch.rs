//! Batches: named tensors stacked along a new leading axis, each one contiguous little-endian
//! buffer, plus the keys of the elements in order.

use crate::budget::Permit;
use crate::element::{Element, Value};
use crate::tensor::DType;

/// One stacked tensor of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchTensor {
    /// Field name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape including the leading batch axis.
    pub shape: Vec<usize>,
    /// Row-major little-endian data.
    pub data: Vec<u8>,
}

impl Drop for BatchTensor {
    fn drop(&mut self) {
        crate::buffers::give(std::mem::take(&mut self.data));
    }
}

/// Where a batch came from: per-split batches are replayable by (epoch, split, sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchOrigin {
    /// Epoch, counted from 0.
    pub epoch: u32,
    /// Split index in the source's listing.
    pub split: u64,
    /// Position of the batch within the split's output.
    pub sequence: u64,
}

/// A batch of elements.
#[derive(Debug)]
pub struct Batch {
    /// Epoch the elements belong to.
    pub epoch: u32,
    /// The split batch this came from; `None` for batches merged from split tails.
    pub origin: Option<BatchOrigin>,
    /// Keys of the elements, in batch order.
    pub keys: Vec<String>,
    /// Stacked fields, in the elements' field order.
    pub tensors: Vec<BatchTensor>,
    /// Memory the batch holds against the prefetch budget.
    pub(crate) permit: Option<Permit>,
}

impl PartialEq for Batch {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch && self.keys == other.keys && self.tensors == other.tensors
    }
}

impl Batch {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the batch has no elements.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&BatchTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Bytes of tensor data.
    pub fn nbytes(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len()).sum()
    }
}

/// Why elements could not be stacked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// A field is not a tensor.
    #[error(
        "element `{key}`: field `{field}` is {kind}, which cannot be batched; transform it into a tensor (e.g. `image.decode`, `text.tokenize`) or drop it with `table.select`"
    )]
    NotTensor {
        /// Element key.
        key: String,
        /// Field name.
        field: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// Fields differ between elements.
    #[error(
        "element `{key}`: fields {found:?} differ from the batch's {expected:?}; every element must have the same fields"
    )]
    Fields {
        /// Element key.
        key: String,
        /// The batch's field names.
        expected: Vec<String>,
        /// The element's field names.
        found: Vec<String>,
    },
    /// Tensor shapes or types differ between elements.
    #[error(
        "element `{key}`: field `{field}` is {found} but the batch's is {expected}; elements of a batch need equal shapes (add `image.resize` + `image.center_crop`, `image.random_resized_crop`, or `text.truncate_pad`)"
    )]
    Shape {
        /// Element key.
        key: String,
        /// Field name.
        field: String,
        /// The batch's dtype and shape.
        expected: String,
        /// The element's dtype and shape.
        found: String,
    },
}

fn describe(dtype: DType, shape: &[usize]) -> String {
    format!("{}{:?}", dtype.name(), shape)
}

/// Stacks elements into a batch buffer, one element at a time.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    capacity: usize,
    keys: Vec<String>,
    tensors: Vec<BatchTensor>,
}

impl BatchBuilder {
    /// A builder for batches of up to `capacity` elements.
    pub fn new(capacity: usize) -> BatchBuilder {
        BatchBuilder { capacity, keys: Vec::new(), tensors: Vec::new() }
    }

    /// Elements added so far.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// True when the batch holds `capacity` elements.
    pub fn is_full(&self) -> bool {
        self.keys.len() >= self.capacity
    }

    /// Appends one element's fields.
    pub fn push(&mut self, element: Element) -> Result<(), BatchError> {
        let Element { key, fields } = element;
        if self.keys.is_empty() {
            self.tensors.clear();
            for (name, value) in &fields {
                let Value::Tensor(t) = value else {
                    return Err(BatchError::NotTensor { key, field: name.clone(), kind: value.kind() });
                };
                let mut data = crate::buffers::take(t.nbytes() * self.capacity.max(1));
                data.extend_from_slice(t.as_le_bytes());
                let mut shape = vec![1];
                shape.extend_from_slice(&t.shape);
                self.tensors.push(BatchTensor { name: name.clone(), dtype: t.dtype(), shape, data });
            }
            self.keys.push(key);
            return Ok(());
        }
        if fields.len() != self.tensors.len()
            || fields.iter().zip(&self.tensors).any(|((n, _), t)| *n != t.name)
        {
            return Err(BatchError::Fields {
                key,
                expected: self.tensors.iter().map(|t| t.name.clone()).collect(),
                found: fields.iter().map(|(n, _)| n.clone()).collect(),
            });
        }
        for ((name, value), slot) in fields.iter().zip(&self.tensors) {
            let Value::Tensor(t) = value else {
                return Err(BatchError::NotTensor { key, field: name.clone(), kind: value.kind() });
            };
            if t.dtype() != slot.dtype || t.shape[..] != slot.shape[1..] {
                return Err(BatchError::Shape {
                    key,
                    field: name.clone(),
                    expected: describe(slot.dtype, &slot.shape[1..]),
                    found: describe(t.dtype(), &t.shape),
                });
            }
        }
        for ((_, value), slot) in fields.iter().zip(&mut self.tensors) {
            if let Value::Tensor(t) = value {
                slot.data.extend_from_slice(t.as_le_bytes());
                slot.shape[0] += 1;
            }
        }
        self.keys.push(key);
        Ok(())
    }

    /// Takes the batch built so far and starts a new one.
    pub fn finish(&mut self, epoch: u32, origin: Option<BatchOrigin>) -> Batch {
        Batch {
            epoch,
            origin,
            keys: std::mem::take(&mut self.keys),
            tensors: std::mem::take(&mut self.tensors),
            permit: None,
        }
    }
}

/// Appends `other`'s elements to `batch` (same fields, dtypes and per-element shapes). When
/// `batch` lacks room, its buffers move to recycled ones with room for `room` elements (or
/// all of them, if more), so that merging many small batches copies each element once.
pub fn concat(batch: &mut Batch, other: Batch, room: usize) -> Result<(), BatchError> {
    if batch.is_empty() {
        let permit = batch.permit.take();
        *batch = other;
        if let (Some(mut mine), Some(p)) = (permit, batch.permit.take()) {
            mine.absorb(p);
            batch.permit = Some(mine);
        }
        return Ok(());
    }
    let key = other.keys.first().cloned().unwrap_or_default();
    if other.tensors.len() != batch.tensors.len()
        || other.tensors.iter().zip(&batch.tensors).any(|(a, b)| a.name != b.name)
    {
        return Err(BatchError::Fields {
            key,
            expected: batch.tensors.iter().map(|t| t.name.clone()).collect(),
            found: other.tensors.iter().map(|t| t.name.clone()).collect(),
        });
    }
    for (a, b) in other.tensors.iter().zip(&batch.tensors) {
        if a.dtype != b.dtype || a.shape[1..] != b.shape[1..] {
            return Err(BatchError::Shape {
                key,
                field: a.name.clone(),
                expected: describe(b.dtype, &b.shape[1..]),
                found: describe(a.dtype, &a.shape[1..]),
            });
        }
    }
    let total = batch.len() + other.len();
    for (a, b) in other.tensors.iter().zip(&mut batch.tensors) {
        if b.data.capacity() - b.data.len() < a.data.len() {
            let per = b.data.len() / batch.keys.len().max(1);
            let mut bigger = crate::buffers::take(per * room.max(total));
            bigger.extend_from_slice(&b.data);
            crate::buffers::give(std::mem::replace(&mut b.data, bigger));
        }
        b.data.extend_from_slice(&a.data);
        b.shape[0] += a.shape[0];
    }
    batch.keys.extend(other.keys);
    batch.origin = None;
    match (&mut batch.permit, other.permit) {
        (Some(mine), Some(p)) => mine.absorb(p),
        (slot @ None, Some(p)) => *slot = Some(p),
        _ => {}
    }
    Ok(())
}

/// Splits `batch` after its first `n` elements; returns the rest, in a recycled buffer with
/// room for `room` elements (or all of the rest, if more).
pub fn split_off(batch: &mut Batch, n: usize, room: usize) -> Batch {
    let keys = batch.keys.split_off(n.min(batch.keys.len()));
    let tensors = batch
        .tensors
        .iter_mut()
        .map(|t| {
            let per: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
            let at = (n * per).min(t.data.len());
            let mut data = crate::buffers::take(per * room.max(keys.len()));
            data.extend_from_slice(&t.data[at..]);
            t.data.truncate(at);
            let mut shape = t.shape.clone();
            shape[0] = keys.len();
            t.shape[0] = n;
            BatchTensor { name: t.name.clone(), dtype: t.dtype, shape, data }
        })
        .collect();
    batch.origin = None;
    Batch { epoch: batch.epoch, origin: None, keys, tensors, permit: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorData};

    fn element(key: &str, v: f32) -> Element {
        let mut e = Element::new(key);
        e.set("x", Value::Tensor(Tensor::new(vec![2], TensorData::F32(vec![v, v + 0.5])).unwrap()));
        e.set("label", Value::Tensor(Tensor::scalar_i64(v as i64)));
        e
    }

    #[test]
    fn stacks_concats_and_splits() {
        let mut b = BatchBuilder::new(3);
        for i in 0..3 {
            b.push(element(&format!("k{i}"), i as f32)).unwrap();
        }
        assert!(b.is_full());
        let mut batch = b.finish(0, None);
        assert_eq!(batch.tensor("x").unwrap().shape, vec![3, 2]);
        assert_eq!(batch.tensor("label").unwrap().shape, vec![3]);
        let x: &[f32] = bytemuck::cast_slice(&batch.tensor("x").unwrap().data);
        assert_eq!(x, &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        let mut b2 = BatchBuilder::new(3);
        b2.push(element("k3", 3.0)).unwrap();
        concat(&mut batch, b2.finish(0, None), 4).unwrap();
        assert_eq!(batch.len(), 4);
        let rest = split_off(&mut batch, 1, 4);
        assert_eq!(batch.keys, vec!["k0"]);
        assert_eq!(rest.keys, vec!["k1", "k2", "k3"]);
        assert_eq!(rest.tensor("x").unwrap().shape, vec![3, 2]);
        let x: &[f32] = bytemuck::cast_slice(&rest.tensor("x").unwrap().data);
        assert_eq!(x[0], 1.0);
    }

    #[test]
    fn rejects_mismatched_elements() {
        let mut b = BatchBuilder::new(4);
        b.push(element("a", 0.0)).unwrap();
        let mut bad = Element::new("b");
        bad.set("x", Value::Tensor(Tensor::new(vec![3], TensorData::F32(vec![0.0; 3])).unwrap()));
        bad.set("label", Value::Tensor(Tensor::scalar_i64(1)));
        assert!(matches!(b.push(bad), Err(BatchError::Shape { .. })));
        let mut text = Element::new("c");
        text.set("x", Value::Text("hi".into()));
        let mut fresh = BatchBuilder::new(2);
        let err = fresh.push(text).unwrap_err();
        assert!(err.to_string().contains("cannot be batched"));
    }
}
