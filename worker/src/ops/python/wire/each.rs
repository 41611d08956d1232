//! Calls of an element-wise stage on several elements in one frame (op 2): the runner calls the
//! function once per element, in order, each with its own seed, and answers with one reply per
//! element in the single-element form, stopping after the first that failed. One round trip then
//! carries a group instead of one element.
//!
//! Call body: op (2), stage (u16), whether the function takes `rng` (u8), an unused seed (u64),
//! the shared memory's size (u64), where outputs may start (u64), the count (u32); then per
//! element its seed (u64), its key (u32 length, bytes) and its field descriptors, whose data lie
//! one after another in the shared memory. Reply body: status 4, the shared memory's size (u64),
//! the count of replies (u32), then each as a u32 length and a single-element reply body.

use super::{ALIGN, Input, Reader, input_of, layout, put_data, put_fields};
use crate::element::Element;
use crate::ops::OpError;

/// The op code of a call on several elements.
const EACH: u8 = 2;
/// The status of its reply.
const REPLIES: u8 = 4;

/// Writes a call of stage `stage` on each of `elements`: their field data into `shm` (grown as
/// needed), the frame body into `frame`. `seeds` holds one seed per element when the function
/// takes `rng`.
pub fn encode_each(
    stage: u16,
    seeds: Option<&[u64]>,
    elements: &[Element],
    frame: &mut Vec<u8>,
    shm: &mut crate::ops::python::shm::Shared,
) -> Result<(), OpError> {
    if seeds.is_some_and(|s| s.len() != elements.len()) {
        return Err(OpError::new("a call on several elements needs one seed per element"));
    }
    let mut inputs: Vec<Vec<Input>> = Vec::with_capacity(elements.len());
    let mut offsets = Vec::with_capacity(elements.len());
    let mut end = 0usize;
    for element in elements {
        let fields: Vec<Input> = element.fields.iter().map(|(n, v)| input_of(n, v)).collect();
        let (at, next) = layout(&fields, end);
        end = next;
        inputs.push(fields);
        offsets.push(at);
    }
    // Room for the inputs and, in the common case, for outputs as large as them.
    shm.reserve(end * 2 + ALIGN).map_err(|e| OpError::new(format!("cannot grow the shared memory: {e}")))?;
    for (fields, at) in inputs.iter().zip(&offsets) {
        put_data(shm.bytes_mut(), fields, at);
    }
    frame.clear();
    frame.push(EACH);
    frame.extend_from_slice(&stage.to_le_bytes());
    frame.push(u8::from(seeds.is_some()));
    frame.extend_from_slice(&0u64.to_le_bytes());
    frame.extend_from_slice(&(shm.len() as u64).to_le_bytes());
    frame.extend_from_slice(&(end as u64).to_le_bytes());
    frame.extend_from_slice(&(elements.len() as u32).to_le_bytes());
    for (i, ((element, fields), at)) in elements.iter().zip(&inputs).zip(&offsets).enumerate() {
        let seed = seeds.and_then(|s| s.get(i)).copied().unwrap_or(0);
        frame.extend_from_slice(&seed.to_le_bytes());
        frame.extend_from_slice(&(element.key.len() as u32).to_le_bytes());
        frame.extend_from_slice(element.key.as_bytes());
        put_fields(frame, fields, at, false);
    }
    Ok(())
}

/// Splits the reply to a call on several elements: the shared memory's size, and each element's
/// reply body (in the single-element form), in order; fewer than the call's elements when one
/// failed (the last).
pub fn decode_each(body: &[u8]) -> Result<(usize, Vec<&[u8]>), OpError> {
    let mut r = Reader::new(body);
    let status = r.u8()?;
    if status != REPLIES {
        return Err(OpError::new(format!(
            "the Python runner answered a call on several elements with status {status}"
        )));
    }
    let shm_size = r.usize()?;
    let count = r.u32()? as usize;
    let mut parts = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = r.u32()? as usize;
        parts.push(r.take(len)?);
    }
    Ok((shm_size, parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::Value;
    use crate::ops::python::shm::Shared;
    use crate::tensor::{Tensor, TensorData};

    fn element(key: &str, pixels: Vec<u8>) -> Element {
        let mut e = Element::new(key);
        e.set("caption", Value::Text(format!("caption of {key}")));
        let n = pixels.len();
        e.set("image", Value::Tensor(Tensor::new(vec![n, 1, 1], TensorData::U8(pixels.into())).unwrap()));
        e
    }

    #[test]
    fn each_element_has_its_seed_key_and_own_place_in_shared_memory() {
        let mut shm = Shared::new().unwrap();
        let mut frame = Vec::new();
        let elements = [element("a", vec![1, 2, 3]), element("bb", vec![4, 5])];
        encode_each(3, Some(&[11, 22]), &elements, &mut frame, &mut shm).unwrap();
        let mut r = Reader::new(&frame);
        assert_eq!(r.u8().unwrap(), EACH);
        assert_eq!(r.u16().unwrap(), 3);
        assert_eq!(r.u8().unwrap(), 1, "takes an rng");
        r.u64().unwrap();
        assert_eq!(r.usize().unwrap(), shm.len());
        let out = r.usize().unwrap();
        assert_eq!(out, 4 * ALIGN, "two fields per element, each aligned");
        assert_eq!(r.u32().unwrap(), 2);
        let mut seen = Vec::new();
        for (seed, key) in [(11, "a"), (22, "bb")] {
            assert_eq!(r.u64().unwrap(), seed);
            let len = r.u32().unwrap() as usize;
            assert_eq!(r.take(len).unwrap(), key.as_bytes());
            assert_eq!(r.u16().unwrap(), 2);
            for _ in 0..2 {
                let len = r.u16().unwrap() as usize;
                let name = r.take(len).unwrap().to_vec();
                let (_kind, _dtype, ndim) = (r.u8().unwrap(), r.u8().unwrap(), r.u8().unwrap());
                for _ in 0..ndim {
                    r.u64().unwrap();
                }
                let (at, n) = (r.usize().unwrap(), r.usize().unwrap());
                seen.push((name, shm.bytes()[at..at + n].to_vec()));
            }
        }
        assert!(r.u8().is_err(), "nothing after the last element");
        let data: Vec<&[u8]> = seen.iter().map(|(_, d)| d.as_slice()).collect();
        assert_eq!(data, [&b"caption of a"[..], &[1, 2, 3], b"caption of bb", &[4, 5]]);
    }

    #[test]
    fn seeds_must_match_the_elements() {
        let mut shm = Shared::new().unwrap();
        let elements = [element("a", vec![1])];
        let error = encode_each(0, Some(&[1, 2]), &elements, &mut Vec::new(), &mut shm).err().unwrap();
        assert!(error.0.contains("one seed per element"), "{error}");
        encode_each(0, None, &elements, &mut Vec::new(), &mut shm).unwrap();
    }

    #[test]
    fn a_reply_splits_into_the_replies_of_each_element() {
        let mut body = vec![REPLIES];
        body.extend_from_slice(&(2u64 << 20).to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        for part in [&[3u8, 1, 0, 0, 0, 1][..], &[1, 2, 0, 0, 0, b'h', b'i']] {
            body.extend_from_slice(&(part.len() as u32).to_le_bytes());
            body.extend_from_slice(part);
        }
        let (size, parts) = decode_each(&body).unwrap();
        assert_eq!(size, 2 << 20);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], &[1, 2, 0, 0, 0, b'h', b'i']);
        assert!(decode_each(&body[..body.len() - 1]).is_err(), "a short reply is refused");
        assert!(decode_each(&[0, 0]).is_err(), "a single-element reply is refused");
    }
}
