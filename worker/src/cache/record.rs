//! One element as a cache record: the bytes a split's entry stores per element.
//!
//! Layout (little-endian): key (`u32` length + UTF-8), field count (`u16`), then per field its
//! name (`u16` length + UTF-8), a kind byte (0 bytes, 1 text, 2 tensor) and the value: bytes and
//! text as `u32` length + data; a tensor as dtype byte, rank byte, each extent as `u64`, then the
//! data (`u64` byte length + the elements). Decoding checks every length against what is left,
//! so a damaged record is an error, never a panic or a wrong element.

use crate::element::{Element, FieldName, Value};
use crate::tensor::{DType, Tensor};
use bytes::Bytes;

/// A record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("cache record: {0}")]
pub struct RecordError(String);

/// Appends `element` as a record to `out`.
pub fn encode(element: &Element, out: &mut Vec<u8>) {
    out.reserve(element.nbytes() + 64);
    put_str32(out, &element.key);
    out.extend_from_slice(&(element.fields.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for (name, value) in element.fields.iter().take(u16::MAX as usize) {
        let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        match value {
            Value::Bytes(b) => {
                out.push(0);
                put_bytes32(out, b);
            }
            Value::Text(s) => {
                out.push(1);
                put_bytes32(out, s.as_bytes());
            }
            Value::Tensor(t) => {
                out.push(2);
                out.push(dtype_code(t.dtype()));
                out.push(t.shape.len().min(u8::MAX as usize) as u8);
                for d in t.shape.iter().take(u8::MAX as usize) {
                    out.extend_from_slice(&(*d as u64).to_le_bytes());
                }
                let data = t.as_le_bytes();
                out.extend_from_slice(&(data.len() as u64).to_le_bytes());
                out.extend_from_slice(data);
            }
        }
    }
}

/// The record of `element` in a new buffer.
pub fn to_bytes(element: &Element) -> Vec<u8> {
    let mut out = Vec::new();
    encode(element, &mut out);
    out
}

/// Decodes a record; byte fields share `record`'s memory.
pub fn decode(record: &Bytes) -> Result<Element, RecordError> {
    let mut r = Reader { data: record, at: 0 };
    let key = r.str32("key")?;
    let count = r.u16("field count")? as usize;
    let mut fields = Vec::with_capacity(count);
    for _ in 0..count {
        let len = r.u16("field name length")? as usize;
        let name = std::str::from_utf8(r.take(len, "field name")?)
            .map_err(|_| RecordError("a field name is not UTF-8".into()))?;
        let name = FieldName::from(name);
        let value = match r.u8("field kind")? {
            0 => {
                let len = r.u32("bytes length")? as usize;
                let start = r.at;
                r.take(len, "bytes")?;
                Value::Bytes(record.slice(start..start + len))
            }
            1 => Value::Text(r.str32("text")?),
            2 => Value::Tensor(r.tensor()?),
            k => return Err(RecordError(format!("field `{name}` has unknown kind {k}"))),
        };
        fields.push((name, value));
    }
    if r.at != record.len() {
        return Err(RecordError(format!("{} bytes after the last field", record.len() - r.at)));
    }
    Ok(Element { key, fields })
}

fn put_str32(out: &mut Vec<u8>, s: &str) {
    put_bytes32(out, s.as_bytes());
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u32::MAX as usize)];
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn dtype_code(d: DType) -> u8 {
    match d {
        DType::Uint8 => 0,
        DType::Int32 => 1,
        DType::Int64 => 2,
        DType::Float32 => 3,
        DType::Float64 => 4,
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], RecordError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.data.len()).ok_or_else(|| {
            RecordError(format!("{what} runs past the end ({n} bytes at {} of {})", self.at, self.data.len()))
        })?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], RecordError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, RecordError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, RecordError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn str32(&mut self, what: &str) -> Result<String, RecordError> {
        let len = self.u32(what)? as usize;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RecordError(format!("{what} is not UTF-8")))
    }

    fn tensor(&mut self) -> Result<Tensor, RecordError> {
        let dtype = self.u8("dtype")?;
        let rank = self.u8("rank")? as usize;
        let mut shape = Vec::with_capacity(rank);
        for _ in 0..rank {
            let d = usize::try_from(self.u64("extent")?)
                .map_err(|_| RecordError("an extent does not fit in memory".into()))?;
            shape.push(d);
        }
        let len = usize::try_from(self.u64("tensor length")?)
            .map_err(|_| RecordError("a tensor does not fit in memory".into()))?;
        let raw = self.take(len, "tensor data")?;
        let dtype = match dtype {
            0 => DType::Uint8,
            1 => DType::Int32,
            2 => DType::Int64,
            3 => DType::Float32,
            4 => DType::Float64,
            d => return Err(RecordError(format!("unknown dtype code {d}"))),
        };
        // Extents whose product overflows are refused too.
        Tensor::from_le_bytes(dtype, shape, raw)
            .ok_or_else(|| RecordError("tensor data does not match its shape and type".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorData;
    use smallvec::smallvec;

    fn sample() -> Element {
        let mut e = Element::new("images/n01/0001.jpg");
        e.set("jpeg", Value::Bytes(Bytes::from_static(b"\xff\xd8\xff rest")));
        e.set("caption", Value::Text("a cat".into()));
        e.set("image", Value::Tensor(Tensor::new(vec![2, 2, 3], TensorData::U8((0..12).collect())).unwrap()));
        e.set("ids", Value::Tensor(Tensor::new(vec![3], TensorData::I64(smallvec![-1, 0, 7])).unwrap()));
        e.set("x", Value::Tensor(Tensor::new(vec![2], TensorData::F32(smallvec![0.5, -2.0])).unwrap()));
        e.set("label", Value::Tensor(Tensor::scalar_i64(3)));
        e
    }

    #[test]
    fn round_trips_every_kind_of_value() {
        let e = sample();
        let bytes = Bytes::from(to_bytes(&e));
        assert_eq!(decode(&bytes).unwrap(), e);
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        let good = to_bytes(&sample());
        for cut in 0..good.len() {
            assert!(decode(&Bytes::copy_from_slice(&good[..cut])).is_err(), "truncated at {cut}");
        }
        for i in 0..good.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = good.clone();
                bad[i] ^= bit;
                // A flip may still decode (e.g. inside pixel data); it must never panic.
                let _ = decode(&Bytes::from(bad));
            }
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&Bytes::from(long)).is_err());
    }
}
