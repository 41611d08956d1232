//! The `--digest` of `granary run`: one SHA-256 per epoch over the epoch's elements, the same
//! whatever order the batches arrive in and however the elements are batched.
//!
//! Batches are not the unit to hash: the in-process engine batches each split on its own and
//! merges split tails, while the service batches the epoch's stream of splits laid end to end
//! (and delivers batches in completion order), so the two cut the same elements into different
//! batches. The element is what both deliver alike. Each element is hashed on its own:
//!
//! ```text
//! element = SHA-256( str(key) · u64(tensors) · for each tensor, by name:
//!                    str(name) · str(dtype) · u64(rank) · u64(dim)… · u64(len) · row bytes )
//! epoch   = SHA-256( u64(elements) · the element digests, sorted )
//! ```
//!
//! where `u64` is 8 bytes little-endian, `str(s)` is `u64(len) · bytes`, `dtype` is the spec's
//! name (`uint8`, `float32`, …), the dimensions are those of one row (the batch axis left out)
//! and the row bytes are the tensor's little-endian values for that element. Sorting the element
//! digests makes the epoch digest independent of order, and a repeated element still counts
//! twice (no XOR that would cancel it). Printed as 64 lowercase hex digits.

use sha2::{Digest, Sha256};

/// One tensor of a batch, as the digest reads it.
#[derive(Clone, Copy, Debug)]
pub struct TensorRows<'a> {
    /// Field name.
    pub name: &'a str,
    /// Element type, as named in specs (`uint8`, `float32`, …).
    pub dtype: &'a str,
    /// Shape including the leading batch axis.
    pub shape: &'a [usize],
    /// Row-major little-endian values.
    pub data: &'a [u8],
}

/// The digests of one epoch's elements, so far.
#[derive(Clone, Debug, Default)]
pub struct EpochDigest {
    elements: Vec<[u8; 32]>,
}

impl EpochDigest {
    /// Adds the elements of a batch: row `i` of every tensor belongs to `keys[i]`.
    pub fn add(&mut self, keys: &[String], tensors: &[TensorRows<'_>]) -> anyhow::Result<()> {
        let rows = keys.len();
        let mut sorted: Vec<(TensorRows<'_>, usize)> = Vec::with_capacity(tensors.len());
        for t in tensors {
            anyhow::ensure!(
                t.shape.first() == Some(&rows) && (rows == 0 || t.data.len() % rows == 0),
                "cannot digest tensor `{}`: shape {:?} and {} bytes for {rows} keys",
                t.name,
                t.shape,
                t.data.len()
            );
            sorted.push((*t, t.data.len().checked_div(rows).unwrap_or(0)));
        }
        sorted.sort_by(|a, b| a.0.name.cmp(b.0.name));
        self.elements.reserve(rows);
        for (row, key) in keys.iter().enumerate() {
            let mut h = Sha256::new();
            put_str(&mut h, key);
            put_u64(&mut h, sorted.len());
            for (t, stride) in &sorted {
                put_str(&mut h, t.name);
                put_str(&mut h, t.dtype);
                let dims = t.shape.get(1..).unwrap_or_default();
                put_u64(&mut h, dims.len());
                for &d in dims {
                    put_u64(&mut h, d);
                }
                put_u64(&mut h, *stride);
                h.update(&t.data[row * stride..(row + 1) * stride]);
            }
            self.elements.push(h.finalize().into());
        }
        Ok(())
    }

    /// The epoch's digest, in hex.
    pub fn finish(mut self) -> String {
        self.elements.sort_unstable();
        let mut h = Sha256::new();
        put_u64(&mut h, self.elements.len());
        for e in &self.elements {
            h.update(e);
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn put_u64(h: &mut Sha256, n: usize) {
    h.update((n as u64).to_le_bytes());
}

fn put_str(h: &mut Sha256, s: &str) {
    put_u64(h, s.len());
    h.update(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    fn digest(batches: &[(&[&str], &[i64])]) -> String {
        let mut d = EpochDigest::default();
        for (k, values) in batches {
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let shape = [values.len()];
            let x = TensorRows { name: "x", dtype: "int64", shape: &shape, data: &data };
            d.add(&keys(k), &[x]).unwrap();
        }
        d.finish()
    }

    #[test]
    fn the_epoch_digest_ignores_order_and_batching() {
        let one = digest(&[(&["a", "b", "c"], &[1, 2, 3])]);
        let two = digest(&[(&["c"], &[3]), (&["b", "a"], &[2, 1])]);
        assert_eq!(one, two);
        assert_eq!(one.len(), 64);
        assert_ne!(one, digest(&[(&["a", "b", "c"], &[1, 2, 4])]), "values count");
        assert_ne!(one, digest(&[(&["a", "b", "d"], &[1, 2, 3])]), "keys count");
    }

    #[test]
    fn a_repeated_element_does_not_cancel_out() {
        let once = digest(&[(&["a"], &[1])]);
        let twice = digest(&[(&["a"], &[1]), (&["a"], &[1])]);
        let none = digest(&[]);
        assert_ne!(once, twice);
        assert_ne!(twice, none);
    }

    #[test]
    fn tensor_order_shape_and_dtype() {
        let d = |tensors: &[TensorRows<'_>]| {
            let mut d = EpochDigest::default();
            d.add(&keys(&["k"]), tensors).unwrap();
            d.finish()
        };
        let (a, b) = ([1u8, 2], [3u8]);
        let x = TensorRows { name: "x", dtype: "uint8", shape: &[1, 2], data: &a };
        let y = TensorRows { name: "y", dtype: "uint8", shape: &[1], data: &b };
        assert_eq!(d(&[x, y]), d(&[y, x]), "tensors are taken by name");
        assert_ne!(d(&[x, y]), d(&[TensorRows { shape: &[1, 2, 1], ..x }, y]), "shape counts");
        assert_ne!(d(&[x, y]), d(&[TensorRows { dtype: "int8", ..x }, y]), "dtype counts");
    }

    #[test]
    fn rows_must_match_the_keys() {
        let data = [0u8; 3];
        let t = TensorRows { name: "x", dtype: "uint8", shape: &[3], data: &data };
        let e = EpochDigest::default().add(&keys(&["a", "b"]), &[t]).unwrap_err();
        assert!(e.to_string().contains("`x`"), "{e}");
    }

    /// The definition is fixed: a change to it changes this value.
    #[test]
    fn the_definition_is_pinned() {
        assert_eq!(digest(&[(&["a", "b"], &[1, 2])]), PINNED);
    }

    const PINNED: &str = "dc4f019058898ed1ab23a30d2cf9e08f998ad2f825857a2dc3bd244c5b6073d4";
}
