//! The binary encoding of calls to a Python runner and of its replies (little-endian; the
//! runner's side is `python/granary/_stage_runner.py`). Field data lies in the shared memory;
//! frames carry only names, kinds, shapes and offsets.

use crate::element::{Element, FieldName, Value};
use crate::ops::OpError;
use crate::tensor::{DType, Tensor};
use bytes::Bytes;

mod each;
pub use each::{decode_each, encode_each};

const BYTES: u8 = 0;
const TEXT: u8 = 1;
const TENSOR: u8 = 2;
/// In a reply: the input field of that name, unchanged (the function returned the same object).
const SAME: u8 = 3;
/// Where each value starts in the shared memory.
const ALIGN: usize = 64;

const DTYPES: [DType; 5] = [DType::Uint8, DType::Int32, DType::Int64, DType::Float32, DType::Float64];

fn dtype_code(d: DType) -> u8 {
    DTYPES.iter().position(|x| *x == d).map_or(0, |i| i as u8)
}

/// What a call needs besides its elements.
pub struct CallHeader {
    /// Index of the stage among the pipeline's Python stages.
    pub stage: u16,
    /// The seed of the function's `rng`, when it takes one.
    pub rng: Option<u64>,
}

/// One value to copy into the shared memory, with its field descriptor.
struct Input<'a> {
    name: &'a str,
    kind: u8,
    dtype: u8,
    shape: Vec<u64>,
    parts: Vec<&'a [u8]>,
}

impl Input<'_> {
    fn nbytes(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }
}

fn input_of<'a>(name: &'a str, value: &'a Value) -> Input<'a> {
    match value {
        Value::Bytes(b) => Input { name, kind: BYTES, dtype: 0, shape: Vec::new(), parts: vec![b] },
        Value::Text(s) => Input { name, kind: TEXT, dtype: 0, shape: Vec::new(), parts: vec![s.as_bytes()] },
        Value::Tensor(t) => Input {
            name,
            kind: TENSOR,
            dtype: dtype_code(t.dtype()),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            parts: vec![t.as_le_bytes()],
        },
    }
}

/// Stacks the same field of every element of a group: tensors along a new leading axis (they
/// must agree in type and shape), text and bytes as lists.
fn stacked<'a>(name: &'a str, elements: &'a [Element]) -> Result<Input<'a>, OpError> {
    let first = elements.first().and_then(|e| e.get(name));
    let Some(first) = first else { return Err(OpError::new(format!("no field `{name}`"))) };
    let mut parts = Vec::with_capacity(elements.len());
    for e in elements {
        let Some(v) = e.get(name) else {
            return Err(OpError::new(format!(
                "a batched function needs the same fields in every element, but `{}` has no field `{name}`",
                e.key
            )));
        };
        match (first, v) {
            (Value::Bytes(_), Value::Bytes(b)) => parts.push(&b[..]),
            (Value::Text(_), Value::Text(s)) => parts.push(s.as_bytes()),
            (Value::Tensor(a), Value::Tensor(b)) if a.dtype() == b.dtype() && a.shape == b.shape => {
                parts.push(b.as_le_bytes())
            }
            (Value::Tensor(a), Value::Tensor(b)) => {
                return Err(OpError::new(format!(
                    "a batched function stacks field `{name}`, but it is {} {:?} in `{}` and {} {:?} in `{}`; \
                     make the shapes equal first (e.g. crop or resize) or use `batched: false`",
                    a.dtype().name(),
                    a.shape,
                    elements[0].key,
                    b.dtype().name(),
                    b.shape,
                    e.key
                )));
            }
            (a, b) => {
                return Err(OpError::new(format!(
                    "field `{name}` is {} in `{}` but {} in `{}`",
                    a.kind(),
                    elements[0].key,
                    b.kind(),
                    e.key
                )));
            }
        }
    }
    Ok(match first {
        Value::Bytes(_) => Input { name, kind: BYTES, dtype: 0, shape: Vec::new(), parts },
        Value::Text(_) => Input { name, kind: TEXT, dtype: 0, shape: Vec::new(), parts },
        Value::Tensor(t) => Input {
            name,
            kind: TENSOR,
            dtype: dtype_code(t.dtype()),
            shape: std::iter::once(elements.len() as u64).chain(t.shape.iter().map(|&d| d as u64)).collect(),
            parts,
        },
    })
}

/// Writes a call: the elements' field data into `shm` (grown as needed by `reserve`) and the
/// frame body into `frame`. `batched` stacks the group's fields; otherwise `elements` holds one.
pub fn encode_call(
    header: &CallHeader,
    elements: &[Element],
    batched: bool,
    frame: &mut Vec<u8>,
    shm: &mut super::shm::Shared,
) -> Result<(), OpError> {
    let inputs: Vec<Input> = match (batched, elements) {
        (false, [element]) => element.fields.iter().map(|(n, v)| input_of(n, v)).collect(),
        (false, _) => return Err(OpError::new("an element-wise call takes one element")),
        (true, _) => {
            let names =
                elements.first().map(|e| e.fields.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>());
            names.unwrap_or_default().into_iter().map(|n| stacked(n, elements)).collect::<Result<_, _>>()?
        }
    };
    let (offsets, end) = layout(&inputs, 0);
    // Room for the inputs and, in the common case, for outputs as large as them.
    shm.reserve(end * 2 + ALIGN).map_err(|e| OpError::new(format!("cannot grow the shared memory: {e}")))?;
    put_data(shm.bytes_mut(), &inputs, &offsets);
    frame.clear();
    frame.push(1);
    frame.extend_from_slice(&header.stage.to_le_bytes());
    frame.push(u8::from(header.rng.is_some()));
    frame.extend_from_slice(&header.rng.unwrap_or(0).to_le_bytes());
    frame.extend_from_slice(&(shm.len() as u64).to_le_bytes());
    frame.extend_from_slice(&(end as u64).to_le_bytes());
    frame.extend_from_slice(&(elements.len() as u32).to_le_bytes());
    for e in elements {
        frame.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        frame.extend_from_slice(e.key.as_bytes());
    }
    put_fields(frame, &inputs, &offsets, batched);
    Ok(())
}

/// Lays out `inputs` one after another from `start`, each at a multiple of [`ALIGN`]: their
/// offsets, and where the last ends.
fn layout(inputs: &[Input], start: usize) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(inputs.len());
    let mut end = start;
    for input in inputs {
        offsets.push(end);
        end = (end + input.nbytes()).next_multiple_of(ALIGN);
    }
    (offsets, end)
}

/// Copies each input's data to its offset in `memory`.
fn put_data(memory: &mut [u8], inputs: &[Input], offsets: &[usize]) {
    for (input, &at) in inputs.iter().zip(offsets) {
        let mut cursor = at;
        for part in &input.parts {
            memory[cursor..cursor + part.len()].copy_from_slice(part);
            cursor += part.len();
        }
    }
}

/// Writes the field descriptors of `inputs` (their data at `offsets`) into `frame`.
fn put_fields(frame: &mut Vec<u8>, inputs: &[Input], offsets: &[usize], batched: bool) {
    frame.extend_from_slice(&(inputs.len() as u16).to_le_bytes());
    for (input, &at) in inputs.iter().zip(offsets) {
        frame.extend_from_slice(&(input.name.len() as u16).to_le_bytes());
        frame.extend_from_slice(input.name.as_bytes());
        frame.extend_from_slice(&[input.kind, input.dtype, input.shape.len() as u8]);
        for d in &input.shape {
            frame.extend_from_slice(&d.to_le_bytes());
        }
        frame.extend_from_slice(&(at as u64).to_le_bytes());
        frame.extend_from_slice(&(input.nbytes() as u64).to_le_bytes());
        if batched && input.kind != TENSOR {
            for part in &input.parts {
                frame.extend_from_slice(&(part.len() as u64).to_le_bytes());
            }
        }
    }
}

/// What a runner answered.
pub enum Reply<'a> {
    /// The function returned; its fields follow in the body, at `fields`.
    Ok {
        /// The shared memory's size now (the runner grows it when its outputs need room).
        shm_size: usize,
        /// The rest of the body: the field descriptors.
        fields: Reader<'a>,
    },
    /// The function raised: the exception with its Python traceback.
    Raised(String),
    /// The function returned something Granary cannot carry: what and how to fix it.
    BadReturn(String),
    /// A filter's decisions: one byte per element of the call, 1 to keep it, 0 to drop it.
    Kept(&'a [u8]),
}

/// Reads little-endian values from a frame body, failing on a short one.
pub struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `body`.
    pub fn new(body: &'a [u8]) -> Reader<'a> {
        Reader { body, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], OpError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.body.len());
        let Some(end) = end else { return Err(OpError::new("the Python runner sent a truncated reply")) };
        let s = &self.body[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, OpError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, OpError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, OpError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, OpError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn usize(&mut self) -> Result<usize, OpError> {
        usize::try_from(self.u64()?).map_err(|_| OpError::new("the Python runner sent a size too large"))
    }
}

/// Parses the start of a reply.
pub fn decode_reply(body: &[u8]) -> Result<Reply<'_>, OpError> {
    let mut r = Reader::new(body);
    match r.u8()? {
        0 => {
            let shm_size = r.usize()?;
            Ok(Reply::Ok { shm_size, fields: r })
        }
        status @ (1 | 2) => {
            let n = r.u32()? as usize;
            let message = String::from_utf8_lossy(r.take(n)?).into_owned();
            Ok(if status == 1 { Reply::Raised(message) } else { Reply::BadReturn(message) })
        }
        3 => {
            let n = r.u32()? as usize;
            Ok(Reply::Kept(r.take(n)?))
        }
        other => Err(OpError::new(format!("the Python runner sent an unknown reply ({other})"))),
    }
}

/// The fields of a reply as new values: element-wise, one element's fields (`inputs` supplies
/// the fields returned unchanged); batched, each of the `n` elements' fields.
pub fn decode_fields(
    fields: &mut Reader<'_>,
    memory: &[u8],
    batched: Option<usize>,
    inputs: &mut Vec<(FieldName, Value)>,
) -> Result<Vec<Vec<(FieldName, Value)>>, OpError> {
    let rows = batched.unwrap_or(1);
    let mut out: Vec<Vec<(FieldName, Value)>> = (0..rows).map(|_| Vec::new()).collect();
    let count = fields.u16()?;
    for _ in 0..count {
        let len = fields.u16()? as usize;
        let name = std::str::from_utf8(fields.take(len)?)
            .map_err(|_| OpError::new("the Python runner sent a field name that is not UTF-8"))?;
        let name = FieldName::from(name);
        let kind = fields.u8()?;
        let dtype = fields.u8()?;
        let ndim = fields.u8()? as usize;
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            shape.push(fields.usize()?);
        }
        let offset = fields.usize()?;
        let nbytes = fields.usize()?;
        let data = offset
            .checked_add(nbytes)
            .and_then(|end| memory.get(offset..end))
            .ok_or_else(|| OpError::new(format!("field `{name}` lies outside the shared memory")))?;
        match kind {
            SAME => {
                let i = inputs.iter().position(|(n, _)| *n == name);
                let value = i.map(|i| inputs.swap_remove(i).1).ok_or_else(|| {
                    OpError::new(format!("the Python runner kept field `{name}`, which the element lacks"))
                })?;
                out[0].push((name, value));
            }
            TENSOR => {
                let d =
                    *DTYPES.get(dtype as usize).ok_or_else(|| OpError::new("unknown dtype in a reply"))?;
                match batched {
                    None => {
                        // The input of the same name, type and size takes the bytes in place: no
                        // allocation (and page faults) for an image that comes back an image.
                        let reused = inputs.iter().position(|(n, v)| {
                            *n == name
                                && matches!(v, Value::Tensor(t) if t.dtype() == d && t.nbytes() == data.len())
                        });
                        let t = match reused.map(|i| inputs.swap_remove(i).1) {
                            Some(Value::Tensor(mut t)) => {
                                if !t.overwrite_le_bytes(shape.clone(), data) {
                                    t = tensor(&name, d, shape, data)?;
                                }
                                t
                            }
                            _ => tensor(&name, d, shape, data)?,
                        };
                        out[0].push((name, Value::Tensor(t)));
                    }
                    Some(n) => {
                        if shape.first() != Some(&n) {
                            return Err(OpError::new(format!(
                                "field `{name}` has shape {shape:?}; a batched function returns {n} rows"
                            )));
                        }
                        let row_shape = shape[1..].to_vec();
                        let row = nbytes / n.max(1);
                        if row * n != nbytes {
                            return Err(OpError::new(format!(
                                "field `{name}`: {nbytes} bytes for shape {shape:?}"
                            )));
                        }
                        for (i, slot) in out.iter_mut().enumerate() {
                            let t = tensor(&name, d, row_shape.clone(), &data[i * row..(i + 1) * row])?;
                            slot.push((name.clone(), Value::Tensor(t)));
                        }
                    }
                }
            }
            BYTES | TEXT => {
                let mut lengths = Vec::with_capacity(rows);
                match batched {
                    None => lengths.push(nbytes),
                    Some(n) => {
                        for _ in 0..n {
                            lengths.push(fields.usize()?);
                        }
                    }
                }
                let mut start = 0usize;
                for (slot, len) in out.iter_mut().zip(lengths) {
                    let piece = start
                        .checked_add(len)
                        .and_then(|end| data.get(start..end))
                        .ok_or_else(|| OpError::new(format!("field `{name}`: lengths exceed its bytes")))?;
                    start += len;
                    let value = if kind == TEXT {
                        let s = std::str::from_utf8(piece)
                            .map_err(|_| OpError::new(format!("field `{name}` is not UTF-8")))?;
                        Value::Text(s.to_string())
                    } else {
                        Value::Bytes(Bytes::copy_from_slice(piece))
                    };
                    slot.push((name.clone(), value));
                }
            }
            other => return Err(OpError::new(format!("unknown field kind {other} in a reply"))),
        }
    }
    Ok(out)
}

fn tensor(name: &str, dtype: DType, shape: Vec<usize>, data: &[u8]) -> Result<Tensor, OpError> {
    let bytes = data.len();
    Tensor::from_le_bytes(dtype, shape, data)
        .ok_or_else(|| OpError::new(format!("field `{name}`: {bytes} bytes do not fill its shape")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::python::shm::Shared;
    use crate::tensor::TensorData;
    use smallvec::smallvec;

    fn element() -> Element {
        let mut e = Element::new("a/0001.jpg");
        e.set("jpeg", Value::Bytes(Bytes::from_static(b"\xff\xd8 jpeg")));
        e.set("caption", Value::Text("a cat".into()));
        e.set(
            "image",
            Value::Tensor(Tensor::new(vec![2, 2, 1], TensorData::U8(smallvec![1, 2, 3, 4])).unwrap()),
        );
        e
    }

    #[test]
    fn a_call_puts_the_data_in_shared_memory_and_the_layout_in_the_frame() {
        let mut shm = Shared::new().unwrap();
        let mut frame = Vec::new();
        let header = CallHeader { stage: 2, rng: Some(7) };
        encode_call(&header, &[element()], false, &mut frame, &mut shm).unwrap();
        assert_eq!(frame[0], 1);
        assert_eq!(u16::from_le_bytes([frame[1], frame[2]]), 2);
        assert_eq!(frame[3], 1, "takes an rng");
        assert!(shm.len() >= 3 * ALIGN);
        let memory = shm.bytes();
        assert_eq!(&memory[..7], b"\xff\xd8 jpeg");
        assert_eq!(&memory[ALIGN..ALIGN + 5], b"a cat");
        assert_eq!(&memory[2 * ALIGN..2 * ALIGN + 4], &[1, 2, 3, 4]);
    }

    /// A reply the runner would send: `image` replaced by a 1×2 float32 tensor at `at`, `caption`
    /// kept as it was.
    fn reply(at: u64) -> Vec<u8> {
        let mut r = vec![0u8];
        r.extend_from_slice(&(1u64 << 20).to_le_bytes());
        r.extend_from_slice(&2u16.to_le_bytes());
        r.extend_from_slice(&7u16.to_le_bytes());
        r.extend_from_slice(b"caption");
        r.extend_from_slice(&[SAME, 0, 0]);
        r.extend_from_slice(&0u64.to_le_bytes());
        r.extend_from_slice(&0u64.to_le_bytes());
        r.extend_from_slice(&5u16.to_le_bytes());
        r.extend_from_slice(b"image");
        r.extend_from_slice(&[TENSOR, 3, 2]);
        r.extend_from_slice(&1u64.to_le_bytes());
        r.extend_from_slice(&2u64.to_le_bytes());
        r.extend_from_slice(&at.to_le_bytes());
        r.extend_from_slice(&8u64.to_le_bytes());
        r
    }

    #[test]
    fn a_reply_becomes_the_new_fields_and_keeps_what_came_back_unchanged() {
        let mut memory = vec![0u8; 256];
        memory[128..136].copy_from_slice(bytemuck::cast_slice(&[0.5f32, -1.0]));
        let body = reply(128);
        let Reply::Ok { shm_size, mut fields } = decode_reply(&body).unwrap() else { panic!("not ok") };
        assert_eq!(shm_size, 1 << 20);
        let mut inputs = element().fields;
        let out = decode_fields(&mut fields, &memory, None, &mut inputs).unwrap();
        assert_eq!(out.len(), 1);
        let names: Vec<&str> = out[0].iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["caption", "image"], "jpeg was dropped");
        assert_eq!(out[0][0].1, Value::Text("a cat".into()));
        let Value::Tensor(t) = &out[0][1].1 else { panic!("a tensor") };
        assert_eq!((t.shape.clone(), t.data.clone()), (vec![1, 2], TensorData::F32(smallvec![0.5, -1.0])));
    }

    #[test]
    fn replies_pointing_outside_the_memory_or_truncated_are_refused() {
        let memory = vec![0u8; 64];
        let body = reply(60);
        let Reply::Ok { mut fields, .. } = decode_reply(&body).unwrap() else { panic!("not ok") };
        let error = decode_fields(&mut fields, &memory, None, &mut element().fields).err().unwrap();
        assert!(error.0.contains("outside the shared memory"), "{error}");
        let short = &body[..body.len() - 3];
        let Reply::Ok { mut fields, .. } = decode_reply(short).unwrap() else { panic!("not ok") };
        assert!(decode_fields(&mut fields, &memory, None, &mut element().fields).is_err());
    }

    #[test]
    fn a_filter_reply_carries_one_decision_per_element() {
        let body = [3u8, 3, 0, 0, 0, 1, 0, 1];
        let Reply::Kept(flags) = decode_reply(&body).unwrap() else { panic!("not a filter reply") };
        assert_eq!(flags, [1, 0, 1]);
        assert!(decode_reply(&body[..7]).is_err(), "a short reply is refused");
    }

    #[test]
    fn a_group_needs_equal_shapes() {
        let mut other = element();
        other.key = "a/0002.jpg".into();
        other.set("image", Value::Tensor(Tensor::new(vec![1, 1, 1], TensorData::U8(smallvec![9])).unwrap()));
        let mut shm = Shared::new().unwrap();
        let error = encode_call(
            &CallHeader { stage: 0, rng: None },
            &[element(), other],
            true,
            &mut Vec::new(),
            &mut shm,
        )
        .err()
        .unwrap();
        assert!(error.0.contains("stacks field `image`"), "{error}");
        assert!(error.0.contains("`a/0002.jpg`"), "{error}");
    }
}
