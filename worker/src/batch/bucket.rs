//! `spec.batch.bucket`: the batches of a split, filled from length buckets.
//!
//! Elements reach the batcher in the split's seeded order. Each goes to the builder of its
//! length bucket, and a builder that holds a full batch emits it, so a full batch holds
//! elements of one bucket. When the split ends, the builders' leftovers (fewer than a batch
//! each) are laid end to end in bucket order and cut into batches: the split's output then
//! keeps the shape the epoch plan relies on (full batches, then one partial tail), and a
//! recomputed split yields the same output, since it depends only on the elements and their
//! order. Only those leftover batches mix (neighbouring) buckets.

use super::{Batch, BatchBuilder, BatchError, Padding, concat, split_off};
use crate::element::{Element, Value};
use granary_crds::batch::{BucketSpec, PadSpec};
use std::sync::Arc;

/// What `spec.batch.bucket` asks for, as the batcher uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucketing {
    /// The field whose first-axis length decides the bucket.
    pub field: String,
    /// Exclusive upper bounds of the buckets, strictly increasing.
    pub boundaries: Vec<usize>,
}

impl Bucketing {
    /// The bucketing of a validated `spec.batch.bucket` beside its `spec.batch.pad`.
    pub fn from_spec(spec: &BucketSpec, pad: &PadSpec) -> Bucketing {
        Bucketing {
            field: spec.field_name(pad).unwrap_or_default().to_string(),
            boundaries: spec.boundaries.iter().map(|&b| usize::try_from(b).unwrap_or(usize::MAX)).collect(),
        }
    }

    /// Number of buckets: one more than boundaries.
    pub fn buckets(&self) -> usize {
        self.boundaries.len() + 1
    }

    /// The bucket of an element of length `len`: the first whose boundary is above it.
    pub fn bucket_of(&self, len: usize) -> usize {
        self.boundaries.partition_point(|&b| b <= len)
    }
}

/// Stacks a split's elements into batches of `capacity`, by length bucket when the spec buckets.
#[derive(Debug)]
pub struct Batcher {
    capacity: usize,
    bucketing: Option<Arc<Bucketing>>,
    /// One builder per bucket (one without bucketing).
    builders: Vec<BatchBuilder>,
}

impl Batcher {
    /// A batcher for batches of `capacity` elements, padded and bucketed as the spec says.
    pub fn new(capacity: usize, padding: Option<Arc<Padding>>, bucketing: Option<Arc<Bucketing>>) -> Batcher {
        let buckets = bucketing.as_ref().map_or(1, |b| b.buckets());
        let builders = (0..buckets).map(|_| BatchBuilder::with_padding(capacity, padding.clone())).collect();
        Batcher { capacity: capacity.max(1), bucketing, builders }
    }

    /// Leaves `field` unstacked in the batches where it can be
    /// ([`BatchBuilder::leaving_unstacked`]); leftovers that [`Batcher::finish`] merges across
    /// buckets are stacked.
    pub(crate) fn leaving_unstacked(mut self, field: Option<String>) -> Batcher {
        self.builders = self.builders.into_iter().map(|b| b.leaving_unstacked(field.clone())).collect();
        self
    }

    /// Adds an element; returns the batch it completes, if it does (without an origin: the
    /// caller numbers the split's batches).
    pub fn push(&mut self, element: Element, epoch: u32) -> Result<Option<Batch>, BatchError> {
        let bucket = match &self.bucketing {
            None => 0,
            Some(b) => match element.get(&b.field) {
                Some(Value::Tensor(t)) => b.bucket_of(t.shape.first().copied().unwrap_or(0)),
                // The builder names what is wrong with the field.
                _ => 0,
            },
        };
        let Some(builder) = self.builders.get_mut(bucket) else { return Ok(None) };
        builder.push(element)?;
        Ok(builder.is_full().then(|| builder.finish(epoch, None)))
    }

    /// Ends the split: the leftovers of every bucket, in bucket order, cut into batches of
    /// `capacity`; only the last may be smaller. Each comes with whether it is partial.
    pub fn finish(&mut self, epoch: u32) -> Result<Vec<(Batch, bool)>, BatchError> {
        let mut rest: Option<Batch> = None;
        let mut out = Vec::new();
        for builder in &mut self.builders {
            if builder.is_empty() {
                continue;
            }
            let batch = builder.finish(epoch, None);
            match rest.as_mut() {
                None => rest = Some(batch),
                Some(acc) => concat(acc, batch, self.capacity)?,
            }
            if let Some(acc) = rest.as_mut()
                && acc.len() >= self.capacity
            {
                let more = split_off(acc, self.capacity, self.capacity);
                let full = std::mem::replace(acc, more);
                out.push((full, false));
            }
        }
        if let Some(last) = rest.filter(|b| !b.is_empty()) {
            let partial = last.len() < self.capacity;
            out.push((last, partial));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorData};

    fn tokens(key: &str, len: usize) -> Element {
        let mut e = Element::new(key);
        let ids: Vec<i64> = (0..len as i64).collect();
        e.set("ids", Value::Tensor(Tensor::new(vec![len], TensorData::I64(ids.into())).unwrap()));
        e
    }

    fn padding() -> Arc<Padding> {
        Arc::new(Padding { fields: vec!["ids".into()], multiple_of: 1, value: 0.0, mask: "ids_mask".into() })
    }

    #[test]
    fn buckets_are_found_by_exclusive_upper_bounds() {
        let b = Bucketing { field: "ids".into(), boundaries: vec![4, 8] };
        let buckets: Vec<usize> = [0, 3, 4, 7, 8, 100].iter().map(|&l| b.bucket_of(l)).collect();
        assert_eq!(buckets, vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(b.buckets(), 3);
    }

    #[test]
    fn full_batches_hold_one_bucket_and_leftovers_come_in_bucket_order() {
        let bucketing = Arc::new(Bucketing { field: "ids".into(), boundaries: vec![4, 8] });
        let mut batcher = Batcher::new(2, Some(padding()), Some(bucketing));
        let lengths = [9, 1, 5, 2, 10, 6, 3];
        let mut full = Vec::new();
        for (i, &len) in lengths.iter().enumerate() {
            if let Some(batch) = batcher.push(tokens(&format!("k{i}"), len), 0).unwrap() {
                full.push(batch);
            }
        }
        let keys: Vec<Vec<String>> = full.iter().map(|b| b.keys.clone()).collect();
        assert_eq!(keys, vec![vec!["k1", "k3"], vec!["k0", "k4"], vec!["k2", "k5"]]);
        assert_eq!(full[1].ragged.as_ref().unwrap().lengths, vec![9, 10]);
        let rest = batcher.finish(0).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].0.keys, vec!["k6"]);
        assert!(rest[0].1, "a partial tail");
    }

    #[test]
    fn leftovers_of_several_buckets_are_cut_into_full_batches() {
        let bucketing = Arc::new(Bucketing { field: "ids".into(), boundaries: vec![4, 8] });
        let mut batcher = Batcher::new(3, Some(padding()), Some(bucketing));
        for (i, len) in [1, 5, 9, 2, 6].into_iter().enumerate() {
            assert!(batcher.push(tokens(&format!("k{i}"), len), 0).unwrap().is_none());
        }
        let rest = batcher.finish(0).unwrap();
        let keys: Vec<(Vec<String>, bool)> = rest.iter().map(|(b, p)| (b.keys.clone(), *p)).collect();
        assert_eq!(
            keys,
            vec![
                (vec!["k0".into(), "k3".into(), "k1".into()], false),
                (vec!["k4".into(), "k2".into()], true)
            ]
        );
        let mut first = rest.into_iter().next().unwrap().0;
        assert_eq!(first.ragged.as_ref().unwrap().lengths, vec![1, 2, 5]);
        first.pad();
        assert_eq!(first.tensor("ids").unwrap().shape, vec![3, 5]);
    }
}
