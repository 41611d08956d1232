//! Cuts a split's batches into the parts of its lease.
//!
//! Batch `sequence` of a split holds the split's output positions `[sequence·B, sequence·B +
//! len)`, where `B` is the batch size (the tail is the split's last batch). Each lease part
//! `[lo, hi)` takes the rows of the batches it overlaps. A part inside one batch is a zero-copy
//! view of the batch's buffers; a part that straddles batches is assembled into one buffer when
//! its last row arrives. Rows outside every part are dropped.
//!
//! The padded fields of `spec.batch.pad` travel ragged: their rows, unpadded, back to back, with
//! each row's length in `Tensor.padding`. A part's rows may come from batches of different
//! widths, and a slot's from several parts, so only the client, holding the whole slot, knows
//! its longest row: it pads there.

use crate::batch::{Batch, Padding};
use crate::buffers;
use bytes::Bytes;
use granary_proto::v1::{BatchPart, Lease, Padding as WirePadding, Tensor};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A finished part and the consumers it goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    /// Consumer indices in the job.
    pub consumers: Vec<u32>,
    /// The part.
    pub part: BatchPart,
}

/// What is left when a split ends.
#[derive(Debug, Default, PartialEq)]
pub struct Finished {
    /// Empty parts, sent now.
    pub routed: Vec<Routed>,
    /// Parts that did not receive all their rows (the split ended short); they are dropped.
    pub incomplete: usize,
}

/// A batch buffer that goes back to the recycling pool when the last view of it is dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        buffers::give(std::mem::take(&mut self.0));
    }
}

fn pooled(data: Vec<u8>) -> Bytes {
    Bytes::from_owner(Pooled(data))
}

/// A tensor of one batch, its buffer shared.
struct Column {
    name: String,
    dtype: String,
    /// Shape of one row; of one position, for a ragged field.
    row_shape: Vec<u64>,
    row_bytes: usize,
    /// For a ragged field: where each row starts in `data`, and where the last ends.
    offsets: Option<Vec<usize>>,
    data: Bytes,
}

impl Column {
    /// The bytes of rows `[from, to)`.
    fn rows(&self, from: usize, to: usize) -> Bytes {
        match &self.offsets {
            Some(offsets) => self.data.slice(offsets[from]..offsets[to]),
            None => self.data.slice(from * self.row_bytes..to * self.row_bytes),
        }
    }
}

/// Rows of one tensor gathered for a part.
struct Pieces {
    name: String,
    dtype: String,
    row_shape: Vec<u64>,
    /// For a ragged field: the padding, with the gathered rows' lengths.
    padding: Option<WirePadding>,
    chunks: Vec<Bytes>,
}

impl Pieces {
    fn matches(&self, column: &Column) -> bool {
        self.name == column.name
            && self.dtype == column.dtype
            && self.row_shape == column.row_shape
            && self.padding.is_some() == column.offsets.is_some()
    }

    fn into_tensor(mut self, rows: u64) -> Tensor {
        let data = if self.chunks.len() == 1 {
            self.chunks.pop().unwrap_or_default()
        } else {
            let total = self.chunks.iter().map(Bytes::len).sum();
            let mut buffer = buffers::take(total);
            for chunk in &self.chunks {
                buffer.extend_from_slice(chunk);
            }
            pooled(buffer)
        };
        let mut shape = Vec::with_capacity(self.row_shape.len() + 2);
        shape.push(rows);
        if let Some(padding) = &self.padding {
            shape.push(padding.lengths.iter().copied().max().unwrap_or(0));
        }
        shape.extend_from_slice(&self.row_shape);
        Tensor {
            name: self.name,
            dtype: self.dtype,
            shape,
            data,
            normalize: None,
            padding: self.padding,
            images: None,
        }
    }
}

/// One part of the lease and the rows it gathered so far.
struct PartState {
    lo: u64,
    hi: u64,
    slot: u64,
    consumers: Vec<u32>,
    keys: Vec<String>,
    pieces: Vec<Pieces>,
    rows: u64,
    /// Sent, or given up on.
    done: bool,
}

/// The routing of one leased split.
pub struct SplitRouter {
    epoch: u32,
    split: u64,
    batch_size: u64,
    /// Parts with at least one consumer, by `lo`.
    parts: Vec<PartState>,
    /// First part not yet opened.
    next: usize,
    /// Opened parts still gathering rows.
    open: Vec<usize>,
    /// Tensor names, dtypes and row shapes of the latest batch, for empty parts.
    layout: Vec<Tensor>,
}

impl SplitRouter {
    /// Routing for `lease`, whose split yields batches of `batch_size` rows. With
    /// `only_consumer`, only that consumer's parts are kept.
    pub fn new(lease: &Lease, batch_size: usize) -> SplitRouter {
        let mut parts: Vec<PartState> = lease
            .parts
            .iter()
            .filter_map(|p| {
                let consumers: Vec<u32> = p
                    .consumers
                    .iter()
                    .copied()
                    .filter(|c| lease.only_consumer.is_none_or(|only| only == *c))
                    .collect();
                (!consumers.is_empty() && p.hi >= p.lo).then(|| PartState {
                    lo: p.lo,
                    hi: p.hi,
                    slot: p.slot,
                    consumers,
                    keys: Vec::new(),
                    pieces: Vec::new(),
                    rows: 0,
                    done: false,
                })
            })
            .collect();
        parts.sort_by_key(|p| (p.lo, p.hi));
        SplitRouter {
            epoch: lease.epoch,
            split: lease.split,
            batch_size: batch_size.max(1) as u64,
            parts,
            next: 0,
            open: Vec::new(),
            layout: Vec::new(),
        }
    }

    /// Every consumer that receives parts of this split, in order.
    pub fn consumers(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.parts.iter().flat_map(|p| p.consumers.iter().copied()).collect();
        set.into_iter().collect()
    }

    /// Takes the split's batch number `sequence` and returns the parts it completes.
    pub fn route(&mut self, sequence: u64, mut batch: Batch) -> Vec<Routed> {
        let rows = batch.len() as u64;
        let start = sequence * self.batch_size;
        let end = start + rows;
        let ragged = batch.ragged.take();
        let padding = ragged.as_ref().map(|r| Arc::clone(&r.padding));
        let columns: Vec<Column> = batch
            .tensors
            .iter_mut()
            .map(|t| {
                let data = std::mem::take(&mut t.data);
                let row_bytes = if rows == 0 { 0 } else { data.len() / rows as usize };
                let (offsets, skip) = match ragged.as_ref().filter(|r| r.padding.pads(&t.name)) {
                    Some(r) => {
                        let per = t.shape.iter().skip(2).product::<usize>() * t.dtype.size();
                        (Some(r.offsets(per)), 2)
                    }
                    None => (None, 1),
                };
                Column {
                    name: t.name.clone(),
                    dtype: t.dtype.name().to_string(),
                    row_shape: t.shape.iter().skip(skip).map(|&d| d as u64).collect(),
                    row_bytes,
                    offsets,
                    data: pooled(data),
                }
            })
            .collect();
        let lengths: Vec<u64> =
            ragged.map(|r| r.lengths.iter().map(|&l| l as u64).collect()).unwrap_or_default();
        let wire = padding.as_deref().map(wire_padding);
        self.layout =
            columns.iter().map(|c| empty_tensor(c, wire.as_ref().filter(|_| c.offsets.is_some()))).collect();
        let mut routed = Vec::new();
        while let Some(part) = self.parts.get(self.next) {
            if part.lo >= end && !(part.lo == part.hi && part.lo == end) {
                break;
            }
            self.open.push(self.next);
            self.next += 1;
        }
        let open = std::mem::take(&mut self.open);
        for i in open {
            let part = &mut self.parts[i];
            if part.lo == part.hi {
                part.done = true;
                routed.push(self.empty_part(i));
                continue;
            }
            let (a, b) = (part.lo.max(start), part.hi.min(end));
            if a < b {
                let (from, to) = ((a - start) as usize, (b - start) as usize);
                let padding = Gathered { template: wire.as_ref(), lengths: &lengths };
                if !gather(part, &columns, &padding, &batch.keys[from..to], from, to) {
                    tracing::error!(
                        epoch = self.epoch,
                        split = self.split,
                        lo = part.lo,
                        hi = part.hi,
                        "the batches of a part differ in their fields or shapes; the part is dropped"
                    );
                    part.done = true;
                    continue;
                }
            }
            if part.rows == part.hi - part.lo {
                part.done = true;
                routed.push(self.finish_part(i));
            } else {
                self.open.push(i);
            }
        }
        routed
    }

    /// Ends the split: sends the empty parts not sent yet, and counts the parts left short.
    pub fn finish(&mut self) -> Finished {
        let mut finished = Finished::default();
        while self.next < self.parts.len() {
            self.open.push(self.next);
            self.next += 1;
        }
        for i in std::mem::take(&mut self.open) {
            let part = &mut self.parts[i];
            if part.done {
                continue;
            }
            part.done = true;
            if part.lo == part.hi {
                finished.routed.push(self.empty_part(i));
            } else {
                finished.incomplete += 1;
            }
        }
        finished
    }

    fn header(&self, part: &PartState) -> BatchPart {
        BatchPart {
            epoch: self.epoch,
            split: self.split,
            lo: part.lo,
            hi: part.hi,
            slot: part.slot,
            keys: Vec::new(),
            tensors: Vec::new(),
        }
    }

    fn empty_part(&self, i: usize) -> Routed {
        let part = &self.parts[i];
        let message = BatchPart { tensors: self.layout.clone(), ..self.header(part) };
        Routed { consumers: part.consumers.clone(), part: message }
    }

    fn finish_part(&mut self, i: usize) -> Routed {
        let mut message = self.header(&self.parts[i]);
        let part = &mut self.parts[i];
        message.keys = std::mem::take(&mut part.keys);
        message.tensors =
            std::mem::take(&mut part.pieces).into_iter().map(|p| p.into_tensor(part.rows)).collect();
        Routed { consumers: part.consumers.clone(), part: message }
    }
}

/// The padding of a batch's ragged fields: the wire message without lengths, and each row's
/// length.
struct Gathered<'a> {
    template: Option<&'a WirePadding>,
    lengths: &'a [u64],
}

/// `spec.batch.pad` as the client needs it, without row lengths.
fn wire_padding(padding: &Padding) -> WirePadding {
    WirePadding {
        lengths: Vec::new(),
        value: padding.value,
        multiple_of: u32::try_from(padding.multiple_of).unwrap_or(u32::MAX),
        mask: padding.mask.clone(),
    }
}

/// Appends rows `[from, to)` of the batch to `part`; false when the batch's tensors do not match
/// the ones the part gathered so far.
fn gather(
    part: &mut PartState,
    columns: &[Column],
    padding: &Gathered<'_>,
    keys: &[String],
    from: usize,
    to: usize,
) -> bool {
    if part.rows == 0 {
        part.pieces = columns
            .iter()
            .map(|c| Pieces {
                name: c.name.clone(),
                dtype: c.dtype.clone(),
                row_shape: c.row_shape.clone(),
                padding: padding.template.filter(|_| c.offsets.is_some()).cloned(),
                chunks: Vec::new(),
            })
            .collect();
    } else if part.pieces.len() != columns.len()
        || part.pieces.iter().zip(columns).any(|(p, c)| !p.matches(c))
    {
        return false;
    }
    for (pieces, column) in part.pieces.iter_mut().zip(columns) {
        pieces.chunks.push(column.rows(from, to));
        if let Some(wire) = pieces.padding.as_mut() {
            wire.lengths.extend_from_slice(padding.lengths.get(from..to).unwrap_or_default());
        }
    }
    part.keys.extend_from_slice(keys);
    part.rows += (to - from) as u64;
    true
}

/// A tensor of no rows shaped as `column`'s, for an empty part.
fn empty_tensor(column: &Column, padding: Option<&WirePadding>) -> Tensor {
    let mut shape = vec![0];
    if padding.is_some() {
        shape.push(0);
    }
    shape.extend_from_slice(&column.row_shape);
    Tensor {
        name: column.name.clone(),
        dtype: column.dtype.clone(),
        shape,
        data: Bytes::new(),
        normalize: None,
        padding: padding.cloned(),
        images: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchTensor;
    use crate::tensor::DType;
    use granary_proto::v1::Part;

    const B: usize = 4;

    /// Batch `sequence` of a split: rows numbered by output position, `x` = [pos, pos+100] as
    /// int32, `label` = pos as uint8.
    fn batch(sequence: u64, rows: usize) -> Batch {
        let first = sequence as usize * B;
        let positions: Vec<usize> = (first..first + rows).collect();
        let x: Vec<u8> = positions
            .iter()
            .flat_map(|&p| [p as i32, p as i32 + 100])
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let label: Vec<u8> = positions.iter().map(|&p| p as u8).collect();
        Batch {
            epoch: 2,
            origin: None,
            keys: positions.iter().map(|p| format!("e{p}")).collect(),
            tensors: vec![
                BatchTensor { name: "x".into(), dtype: DType::Int32, shape: vec![rows, 2], data: x },
                BatchTensor { name: "label".into(), dtype: DType::Uint8, shape: vec![rows], data: label },
            ],
            ragged: None,
            permit: None,
            unstacked: None,
        }
    }

    fn part(lo: u64, hi: u64, slot: u64, consumers: &[u32]) -> Part {
        Part { lo, hi, slot, consumers: consumers.to_vec() }
    }

    fn lease(parts: Vec<Part>, only_consumer: Option<u32>) -> Lease {
        Lease {
            lease_id: 9,
            pipeline: "p".into(),
            generation: 1,
            job: "j".into(),
            epoch: 2,
            split: 5,
            elements: 10,
            parts,
            duration_ms: 4000,
            only_consumer,
            cache: None,
            count_first: false,
            listed: 10,
            normalize_on_worker: false,
            images_on_client: false,
            client_image_share: 0.0,
        }
    }

    /// Routes a split of `elements` rows in batches of `B` and returns every part it sent.
    fn run(lease: &Lease, elements: usize) -> (Vec<Routed>, Finished) {
        let mut router = SplitRouter::new(lease, B);
        let mut routed = Vec::new();
        let mut sequence = 0;
        let mut left = elements;
        while left > 0 {
            let rows = left.min(B);
            routed.extend(router.route(sequence, batch(sequence, rows)));
            sequence += 1;
            left -= rows;
        }
        let finished = router.finish();
        (routed, finished)
    }

    /// Checks that `part` holds exactly positions `[lo, hi)`, in order.
    fn check_rows(part: &BatchPart) {
        let rows = (part.hi - part.lo) as usize;
        let keys: Vec<String> = (part.lo..part.hi).map(|p| format!("e{p}")).collect();
        assert_eq!(part.keys, keys);
        let x = &part.tensors[0];
        assert_eq!((x.name.as_str(), x.dtype.as_str()), ("x", "int32"));
        assert_eq!(x.shape, vec![rows as u64, 2]);
        let values: Vec<i32> =
            x.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let expected: Vec<i32> = (part.lo..part.hi).flat_map(|p| [p as i32, p as i32 + 100]).collect();
        assert_eq!(values, expected);
        let label = &part.tensors[1];
        assert_eq!((label.dtype.as_str(), label.shape.clone()), ("uint8", vec![rows as u64]));
        let expected: Vec<u8> = (part.lo..part.hi).map(|p| p as u8).collect();
        assert_eq!(label.data.as_ref(), &expected[..]);
    }

    fn ranges(routed: &[Routed]) -> Vec<(u64, u64, u64, Vec<u32>)> {
        routed.iter().map(|r| (r.part.lo, r.part.hi, r.part.slot, r.consumers.clone())).collect()
    }

    #[test]
    fn whole_batch_parts_share_the_batch_buffers() {
        let l = lease(vec![part(0, 4, 0, &[0]), part(4, 8, 0, &[1]), part(8, 10, 1, &[0])], None);
        let mut router = SplitRouter::new(&l, B);
        let b = batch(0, B);
        let address = b.tensors[0].data.as_ptr();
        let routed = router.route(0, b);
        assert_eq!(ranges(&routed), vec![(0, 4, 0, vec![0])]);
        assert_eq!(routed[0].part.tensors[0].data.as_ptr(), address, "no copy");
        assert_eq!((routed[0].part.epoch, routed[0].part.split), (2, 5));
        check_rows(&routed[0].part);
        let (routed, finished) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(0, 4, 0, vec![0]), (4, 8, 0, vec![1]), (8, 10, 1, vec![0])]);
        routed.iter().for_each(|r| check_rows(&r.part));
        assert_eq!(finished, Finished::default());
    }

    #[test]
    fn parts_straddling_batches_are_assembled() {
        // Batches hold [0,4) [4,8) [8,10); parts cross their boundaries.
        let l = lease(vec![part(0, 3, 0, &[0]), part(3, 9, 1, &[1]), part(9, 10, 2, &[0])], None);
        let (routed, finished) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(0, 3, 0, vec![0]), (3, 9, 1, vec![1]), (9, 10, 2, vec![0])]);
        routed.iter().for_each(|r| check_rows(&r.part));
        assert_eq!(finished.incomplete, 0);
    }

    #[test]
    fn rows_outside_every_part_are_dropped() {
        let l = lease(vec![part(1, 3, 0, &[0]), part(4, 8, 1, &[0])], None);
        let (routed, finished) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(1, 3, 0, vec![0]), (4, 8, 1, vec![0])]);
        routed.iter().for_each(|r| check_rows(&r.part));
        assert_eq!(finished.incomplete, 0);
    }

    #[test]
    fn only_consumer_keeps_that_consumers_parts() {
        let parts = vec![part(0, 4, 0, &[0]), part(4, 8, 0, &[1]), part(8, 10, 1, &[0, 1])];
        let l = lease(parts, Some(1));
        let router = SplitRouter::new(&l, B);
        assert_eq!(router.consumers(), vec![1]);
        let (routed, _) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(4, 8, 0, vec![1]), (8, 10, 1, vec![1])]);
        routed.iter().for_each(|r| check_rows(&r.part));
    }

    #[test]
    fn replicated_parts_fan_out_to_every_consumer() {
        let l = lease(vec![part(0, 4, 0, &[0, 1, 2]), part(4, 10, 1, &[0, 1, 2])], None);
        assert_eq!(SplitRouter::new(&l, B).consumers(), vec![0, 1, 2]);
        let (routed, _) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(0, 4, 0, vec![0, 1, 2]), (4, 10, 1, vec![0, 1, 2])]);
        routed.iter().for_each(|r| check_rows(&r.part));
    }

    #[test]
    fn empty_parts_are_sent_with_the_tensor_layout() {
        let l = lease(vec![part(0, 10, 0, &[0]), part(10, 10, 3, &[1])], None);
        let (routed, finished) = run(&l, 10);
        assert_eq!(ranges(&routed), vec![(0, 10, 0, vec![0]), (10, 10, 3, vec![1])]);
        let empty = &routed[1].part;
        assert!(empty.keys.is_empty());
        assert_eq!(empty.tensors[0].shape, vec![0, 2]);
        assert_eq!(empty.tensors[1].shape, vec![0]);
        assert_eq!(finished.incomplete, 0);
    }

    /// Batch `sequence` of a split whose `ids` (int32) rows are ragged: row `p` holds `p mod 3`
    /// positions of value `p`.
    fn ragged(sequence: u64, rows: usize) -> Batch {
        let first = sequence as usize * B;
        let lengths: Vec<usize> = (first..first + rows).map(|p| p % 3).collect();
        let ids: Vec<u8> = (first..first + rows)
            .flat_map(|p| std::iter::repeat_n(p as i32, p % 3))
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let padding =
            Arc::new(Padding { fields: vec!["ids".into()], multiple_of: 8, value: -1.0, mask: "m".into() });
        Batch {
            epoch: 2,
            origin: None,
            keys: (first..first + rows).map(|p| format!("e{p}")).collect(),
            tensors: vec![BatchTensor {
                name: "ids".into(),
                dtype: DType::Int32,
                shape: vec![rows, longest],
                data: ids,
            }],
            ragged: Some(crate::batch::Ragged { lengths, padding }),
            permit: None,
            unstacked: None,
        }
    }

    #[test]
    fn ragged_rows_travel_unpadded_with_their_lengths() {
        // Part [3, 9) takes rows of batches 0, 1 and 2; part [9, 10) one row of batch 2.
        let l = lease(
            vec![part(0, 3, 0, &[0]), part(3, 9, 1, &[0]), part(9, 10, 2, &[0]), part(10, 10, 3, &[0])],
            None,
        );
        let mut router = SplitRouter::new(&l, B);
        let mut routed = Vec::new();
        for (sequence, rows) in [(0, 4), (1, 4), (2, 2)] {
            routed.extend(router.route(sequence, ragged(sequence, rows)));
        }
        routed.extend(router.finish().routed);
        assert_eq!(ranges(&routed).len(), 4);
        for r in &routed {
            let ids = &r.part.tensors[0];
            let padding = ids.padding.as_ref().expect("ragged rows carry their padding");
            let lengths: Vec<u64> = (r.part.lo..r.part.hi).map(|p| p % 3).collect();
            assert_eq!(padding.lengths, lengths);
            assert_eq!((padding.value, padding.multiple_of, padding.mask.as_str()), (-1.0, 8, "m"));
            let longest = lengths.iter().copied().max().unwrap_or(0);
            assert_eq!(ids.shape, vec![r.part.hi - r.part.lo, longest]);
            let values: Vec<i32> =
                ids.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let expected: Vec<i32> = (r.part.lo..r.part.hi)
                .flat_map(|p| std::iter::repeat_n(p as i32, (p % 3) as usize))
                .collect();
            assert_eq!(values, expected, "part {}..{}", r.part.lo, r.part.hi);
        }
    }

    #[test]
    fn a_short_split_leaves_parts_incomplete() {
        let l = lease(vec![part(0, 4, 0, &[0]), part(4, 10, 1, &[0]), part(10, 12, 2, &[1])], None);
        let (routed, finished) = run(&l, 6);
        assert_eq!(ranges(&routed), vec![(0, 4, 0, vec![0])]);
        assert_eq!(finished.incomplete, 2);
    }
}
