//! Finishing tensors the worker sent in a smaller form. A final `float32` `image.normalize` is
//! left to the client by default: the wire carries the `uint8` pixels (a quarter of the bytes)
//! and the client maps them through the same tables as the worker (`granary_kernels`), so the
//! values are bit-identical to a worker-side normalization.

use crate::tensor::{Tensor, dimensions};
use bytes::Bytes;
use granary_kernels::normalize::{Layout, Lut, lut, normalize_batch_into};
use granary_proto::v1::Normalize;
use std::sync::{Mutex, PoisonError};

/// Normalizes the pieces of one image tensor (each `uint8` `[rows, h, w, 3]`, the same
/// `normalize` on all) into one `float32` tensor of `rows` rows in the requested layout.
pub(crate) fn normalize(pieces: &[granary_proto::v1::Tensor], rows: u64) -> Result<Tensor, String> {
    let Some(head) = pieces.first() else {
        return Err("a tensor with no parts".to_string());
    };
    let name = &head.name;
    let (table, layout) = match &head.normalize {
        Some(n) => parameters(n).map_err(|why| format!("tensor `{name}`: {why}"))?,
        None => return Err(format!("tensor `{name}` has no normalization")),
    };
    let [_, h, w, 3] = head.shape[..] else {
        return Err(format!(
            "tensor `{name}` is sent for normalizing but has shape {:?}, not [rows, height, width, 3]",
            head.shape
        ));
    };
    if head.dtype != "uint8" {
        return Err(format!("tensor `{name}` is sent for normalizing as {}, not uint8", head.dtype));
    }
    let [rows_usize, h, w] = [rows, h, w].map(|d| usize::try_from(d).unwrap_or(usize::MAX));
    let image = h.checked_mul(w).and_then(|p| p.checked_mul(3)).ok_or("image too large")?;
    let total = image.checked_mul(rows_usize).ok_or_else(|| format!("tensor `{name}` is too large"))?;
    let mut out = recycled(total).map_err(|e| format!("tensor `{name}`: {e}"))?;
    for piece in pieces {
        // `check_part` made sure each payload holds exactly its rows.
        normalize_batch_into(&piece.data, h, w, &table, layout, &mut out);
    }
    let shape = match layout {
        Layout::Hwc => vec![rows, h as u64, w as u64, 3],
        Layout::Chw => vec![rows, 3, h as u64, w as u64],
    };
    Ok(Tensor {
        name: name.clone(),
        dtype: "float32".to_string(),
        shape: dimensions(&shape)?,
        data: into_bytes(out),
    })
}

/// The tables and layout of `n`, checked.
fn parameters(n: &Normalize) -> Result<(Box<Lut>, Layout), String> {
    let three = |values: &[f32], what: &str| -> Result<[f32; 3], String> {
        <[f32; 3]>::try_from(values)
            .map_err(|_| format!("normalize.{what} has {} values, not 3", values.len()))
    };
    let mean = three(&n.mean, "mean")?;
    let std = three(&n.std, "std")?;
    if std.iter().any(|s| *s == 0.0 || !s.is_finite()) || mean.iter().any(|m| !m.is_finite()) {
        return Err(format!("normalize has mean {mean:?} and std {std:?}: std must be finite and not 0"));
    }
    let layout = match n.layout.as_str() {
        "HWC" => Layout::Hwc,
        "CHW" => Layout::Chw,
        other => return Err(format!("normalize.layout is `{other}`, not HWC or CHW")),
    };
    Ok((Box::new(lut(mean, std)), layout))
}

/// Output buffers of dropped batches, kept for the next ones: a float32 ImageNet batch is
/// 77 MB, and a fresh allocation of that size faults in every page again.
static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());
/// Buffers and bytes the pool keeps at most.
const POOL_BUFFERS: usize = 4;
const POOL_BYTES: usize = 512 << 20;

/// An empty buffer for `len` values: a pooled one that fits (not more than twice as large), or a
/// new one.
fn recycled(len: usize) -> Result<Vec<f32>, std::collections::TryReserveError> {
    {
        let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = pool.iter().position(|b| b.capacity() >= len && b.capacity() / 2 <= len) {
            let mut buffer = pool.swap_remove(i);
            buffer.clear();
            return Ok(buffer);
        }
    }
    let mut buffer = Vec::new();
    buffer.try_reserve_exact(len)?;
    Ok(buffer)
}

/// Gives a buffer back to the pool, unless the pool is full.
fn recycle(buffer: Vec<f32>) {
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let held: usize = pool.iter().map(|b| b.capacity() * 4).sum();
    if pool.len() < POOL_BUFFERS && held + buffer.capacity() * 4 <= POOL_BYTES {
        pool.push(buffer);
    }
}

/// A batch's float buffer, as bytes; back to the pool when the last view of it is dropped.
struct Floats(Vec<f32>);

impl AsRef<[u8]> for Floats {
    fn as_ref(&self) -> &[u8] {
        #[cfg(target_endian = "little")]
        {
            bytemuck::cast_slice(&self.0)
        }
        #[cfg(not(target_endian = "little"))]
        {
            unreachable!("big-endian hosts convert to bytes without Floats")
        }
    }
}

impl Drop for Floats {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.0));
    }
}

/// The little-endian bytes of `values`, without copying them on little-endian hosts.
fn into_bytes(values: Vec<f32>) -> Bytes {
    #[cfg(target_endian = "little")]
    {
        Bytes::from_owner(Floats(values))
    }
    #[cfg(not(target_endian = "little"))]
    {
        Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_kernels::normalize::normalize_into;

    const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    const STD: [f32; 3] = [0.229, 0.224, 0.225];

    fn piece(rows: u64, h: u64, w: u64, seed: u8, layout: &str) -> granary_proto::v1::Tensor {
        let n = (rows * h * w * 3) as usize;
        granary_proto::v1::Tensor {
            name: "image".into(),
            dtype: "uint8".into(),
            shape: vec![rows, h, w, 3],
            data: Bytes::from(
                (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>(),
            ),
            normalize: Some(Normalize { mean: MEAN.to_vec(), std: STD.to_vec(), layout: layout.into() }),
            padding: None,
            images: None,
        }
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    #[test]
    fn pieces_normalize_into_one_tensor_like_the_worker_would() {
        let table = lut(MEAN, STD);
        for (name, layout) in [("CHW", Layout::Chw), ("HWC", Layout::Hwc)] {
            let pieces = [piece(2, 3, 4, 1, name), piece(1, 3, 4, 9, name)];
            let t = normalize(&pieces, 3).unwrap();
            assert_eq!(t.dtype, "float32");
            let expected_shape = if layout == Layout::Chw { vec![3, 3, 3, 4] } else { vec![3, 3, 4, 3] };
            assert_eq!(t.shape, expected_shape);
            let mut expected = Vec::new();
            for p in &pieces {
                for image in p.data.chunks_exact(36) {
                    normalize_into(image, 4, &table, layout, false, &mut expected);
                }
            }
            let got = floats(&t);
            assert_eq!(got.len(), 3 * 36);
            assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn bad_parameters_and_shapes_are_named() {
        let mut p = piece(1, 2, 2, 0, "NCHW");
        assert!(normalize(std::slice::from_ref(&p), 1).unwrap_err().contains("normalize.layout"));
        p = piece(1, 2, 2, 0, "CHW");
        p.normalize = Some(Normalize { mean: vec![0.5], std: STD.to_vec(), layout: "CHW".into() });
        assert!(normalize(std::slice::from_ref(&p), 1).unwrap_err().contains("normalize.mean"));
        p.normalize = Some(Normalize { mean: MEAN.to_vec(), std: vec![1.0, 0.0, 1.0], layout: "CHW".into() });
        assert!(normalize(std::slice::from_ref(&p), 1).unwrap_err().contains("std"));
        p = piece(1, 2, 2, 0, "CHW");
        p.shape = vec![1, 12];
        assert!(normalize(std::slice::from_ref(&p), 1).unwrap_err().contains("[rows, height, width, 3]"));
        p = piece(1, 2, 2, 0, "CHW");
        p.dtype = "float32".into();
        assert!(normalize(std::slice::from_ref(&p), 1).unwrap_err().contains("not uint8"));
    }
}
