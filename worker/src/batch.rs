//! Batches: named tensors stacked along a new leading axis, each one contiguous little-endian
//! buffer, plus the keys of the elements in order. With `spec.batch.pad`, the padded fields stay
//! ragged (see [`Ragged`]) until the batch is final; `spec.batch.bucket` groups a split's
//! elements by length ([`Batcher`]).

mod bucket;
mod finish;
mod pad;
mod unstacked;

pub use self::bucket::{Batcher, Bucketing};
pub use self::finish::Finish;
pub use self::pad::{Padding, Ragged};
pub(crate) use self::unstacked::Unstacked;

use crate::budget::Permit;
use crate::element::{Element, FieldName, Value};
use crate::tensor::DType;
use std::sync::Arc;

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
    /// Set while the fields of `spec.batch.pad` are not padded yet: each row's length. The
    /// batches the engine hands out ([`crate::Engine::run_epoch`]) are padded, with the mask.
    pub ragged: Option<Ragged>,
    /// Memory the batch holds against the prefetch budget.
    pub(crate) permit: Option<Permit>,
    /// A field whose rows are still their elements' buffers, for the executor's [`Finish`]
    /// only: the batches the executor hands out are stacked.
    pub(crate) unstacked: Option<Unstacked>,
}

impl PartialEq for Batch {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && self.keys == other.keys
            && self.tensors == other.tensors
            && self.ragged == other.ragged
            && self.unstacked == other.unstacked
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
        self.tensors.iter().map(|t| t.data.len()).sum::<usize>()
            + self.unstacked.as_ref().map_or(0, Unstacked::nbytes)
    }

    /// Pads a ragged batch's padded fields to one width, its longest row rounded up to
    /// `multipleOf`, and appends the mask (the last tensor). A dense batch stays as it is.
    pub fn pad(&mut self) {
        pad::pad_batch(self);
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
        "element `{key}`: field `{field}` is {found} but the batch's is {expected}; elements of a batch need equal shapes (add `image.resize` + `image.center_crop`, `image.random_resized_crop`, or `text.truncate_pad`; or list a field whose length varies in `spec.batch.pad.fields`)"
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
    /// A field listed in `spec.batch.pad` cannot be padded.
    #[error("element `{key}`: {message}")]
    Pad {
        /// Element key.
        key: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The final normalization, finished per batch, could not be applied.
    #[error("{0}")]
    Finish(String),
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
    /// `spec.batch.pad`, when some fields vary in length.
    padding: Option<Arc<Padding>>,
    /// The first-axis length of each row of the padded fields.
    lengths: Vec<usize>,
    /// The field to leave unstacked ([`BatchBuilder::leaving_unstacked`]).
    unstacked: Option<String>,
    /// The batch's unstacked field, once its first element showed it is `uint8` and dense.
    rows: Option<Unstacked>,
}

impl BatchBuilder {
    /// A builder for batches of up to `capacity` elements.
    pub fn new(capacity: usize) -> BatchBuilder {
        BatchBuilder::with_padding(capacity, None)
    }

    /// A builder for batches of up to `capacity` elements whose fields `padding` lists vary in
    /// length: its batches are [`Ragged`] (see [`Batch::pad`]).
    pub fn with_padding(capacity: usize, padding: Option<Arc<Padding>>) -> BatchBuilder {
        BatchBuilder {
            capacity,
            keys: Vec::new(),
            tensors: Vec::new(),
            padding,
            lengths: Vec::new(),
            unstacked: None,
            rows: None,
        }
    }

    /// Leaves `field` unstacked in the batches (see [`Unstacked`]) where it is `uint8` and not
    /// padded: for a consumer that reads it once, from the elements' own buffers, and writes it
    /// anew ([`Finish`]).
    pub(crate) fn leaving_unstacked(mut self, field: Option<String>) -> BatchBuilder {
        self.unstacked = field;
        self
    }

    /// The length of the padded fields of an element: every one is there, with at least one
    /// axis, all of one length, and no field has the mask's name. `None` without padding.
    fn padded_length(&self, key: &str, fields: &[(FieldName, Value)]) -> Result<Option<usize>, BatchError> {
        let Some(padding) = &self.padding else { return Ok(None) };
        let error = |message: String| BatchError::Pad { key: key.to_string(), message };
        let names = || fields.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        let mut length: Option<(usize, &str)> = None;
        for field in &padding.fields {
            let len = match fields.iter().find(|(n, _)| n == field) {
                None => {
                    return Err(error(format!(
                        "`spec.batch.pad` lists `{field}`, which the element lacks (its fields: {})",
                        names()
                    )));
                }
                Some((_, Value::Tensor(t))) => match t.shape.first() {
                    Some(&len) => len,
                    None => {
                        return Err(error(format!(
                            "field `{field}` is a scalar; `spec.batch.pad` pads along a first axis"
                        )));
                    }
                },
                Some((_, value)) => {
                    return Err(BatchError::NotTensor {
                        key: key.to_string(),
                        field: field.clone(),
                        kind: value.kind(),
                    });
                }
            };
            match length {
                None => length = Some((len, field)),
                Some((first, name)) if first != len => {
                    return Err(error(format!(
                        "field `{field}` has {len} positions but `{name}` has {first}; the fields of \
                         `spec.batch.pad.fields` share one length (and one mask) in each element"
                    )));
                }
                Some(_) => {}
            }
        }
        if fields.iter().any(|(n, _)| *n == padding.mask) {
            return Err(error(format!(
                "the element has a field `{}`, the mask's name; set `spec.batch.pad.mask` to another",
                padding.mask
            )));
        }
        Ok(length.map(|(len, _)| len))
    }

    fn padded(&self, name: &str) -> bool {
        self.padding.as_ref().is_some_and(|p| p.pads(name))
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
        let length = self.padded_length(&key, &fields)?;
        if self.keys.is_empty() {
            self.tensors.clear();
            self.lengths.clear();
            self.rows = None;
            for (i, (name, value)) in fields.into_iter().enumerate() {
                let Value::Tensor(t) = value else {
                    return Err(BatchError::NotTensor { key, field: name.into(), kind: value.kind() });
                };
                let mut shape = vec![1];
                shape.extend_from_slice(&t.shape);
                let dtype = t.dtype();
                let data = if self.unstacked.as_deref() == Some(name.as_str())
                    && dtype == DType::Uint8
                    && !self.padded(&name)
                {
                    let mut rows = Vec::with_capacity(self.capacity.max(1));
                    rows.push(row_of(t));
                    self.rows = Some(Unstacked { tensor: i, rows });
                    Vec::new()
                } else {
                    let mut data = crate::buffers::take(t.nbytes() * self.capacity.max(1));
                    data.extend_from_slice(t.as_le_bytes());
                    data
                };
                self.tensors.push(BatchTensor { name: name.into(), dtype, shape, data });
            }
            self.lengths.extend(length);
            self.keys.push(key);
            return Ok(());
        }
        if fields.len() != self.tensors.len()
            || fields.iter().zip(&self.tensors).any(|((n, _), t)| *n != t.name)
        {
            return Err(BatchError::Fields {
                key,
                expected: self.tensors.iter().map(|t| t.name.clone()).collect(),
                found: fields.iter().map(|(n, _)| n.to_string()).collect(),
            });
        }
        for ((name, value), slot) in fields.iter().zip(&self.tensors) {
            let Value::Tensor(t) = value else {
                return Err(BatchError::NotTensor { key, field: name.to_string(), kind: value.kind() });
            };
            // Compared item by item: `==` on slices calls `memcmp`, which costs more than the
            // few extents (often none) it compares, for every field of every element.
            let same = if self.padded(name) {
                !t.shape.is_empty() && t.shape[1..].iter().eq(&slot.shape[2..])
            } else {
                t.shape.iter().eq(&slot.shape[1..])
            };
            if t.dtype() != slot.dtype || !same {
                return Err(BatchError::Shape {
                    key,
                    field: name.to_string(),
                    expected: describe(slot.dtype, &slot.shape[1..]),
                    found: describe(t.dtype(), &t.shape),
                });
            }
        }
        let padding = self.padding.as_deref();
        for (i, ((name, value), slot)) in fields.into_iter().zip(&mut self.tensors).enumerate() {
            if let Value::Tensor(t) = value {
                if let Some(rows) = self.rows.as_mut().filter(|r| r.tensor == i) {
                    rows.rows.push(row_of(t));
                    slot.shape[0] += 1;
                    continue;
                }
                append(&mut slot.data, t.as_le_bytes());
                slot.shape[0] += 1;
                if padding.is_some_and(|p| p.pads(&name))
                    && let (Some(axis), Some(&len)) = (slot.shape.get_mut(1), t.shape.first())
                {
                    *axis = (*axis).max(len);
                }
            }
        }
        self.lengths.extend(length);
        self.keys.push(key);
        Ok(())
    }

    /// Takes the batch built so far and starts a new one; with padding it is [`Ragged`].
    pub fn finish(&mut self, epoch: u32, origin: Option<BatchOrigin>) -> Batch {
        let ragged = self.padding.as_ref().filter(|_| !self.keys.is_empty()).map(|padding| Ragged {
            lengths: std::mem::take(&mut self.lengths),
            padding: Arc::clone(padding),
        });
        self.lengths.clear();
        Batch {
            epoch,
            origin,
            keys: std::mem::take(&mut self.keys),
            tensors: std::mem::take(&mut self.tensors),
            ragged,
            permit: None,
            unstacked: self.rows.take(),
        }
    }
}

/// Appends `bytes` to `data`. A scalar's 1, 4 or 8 bytes are copied as one store: a table's row
/// adds one scalar per column, and a call into the C library's `memcpy` for each cost more than
/// the copy.
fn append(data: &mut Vec<u8>, bytes: &[u8]) {
    if let Ok(word) = <&[u8; 8]>::try_from(bytes) {
        data.extend_from_slice(word);
    } else if let Ok(word) = <&[u8; 4]>::try_from(bytes) {
        data.extend_from_slice(word);
    } else if let Ok(byte) = <&[u8; 1]>::try_from(bytes) {
        data.extend_from_slice(byte);
    } else {
        data.extend_from_slice(bytes);
    }
}

/// A `uint8` tensor's bytes as a row of an unstacked field: its own buffer, not a copy.
fn row_of(t: crate::tensor::Tensor) -> Vec<u8> {
    match t.data {
        crate::tensor::TensorData::U8(bytes) => bytes.into_vec(),
        _ => t.as_le_bytes().to_vec(),
    }
}

/// Appends `other`'s elements to `batch` (same fields, dtypes and per-element shapes; the rows
/// of ragged batches may differ in length). When `batch` lacks room, its buffers move to
/// recycled ones with room for `room` elements (or all of them, if more), so that merging many
/// small batches copies each element once.
pub fn concat(batch: &mut Batch, mut other: Batch, room: usize) -> Result<(), BatchError> {
    batch.stack();
    other.stack();
    if batch.is_empty() {
        let permit = batch.permit.take();
        *batch = other;
        if let (Some(mut mine), Some(p)) = (permit, batch.permit.take()) {
            mine.absorb(p);
            batch.permit = Some(mine);
        }
        return Ok(());
    }
    if other.is_empty() {
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
    let padding = match (&batch.ragged, &other.ragged) {
        (Some(a), Some(_)) => Some(Arc::clone(&a.padding)),
        _ => None,
    };
    let padded = |name: &str| padding.as_ref().is_some_and(|p| p.pads(name));
    for (a, b) in other.tensors.iter().zip(&batch.tensors) {
        let from = if padded(&a.name) { 2 } else { 1 };
        if a.dtype != b.dtype || a.shape.get(from..) != b.shape.get(from..) || a.shape.len() != b.shape.len()
        {
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
            // Ragged rows vary: room for `room` rows as long as the longest so far.
            let per = if padded(&b.name) {
                pad::per_position(b) * b.shape[1].max(a.shape[1])
            } else {
                b.data.len() / batch.keys.len().max(1)
            };
            let mut bigger = crate::buffers::take((per * room.max(total)).max(b.data.len() + a.data.len()));
            bigger.extend_from_slice(&b.data);
            crate::buffers::give(std::mem::replace(&mut b.data, bigger));
        }
        b.data.extend_from_slice(&a.data);
        b.shape[0] += a.shape[0];
        if padded(&b.name) {
            b.shape[1] = b.shape[1].max(a.shape[1]);
        }
    }
    if let (Some(mine), Some(theirs)) = (batch.ragged.as_mut(), other.ragged.take()) {
        mine.lengths.extend(theirs.lengths);
    }
    batch.keys.extend(std::mem::take(&mut other.keys));
    batch.origin = None;
    match (&mut batch.permit, other.permit.take()) {
        (Some(mine), Some(p)) => mine.absorb(p),
        (slot @ None, Some(p)) => *slot = Some(p),
        _ => {}
    }
    Ok(())
}

/// Splits `batch` after its first `n` elements; returns the rest, in a recycled buffer with
/// room for `room` elements (or all of the rest, if more).
pub fn split_off(batch: &mut Batch, n: usize, room: usize) -> Batch {
    batch.stack();
    let n = n.min(batch.keys.len());
    let keys = batch.keys.split_off(n);
    let ragged = batch.ragged.as_mut().map(|r| Ragged {
        lengths: r.lengths.split_off(n.min(r.lengths.len())),
        padding: Arc::clone(&r.padding),
    });
    let head_longest = batch.ragged.as_ref().map_or(0, Ragged::longest);
    let tail_longest = ragged.as_ref().map_or(0, Ragged::longest);
    let padding = ragged.as_ref().map(|r| Arc::clone(&r.padding));
    let tensors = batch
        .tensors
        .iter_mut()
        .map(|t| {
            let padded = padding.as_ref().is_some_and(|p| p.pads(&t.name));
            let (at, per_row) = match batch.ragged.as_ref().filter(|_| padded) {
                Some(head) => {
                    let per = pad::per_position(t);
                    (head.lengths.iter().sum::<usize>() * per, per * tail_longest)
                }
                None => {
                    let per: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
                    (n * per, per)
                }
            };
            let at = at.min(t.data.len());
            let rest = t.data.len() - at;
            let mut data = crate::buffers::take((per_row * room.max(keys.len())).max(rest));
            data.extend_from_slice(&t.data[at..]);
            t.data.truncate(at);
            let mut shape = t.shape.clone();
            shape[0] = keys.len();
            t.shape[0] = n;
            if padded {
                shape[1] = tail_longest;
                t.shape[1] = head_longest;
            }
            BatchTensor { name: t.name.clone(), dtype: t.dtype, shape, data }
        })
        .collect();
    batch.origin = None;
    Batch { epoch: batch.epoch, origin: None, keys, tensors, ragged, permit: None, unstacked: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorData};
    use smallvec::smallvec;

    fn element(key: &str, v: f32) -> Element {
        let mut e = Element::new(key);
        e.set("x", Value::Tensor(Tensor::new(vec![2], TensorData::F32(smallvec![v, v + 0.5])).unwrap()));
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

    fn pixels(key: &str, v: u8) -> Element {
        let mut e = element(key, f32::from(v));
        e.set("image", Value::Tensor(Tensor::new(vec![2, 1, 3], TensorData::U8(smallvec![v; 6])).unwrap()));
        e
    }

    #[test]
    fn a_field_left_unstacked_keeps_its_rows_until_stacked_and_then_matches() {
        let build = |unstacked: Option<&str>, n: usize| {
            let mut b = BatchBuilder::new(4).leaving_unstacked(unstacked.map(String::from));
            for i in 0..n {
                b.push(pixels(&format!("k{i}"), i as u8)).unwrap();
            }
            b.finish(0, None)
        };
        let stacked = build(None, 3);
        let mut left = build(Some("image"), 3);
        let rows = left.unstacked.as_ref().map(|u| (u.tensor, u.rows.len()));
        assert_eq!(rows, Some((2, 3)), "the image's three rows, in their own buffers");
        assert_eq!(left.tensor("image").unwrap().shape, vec![3, 2, 1, 3]);
        assert_eq!(left.nbytes(), stacked.nbytes());
        left.stack();
        assert_eq!(left, stacked);
        // A field of another dtype is stacked as ever.
        assert!(build(Some("x"), 2).unstacked.is_none());
        // Merging and splitting stack first.
        let mut merged = build(Some("image"), 2);
        concat(&mut merged, build(Some("image"), 1), 4).unwrap();
        assert!(merged.unstacked.is_none());
        let image = &merged.tensor("image").unwrap().data;
        assert_eq!(image, &[[0u8; 6], [1; 6], [0; 6]].concat());
        let mut whole = build(Some("image"), 3);
        let rest = split_off(&mut whole, 2, 4);
        assert_eq!((whole.unstacked.is_none(), &rest.tensor("image").unwrap().data), (true, &vec![2u8; 6]));
        // A padded field is stacked too.
        let padding =
            Arc::new(Padding { fields: vec!["image".into()], multiple_of: 1, value: 0.0, mask: "m".into() });
        let mut b = BatchBuilder::with_padding(2, Some(padding)).leaving_unstacked(Some("image".into()));
        b.push(pixels("k", 1)).unwrap();
        assert!(b.finish(0, None).unstacked.is_none());
    }

    fn tokens(key: &str, ids: &[i64]) -> Element {
        let mut e = Element::new(key);
        e.set(
            "ids",
            Value::Tensor(Tensor::new(vec![ids.len()], TensorData::I64(ids.to_vec().into())).unwrap()),
        );
        e.set("label", Value::Tensor(Tensor::scalar_i64(ids.len() as i64)));
        e
    }

    fn padding(multiple_of: usize) -> Arc<Padding> {
        Arc::new(Padding { fields: vec!["ids".into()], multiple_of, value: -1.0, mask: "ids_mask".into() })
    }

    fn ids(batch: &Batch) -> Vec<i64> {
        bytemuck::cast_slice::<u8, i64>(&batch.tensor("ids").unwrap().data).to_vec()
    }

    fn ragged_batch(rows: &[&[i64]], multiple_of: usize) -> Batch {
        let mut b = BatchBuilder::with_padding(rows.len(), Some(padding(multiple_of)));
        for (i, r) in rows.iter().enumerate() {
            b.push(tokens(&format!("k{i}"), r)).unwrap();
        }
        b.finish(0, None)
    }

    fn padded_batch(rows: &[&[i64]], multiple_of: usize) -> Batch {
        let mut batch = ragged_batch(rows, multiple_of);
        batch.pad();
        batch
    }

    #[test]
    fn pads_to_the_longest_element_with_a_mask() {
        let ragged = ragged_batch(&[&[1, 2], &[3, 4, 5], &[6]], 1);
        assert_eq!(ragged.ragged.as_ref().unwrap().lengths, vec![2, 3, 1]);
        assert_eq!(ragged.tensor("ids").unwrap().shape, vec![3, 3], "as wide as its longest row");
        assert_eq!(ids(&ragged), vec![1, 2, 3, 4, 5, 6], "rows back to back, unpadded");
        assert!(ragged.tensor("ids_mask").is_none());
        let batch = padded_batch(&[&[1, 2], &[3, 4, 5], &[6]], 1);
        assert!(batch.ragged.is_none());
        assert_eq!(batch.tensor("ids").unwrap().shape, vec![3, 3]);
        assert_eq!(ids(&batch), vec![1, 2, -1, 3, 4, 5, 6, -1, -1]);
        let mask = batch.tensor("ids_mask").unwrap();
        assert_eq!((mask.dtype, mask.shape.clone()), (DType::Uint8, vec![3, 3]));
        assert_eq!(mask.data, vec![1, 1, 0, 1, 1, 1, 1, 0, 0]);
        assert_eq!(batch.tensor("label").unwrap().shape, vec![3]);
        assert_eq!(batch.tensors.last().unwrap().name, "ids_mask");
    }

    #[test]
    fn rounds_the_width_up_to_multiple_of() {
        let batch = padded_batch(&[&[1, 2, 3, 4, 5], &[6]], 4);
        assert_eq!(batch.tensor("ids").unwrap().shape, vec![2, 8]);
        assert_eq!(ids(&batch)[..8], [1, 2, 3, 4, 5, -1, -1, -1]);
        assert_eq!(batch.tensor("ids_mask").unwrap().data[8..], [1, 0, 0, 0, 0, 0, 0, 0]);
        let exact = padded_batch(&[&[1, 2, 3, 4]], 4);
        assert_eq!(exact.tensor("ids").unwrap().shape, vec![1, 4]);
        let empty = padded_batch(&[&[], &[]], 8);
        assert_eq!(empty.tensor("ids").unwrap().shape, vec![2, 0]);
    }

    #[test]
    fn ragged_batches_concat_and_split_by_row_lengths() {
        let mut narrow = ragged_batch(&[&[1]], 1);
        concat(&mut narrow, ragged_batch(&[&[2, 3, 4], &[5, 6]], 1), 4).unwrap();
        assert_eq!(narrow.tensor("ids").unwrap().shape, vec![3, 3]);
        assert_eq!(narrow.ragged.as_ref().unwrap().lengths, vec![1, 3, 2]);
        let rest = split_off(&mut narrow, 2, 4);
        assert_eq!((ids(&narrow), ids(&rest)), (vec![1, 2, 3, 4], vec![5, 6]));
        assert_eq!(rest.tensor("ids").unwrap().shape, vec![1, 2]);
        assert_eq!(rest.tensor("label").unwrap().shape, vec![1]);
        let mut head = narrow;
        head.pad();
        assert_eq!(ids(&head), vec![1, -1, -1, 2, 3, 4]);
        assert_eq!(head.tensor("ids_mask").unwrap().data, vec![1, 0, 0, 1, 1, 1]);
        // Padded batches of different widths do not concat.
        let mut a = padded_batch(&[&[1]], 1);
        assert!(matches!(concat(&mut a, padded_batch(&[&[1, 2]], 1), 2), Err(BatchError::Shape { .. })));
    }

    #[test]
    fn padded_fields_share_one_length() {
        let mut b = BatchBuilder::with_padding(
            2,
            Some(Arc::new(Padding {
                fields: vec!["ids".into(), "other".into()],
                multiple_of: 1,
                value: 0.0,
                mask: "m".into(),
            })),
        );
        let mut e = tokens("a", &[1, 2]);
        e.set("other", Value::Tensor(Tensor::new(vec![3], TensorData::I64(smallvec![0; 3])).unwrap()));
        let err = b.push(e).unwrap_err().to_string();
        assert!(err.contains("`other` has 3 positions but `ids` has 2"), "{err}");
    }

    #[test]
    fn padding_errors_name_the_field() {
        let mut b = BatchBuilder::with_padding(2, Some(padding(1)));
        let err = b.push(element("a", 0.0)).unwrap_err();
        assert!(err.to_string().contains("`spec.batch.pad` lists `ids`"), "{err}");
        let mut b = BatchBuilder::with_padding(2, Some(padding(1)));
        let mut clash = tokens("a", &[1]);
        clash.set("ids_mask", Value::Tensor(Tensor::scalar_i64(1)));
        assert!(b.push(clash).unwrap_err().to_string().contains("spec.batch.pad.mask"));
        let mut b = BatchBuilder::new(2);
        b.push(tokens("a", &[1])).unwrap();
        let err = b.push(tokens("b", &[1, 2])).unwrap_err();
        assert!(err.to_string().contains("spec.batch.pad.fields"), "{err}");
    }

    #[test]
    fn rejects_mismatched_elements() {
        let mut b = BatchBuilder::new(4);
        b.push(element("a", 0.0)).unwrap();
        let mut bad = Element::new("b");
        bad.set("x", Value::Tensor(Tensor::new(vec![3], TensorData::F32(smallvec![0.0; 3])).unwrap()));
        bad.set("label", Value::Tensor(Tensor::scalar_i64(1)));
        assert!(matches!(b.push(bad), Err(BatchError::Shape { .. })));
        let mut text = Element::new("c");
        text.set("x", Value::Text("hi".into()));
        let mut fresh = BatchBuilder::new(2);
        let err = fresh.push(text).unwrap_err();
        assert!(err.to_string().contains("cannot be batched"));
    }
}
