//! Cuts a split's batches into the parts of its lease.
//!
//! Batch `sequence` of a split holds the split's output positions `[sequence·B, sequence·B +
//! len)`, where `B` is the batch size (the tail is the split's last batch). Each lease part
//! `[lo, hi)` takes the rows of the batches it overlaps. A part inside one batch is a zero-copy
//! view of the batch's buffers; a part that straddles batches is assembled into one buffer when
//! its last row arrives. Rows outside every part are dropped.

use crate::batch::Batch;
use crate::buffers;
use bytes::Bytes;
use granary_proto::v1::{BatchPart, Lease, Tensor};
use std::collections::BTreeSet;

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
    /// Shape of one row.
    row_shape: Vec<u64>,
    row_bytes: usize,
    data: Bytes,
}

/// Rows of one tensor gathered for a part.
struct Pieces {
    name: String,
    dtype: String,
    row_shape: Vec<u64>,
    chunks: Vec<Bytes>,
}

impl Pieces {
    fn matches(&self, column: &Column) -> bool {
        self.name == column.name && self.dtype == column.dtype && self.row_shape == column.row_shape
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
        let mut shape = Vec::with_capacity(self.row_shape.len() + 1);
        shape.push(rows);
        shape.extend_from_slice(&self.row_shape);
        Tensor { name: self.name, dtype: self.dtype, shape, data, normalize: None }
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
        let columns: Vec<Column> = batch
            .tensors
            .iter_mut()
            .map(|t| {
                let data = std::mem::take(&mut t.data);
                let row_bytes = if rows == 0 { 0 } else { data.len() / rows as usize };
                Column {
                    name: t.name.clone(),
                    dtype: t.dtype.name().to_string(),
                    row_shape: t.shape.iter().skip(1).map(|&d| d as u64).collect(),
                    row_bytes,
                    data: pooled(data),
                }
            })
            .collect();
        self.layout = columns.iter().map(|c| empty_tensor(&c.name, &c.dtype, &c.row_shape)).collect();
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
                if !gather(part, &columns, &batch.keys[from..to], from, to) {
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

/// Appends rows `[from, to)` of the batch to `part`; false when the batch's tensors do not match
/// the ones the part gathered so far.
fn gather(part: &mut PartState, columns: &[Column], keys: &[String], from: usize, to: usize) -> bool {
    if part.rows == 0 {
        part.pieces = columns
            .iter()
            .map(|c| Pieces {
                name: c.name.clone(),
                dtype: c.dtype.clone(),
                row_shape: c.row_shape.clone(),
                chunks: Vec::new(),
            })
            .collect();
    } else if part.pieces.len() != columns.len()
        || part.pieces.iter().zip(columns).any(|(p, c)| !p.matches(c))
    {
        return false;
    }
    for (pieces, column) in part.pieces.iter_mut().zip(columns) {
        pieces.chunks.push(column.data.slice(from * column.row_bytes..to * column.row_bytes));
    }
    part.keys.extend_from_slice(keys);
    part.rows += (to - from) as u64;
    true
}

fn empty_tensor(name: &str, dtype: &str, row_shape: &[u64]) -> Tensor {
    let mut shape = vec![0];
    shape.extend_from_slice(row_shape);
    Tensor { name: name.to_string(), dtype: dtype.to_string(), shape, data: Bytes::new(), normalize: None }
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
            permit: None,
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

    #[test]
    fn a_short_split_leaves_parts_incomplete() {
        let l = lease(vec![part(0, 4, 0, &[0]), part(4, 10, 1, &[0]), part(10, 12, 2, &[1])], None);
        let (routed, finished) = run(&l, 6);
        assert_eq!(ranges(&routed), vec![(0, 4, 0, vec![0])]);
        assert_eq!(finished.incomplete, 2);
    }
}
