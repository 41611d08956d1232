//! `text.pack`: concatenates a split's tokenized documents into fixed-length rows.
//!
//! Each document is followed by `eos`; rows hold exactly `length` tokens; a document longer than
//! the room left continues in the next row with `position_ids` continuing its count;
//! `segment_ids` number documents 1, 2, 3… within a row (a continued document is segment 1 of
//! its new row) and are 0 on padding; the split's last partial row is padded with `pad_id` (or
//! left out, with `lastRow: drop`).
//!
//! Packing regroups a whole split, so it is no per-element operator: the executor's assembler
//! feeds it the split's elements in their deterministic order ([`Operator::packing`]) and runs
//! the stages after it on the rows. Rows are built in place: three int64 vectors allocated once
//! per row, filled a document's run of tokens at a time, and moved into the row's tensors.

use super::tokenize::field_names;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::ops::{LastRow, Pack};

/// One packed row: three int64 vectors of the row length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRow {
    /// Tokens, documents separated by `eos`, padding at the end of the split's last row.
    pub input_ids: Vec<i64>,
    /// Position of each token within its document (continues across rows), 0 on padding.
    pub position_ids: Vec<i64>,
    /// 1-based document number within the row, 0 on padding.
    pub segment_ids: Vec<i64>,
}

impl PackedRow {
    fn with_capacity(length: usize) -> PackedRow {
        PackedRow {
            input_ids: Vec::with_capacity(length),
            position_ids: Vec::with_capacity(length),
            segment_ids: Vec::with_capacity(length),
        }
    }
}

/// Packs one split's documents, in order, into rows as they fill.
#[derive(Debug)]
pub struct Packer {
    length: usize,
    eos: i64,
    pad_id: i64,
    drop_last: bool,
    row: PackedRow,
    /// Segment id of the document being added, in the current row.
    segment: i64,
}

impl Packer {
    /// A packer of rows of `length` tokens (at least 1); the last partial row is padded with
    /// `pad_id` unless `drop_last`.
    pub fn new(length: usize, eos: i64, pad_id: i64, drop_last: bool) -> Packer {
        let length = length.max(1);
        Packer { length, eos, pad_id, drop_last, row: PackedRow::with_capacity(length), segment: 0 }
    }

    /// Adds one document and its `eos`; appends every row it fills to `full`.
    pub fn push<T: Copy + Into<i64>>(&mut self, doc: &[T], full: &mut Vec<PackedRow>) {
        self.segment += 1;
        let total = doc.len() + 1;
        let mut at = 0usize;
        while at < total {
            let room = self.length - self.row.input_ids.len();
            let n = room.min(total - at);
            let doc_end = (at + n).min(doc.len());
            if at < doc_end {
                self.row.input_ids.extend(doc[at..doc_end].iter().map(|&t| t.into()));
            }
            if at + n == total {
                self.row.input_ids.push(self.eos);
            }
            self.row.position_ids.extend(at as i64..(at + n) as i64);
            let filled = self.row.segment_ids.len() + n;
            self.row.segment_ids.resize(filled, self.segment);
            at += n;
            if filled == self.length {
                full.push(std::mem::replace(&mut self.row, PackedRow::with_capacity(self.length)));
                // The rest of this document is the first segment of the next row; a next
                // document is.
                self.segment = if at < total { 1 } else { 0 };
            }
        }
    }

    /// Ends the split: its last row, when documents left one partly filled, padded; `None` when
    /// there is none or it is dropped. The packer is empty afterwards.
    pub fn finish(&mut self) -> Option<PackedRow> {
        let mut row = std::mem::replace(&mut self.row, PackedRow::with_capacity(0));
        self.segment = 0;
        if row.input_ids.is_empty() || self.drop_last {
            return None;
        }
        row.input_ids.resize(self.length, self.pad_id);
        row.position_ids.resize(self.length, 0);
        row.segment_ids.resize(self.length, 0);
        Some(row)
    }
}

/// Packs `docs` (in split order) into rows of `length` tokens; `length` must be at least 1. The
/// last partial row is padded with `pad_id`.
pub fn pack_split<'a>(
    docs: impl IntoIterator<Item = &'a [i64]>,
    length: usize,
    eos: i64,
    pad_id: i64,
) -> Vec<PackedRow> {
    let mut packer = Packer::new(length, eos, pad_id, false);
    let mut rows = Vec::new();
    for doc in docs {
        packer.push(doc, &mut rows);
    }
    rows.extend(packer.finish());
    rows
}

/// The `text.pack` stage: reads each document's token field and makes the rows' elements.
pub struct PackOp {
    length: usize,
    eos: i64,
    pad_id: i64,
    field: String,
    drop_last: bool,
}

impl PackOp {
    /// The operator for one `text.pack` stage.
    pub fn new(cfg: &Pack) -> PackOp {
        PackOp {
            length: cfg.length.max(1) as usize,
            eos: cfg.eos,
            pad_id: cfg.pad_id,
            field: cfg.field.clone(),
            drop_last: cfg.last_row == LastRow::Drop,
        }
    }

    /// A packer for one split.
    pub fn packer(&self) -> Packer {
        Packer::new(self.length, self.eos, self.pad_id, self.drop_last)
    }

    /// Adds `element`'s document (its token field, a 1-D integer tensor) to `packer`; appends the
    /// rows it fills to `full`.
    pub fn push(
        &self,
        packer: &mut Packer,
        element: &Element,
        full: &mut Vec<PackedRow>,
    ) -> Result<(), OpError> {
        let name = &self.field;
        let tensor = match element.get(name) {
            Some(Value::Tensor(t)) if t.shape.len() == 1 => t,
            Some(Value::Tensor(t)) => {
                return Err(OpError::new(format!(
                    "text.pack: field `{name}` has shape {:?}; it must be a 1-D tensor of token ids as \
                     `text.tokenize` produces",
                    t.shape
                )));
            }
            Some(other) => {
                return Err(OpError::new(format!(
                    "text.pack: field `{name}` is {}, not token ids; add `text.tokenize` before \
                     `text.pack`, or name the token field in `field`",
                    other.kind()
                )));
            }
            None => {
                return Err(OpError::new(format!(
                    "text.pack: no field `{name}` (the element's fields: {}); name the token field in \
                     `field`, or add `text.tokenize` before `text.pack`",
                    field_names(element)
                )));
            }
        };
        match &tensor.data {
            TensorData::I64(v) => packer.push(v, full),
            TensorData::I32(v) => packer.push(v, full),
            TensorData::U8(v) => packer.push(v, full),
            TensorData::F32(_) | TensorData::F64(_) => {
                return Err(OpError::new(format!(
                    "text.pack: field `{name}` is a {} tensor; token ids must be integers (int64 as \
                     `text.tokenize` produces; `table.cast` converts others)",
                    tensor.dtype().name()
                )));
            }
        }
        Ok(())
    }

    /// Row `index` of split `split` as an element: key `split<split>#row<index>`, fields
    /// `input_ids`, `position_ids` and `segment_ids` (int64, [length]).
    pub fn row_element(&self, split: u64, index: u64, row: PackedRow) -> Element {
        let tensor = |data: Vec<i64>| {
            Value::Tensor(Tensor { shape: vec![data.len()], data: TensorData::I64(SmallVec::from_vec(data)) })
        };
        Element {
            key: format!("split{split}#row{index}"),
            fields: vec![
                ("input_ids".into(), tensor(row.input_ids)),
                ("position_ids".into(), tensor(row.position_ids)),
                ("segment_ids".into(), tensor(row.segment_ids)),
            ],
        }
    }
}

impl Operator for PackOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        // The executor hands whole splits to `packing()`; a caller that runs stages one element
        // at a time has no rows to make.
        Err(OpError::new(format!(
            "text.pack packs the documents of a whole split, not element `{}` alone",
            element.key
        )))
    }

    fn packing(&self) -> Option<&PackOp> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_fill_rows_and_continue() {
        let docs: [&[i64]; 2] = [&[5, 6, 7], &[8]];
        let rows = pack_split(docs, 3, 2, 0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].input_ids, [5, 6, 7]);
        assert_eq!(rows[1].input_ids, [2, 8, 2]);
        assert_eq!(rows[1].position_ids, [3, 0, 1]);
        assert_eq!(rows[1].segment_ids, [1, 2, 2]);
    }

    #[test]
    fn last_row_is_padded() {
        let docs: [&[i64]; 1] = [&[5]];
        let rows = pack_split(docs, 4, 2, 9);
        assert_eq!(rows[0].input_ids, [5, 2, 9, 9]);
        assert_eq!(rows[0].position_ids, [0, 1, 0, 0]);
        assert_eq!(rows[0].segment_ids, [1, 1, 0, 0]);
    }

    #[test]
    fn a_long_document_spans_several_rows_counting_its_positions_on() {
        let doc: Vec<i64> = (100..110).collect();
        let rows = pack_split([doc.as_slice(), &[7][..]], 4, 1, 0);
        let ids: Vec<Vec<i64>> = rows.iter().map(|r| r.input_ids.clone()).collect();
        assert_eq!(
            ids,
            [vec![100, 101, 102, 103], vec![104, 105, 106, 107], vec![108, 109, 1, 7], vec![1, 0, 0, 0]]
        );
        let positions: Vec<Vec<i64>> = rows.iter().map(|r| r.position_ids.clone()).collect();
        assert_eq!(positions, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 0], vec![1, 0, 0, 0]]);
        let segments: Vec<Vec<i64>> = rows.iter().map(|r| r.segment_ids.clone()).collect();
        assert_eq!(segments, [vec![1; 4], vec![1; 4], vec![1, 1, 1, 2], vec![1, 0, 0, 0]]);
    }

    #[test]
    fn an_empty_document_is_its_eos_alone() {
        let rows = pack_split([&[][..], &[4][..], &[][..]], 8, 3, 0);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].input_ids, [3, 4, 3, 3, 0, 0, 0, 0]);
        assert_eq!(rows[0].position_ids, [0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(rows[0].segment_ids, [1, 2, 2, 3, 0, 0, 0, 0]);
    }

    #[test]
    fn a_row_filled_exactly_at_a_document_end_starts_the_next_at_segment_one() {
        let rows = pack_split([&[5, 6][..], &[7, 8][..]], 3, 2, 0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].input_ids, [5, 6, 2]);
        assert_eq!(rows[0].segment_ids, [1, 1, 1]);
        assert_eq!(rows[1].input_ids, [7, 8, 2]);
        assert_eq!(rows[1].position_ids, [0, 1, 2]);
        assert_eq!(rows[1].segment_ids, [1, 1, 1]);
    }

    #[test]
    fn every_token_and_one_eos_per_document_is_packed_once() {
        let docs: Vec<Vec<i64>> =
            (0..40).map(|d| (0..(d * 7) % 23).map(|t| 10 + d * 100 + t).collect()).collect();
        for length in [1, 2, 5, 16, 64, 1000] {
            let rows = pack_split(docs.iter().map(Vec::as_slice), length, 1, 0);
            let mut packed: Vec<i64> = rows
                .iter()
                .flat_map(|r| r.input_ids.iter().zip(&r.segment_ids))
                .filter(|(_, s)| **s != 0)
                .map(|(t, _)| *t)
                .collect();
            let mut expected: Vec<i64> = docs.iter().flat_map(|d| d.iter().copied().chain([1])).collect();
            assert_eq!(packed, expected, "length {length}: order kept");
            packed.sort_unstable();
            expected.sort_unstable();
            assert_eq!(packed, expected);
            assert!(rows.iter().all(|r| r.input_ids.len() == length && r.position_ids.len() == length));
        }
    }

    #[test]
    fn the_last_partial_row_is_left_out_when_asked() {
        let mut packer = Packer::new(4, 2, 0, true);
        let mut rows = Vec::new();
        packer.push(&[5i64, 6, 7, 8, 9], &mut rows);
        assert_eq!(rows.len(), 1);
        assert_eq!(packer.finish(), None);
    }

    #[test]
    fn narrower_token_types_pack_as_int64() {
        let mut packer = Packer::new(3, 2, 0, false);
        let mut rows = Vec::new();
        packer.push(&[5i32, 6], &mut rows);
        assert_eq!(rows[0].input_ids, [5, 6, 2]);
    }

    #[test]
    fn a_document_without_its_token_field_is_an_error_naming_the_field() {
        let cfg: Pack = serde_json::from_value(serde_json::json!({"length": 4, "eos": 2})).unwrap();
        let op = PackOp::new(&cfg);
        let mut element = Element::new("a.jsonl#0");
        element.set("text", Value::Text("hello".into()));
        let error = op.push(&mut op.packer(), &element, &mut Vec::new()).unwrap_err();
        assert!(error.0.contains("no field `input_ids`"), "{}", error.0);
    }
}
