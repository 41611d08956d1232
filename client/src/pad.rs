//! `spec.batch.pad` finished in the client. The padded fields of a slot's parts arrive ragged
//! (rows back to back, each row's length in `Tensor.padding`); once every part is in, the slot's
//! longest row is known, and the rows are padded to it (rounded up to `multipleOf`) and the
//! `uint8` mask is added after the batch's tensors, exactly as the in-process engine does.

use bytes::{Bytes, BytesMut};
use granary_proto::v1::Padding;

use crate::tensor::{Tensor, dimensions};

/// One tensor of a slot, joined from its parts: dense, or ragged until [`finish`] pads it.
pub(crate) enum Column {
    /// A tensor as it is delivered.
    Dense(Tensor),
    /// A padded field's rows, unpadded.
    Ragged(RaggedColumn),
}

/// A padded field's rows of a whole slot, back to back.
#[derive(Debug)]
pub(crate) struct RaggedColumn {
    name: String,
    dtype: String,
    /// The shape of one position (the axes after the first two).
    position: Vec<usize>,
    /// Bytes of one position.
    per: usize,
    /// Each row's length.
    lengths: Vec<usize>,
    data: Bytes,
    padding: Padding,
}

/// Joins the ragged pieces of one padded field (one per part, in plan order).
pub(crate) fn join(pieces: Vec<granary_proto::v1::Tensor>) -> Result<RaggedColumn, String> {
    let Some(head) = pieces.first() else {
        return Err("a tensor with no parts".to_string());
    };
    let (Some(template), Some(position)) = (head.padding.clone(), head.shape.get(2..)) else {
        return Err(format!(
            "padded tensor `{}` has shape {:?}, without a length axis",
            head.name, head.shape
        ));
    };
    let (name, dtype) = (head.name.clone(), head.dtype.clone());
    let position = dimensions(position)?;
    let per = position.iter().product::<usize>() * dtype_size(&dtype)?;
    let mut lengths = Vec::new();
    let mut bytes = 0;
    for piece in &pieces {
        let Some(padding) = piece.padding.as_ref() else {
            return Err(format!("tensor `{name}` is padded in one part and not in another"));
        };
        if piece.name != name
            || piece.dtype != dtype
            || piece.shape.get(2..) != head.shape.get(2..)
            || padding.value.to_bits() != template.value.to_bits()
            || padding.multiple_of != template.multiple_of
            || padding.mask != template.mask
        {
            return Err(format!("padded tensor `{name}` differs between parts in dtype, shape or padding"));
        }
        let rows = dimensions(&padding.lengths)?;
        let positions: usize = rows.iter().sum();
        if piece.shape.first() != Some(&(rows.len() as u64)) || positions * per != piece.data.len() {
            return Err(format!(
                "padded tensor `{name}` has {} row lengths summing to {positions} positions for shape {:?} and {} bytes",
                rows.len(),
                piece.shape,
                piece.data.len()
            ));
        }
        lengths.extend(rows);
        bytes += piece.data.len();
    }
    let data = if pieces.len() == 1 {
        pieces.into_iter().next().map(|p| p.data).unwrap_or_default()
    } else {
        let mut data = BytesMut::with_capacity(bytes);
        for piece in &pieces {
            data.extend_from_slice(&piece.data);
        }
        data.freeze()
    };
    Ok(RaggedColumn { name, dtype, position, per, lengths, data, padding: template })
}

/// The slot's tensors: ragged columns padded to one width (the longest row of any, rounded up
/// to `multipleOf`), then the mask of the first ragged column's rows as the last tensor.
pub(crate) fn finish(columns: Vec<Column>) -> Result<Vec<Tensor>, String> {
    let mut longest = 0;
    let mut first: Option<(Vec<usize>, String, u32)> = None;
    for column in &columns {
        if let Column::Ragged(c) = column {
            longest = longest.max(c.lengths.iter().copied().max().unwrap_or(0));
            match &first {
                None => first = Some((c.lengths.clone(), c.padding.mask.clone(), c.padding.multiple_of)),
                Some((lengths, _, _)) if *lengths != c.lengths => {
                    return Err(format!("padded tensor `{}` has other row lengths than the first", c.name));
                }
                Some(_) => {}
            }
        }
    }
    let Some((lengths, mask_name, multiple_of)) = first else {
        return Ok(columns
            .into_iter()
            .filter_map(|c| match c {
                Column::Dense(t) => Some(t),
                Column::Ragged(_) => None,
            })
            .collect());
    };
    let multiple = multiple_of.max(1) as usize;
    let width = longest.div_ceil(multiple) * multiple;
    let mut tensors: Vec<Tensor> = columns
        .into_iter()
        .map(|column| match column {
            Column::Dense(t) => t,
            Column::Ragged(c) => c.pad(width),
        })
        .collect();
    tensors.push(Tensor {
        name: mask_name,
        dtype: "uint8".to_string(),
        shape: vec![lengths.len(), width],
        data: mask(&lengths, width),
    });
    Ok(tensors)
}

impl RaggedColumn {
    /// The rows padded to `width` positions with the padding value.
    fn pad(self, width: usize) -> Tensor {
        let fill = fill_bytes(&self.dtype, self.padding.value);
        let zero = fill.iter().all(|&b| b == 0);
        let mut data = BytesMut::with_capacity(self.lengths.len() * width * self.per);
        let mut at = 0;
        for &len in &self.lengths {
            let n = len * self.per;
            data.extend_from_slice(&self.data[at..at + n]);
            at += n;
            let missing = (width - len) * self.per;
            if zero {
                data.resize(data.len() + missing, 0);
            } else {
                for _ in 0..width - len {
                    for _ in 0..self.per / fill.len().max(1) {
                        data.extend_from_slice(&fill);
                    }
                }
            }
        }
        let mut shape = vec![self.lengths.len(), width];
        shape.extend_from_slice(&self.position);
        Tensor { name: self.name, dtype: self.dtype, shape, data: data.freeze() }
    }
}

/// The mask of rows of `lengths` at `width`: 1 at real positions, 0 at padding.
fn mask(lengths: &[usize], width: usize) -> Bytes {
    let mut mask = BytesMut::with_capacity(lengths.len() * width);
    for &len in lengths {
        mask.resize(mask.len() + len, 1);
        mask.resize(mask.len() + (width - len), 0);
    }
    mask.freeze()
}

/// Bytes per value of the dtypes workers pad.
fn dtype_size(dtype: &str) -> Result<usize, String> {
    match dtype {
        "uint8" => Ok(1),
        "int32" | "float32" => Ok(4),
        "int64" | "float64" => Ok(8),
        other => Err(format!("padded tensor of dtype `{other}`, which workers do not send")),
    }
}

/// The little-endian bytes of `value` as one `dtype` value, as the worker converts it.
fn fill_bytes(dtype: &str, value: f64) -> Vec<u8> {
    match dtype {
        "uint8" => vec![value as u8],
        "int32" => (value as i32).to_le_bytes().to_vec(),
        "int64" => (value as i64).to_le_bytes().to_vec(),
        "float32" => (value as f32).to_le_bytes().to_vec(),
        _ => value.to_le_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part's ragged `ids` (int64) with rows of `rows`, padding -1 rounded to `multiple_of`.
    fn piece(rows: &[&[i64]], multiple_of: u32) -> granary_proto::v1::Tensor {
        let data: Vec<u8> = rows.iter().flat_map(|r| r.iter()).flat_map(|v| v.to_le_bytes()).collect();
        let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0) as u64;
        granary_proto::v1::Tensor {
            name: "ids".into(),
            dtype: "int64".into(),
            shape: vec![rows.len() as u64, longest],
            data: Bytes::from(data),
            normalize: None,
            padding: Some(Padding {
                lengths: rows.iter().map(|r| r.len() as u64).collect(),
                value: -1.0,
                multiple_of,
                mask: "ids_mask".into(),
            }),
            images: None,
        }
    }

    fn i64s(t: &Tensor) -> Vec<i64> {
        t.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn pads_a_slot_to_its_longest_row_and_adds_the_mask_last() {
        let ids = join(vec![piece(&[&[1], &[2, 3]], 1), piece(&[&[4, 5, 6]], 1)]).unwrap();
        let label = Tensor {
            name: "label".into(),
            dtype: "uint8".into(),
            shape: vec![3],
            data: Bytes::from_static(&[7, 8, 9]),
        };
        let tensors = finish(vec![Column::Ragged(ids), Column::Dense(label)]).unwrap();
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["ids", "label", "ids_mask"]);
        assert_eq!(tensors[0].shape, vec![3, 3]);
        assert_eq!(i64s(&tensors[0]), vec![1, -1, -1, 2, 3, -1, 4, 5, 6]);
        assert_eq!(tensors[2].shape, vec![3, 3]);
        assert_eq!(&tensors[2].data[..], &[1, 0, 0, 1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn rounds_up_to_multiple_of_and_checks_the_pieces() {
        let ids = join(vec![piece(&[&[1, 2, 3]], 4)]).unwrap();
        let tensors = finish(vec![Column::Ragged(ids)]).unwrap();
        assert_eq!(tensors[0].shape, vec![1, 4]);
        assert_eq!(i64s(&tensors[0]), vec![1, 2, 3, -1]);
        let mut bad = piece(&[&[1, 2]], 4);
        bad.padding.as_mut().unwrap().lengths = vec![3];
        assert!(join(vec![bad]).unwrap_err().contains("row lengths"));
        assert!(join(vec![piece(&[&[1]], 4), piece(&[&[1]], 8)]).unwrap_err().contains("differs"));
    }
}
