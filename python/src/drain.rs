//! Consuming batches in Rust without handing them to Python: the Rust client's own rate, to
//! compare the Python path against in the same run, and per-element digests to compare values.

use std::collections::HashMap;

use granary_client::Batch;
use pyo3::prelude::*;
use sha2::{Digest, Sha256};

/// What [`Drainer`] counted.
#[pyclass(module = "granary._native", frozen, get_all)]
pub struct DrainReport {
    /// Batches received.
    pub batches: u64,
    /// Rows (elements) received.
    pub rows: u64,
    /// Tensor bytes received.
    pub bytes: u64,
    /// Tensor bytes that crossed the wire.
    pub wire_bytes: u64,
    /// With `digests`: the SHA-256 (hex) of each element's tensor rows, by `(epoch, element
    /// key)`, as `granary.testing.element_digests` computes it from NumPy batches.
    pub digests: Option<HashMap<(u32, String), String>>,
}

/// Counts batches and, optionally, digests their elements.
pub struct Drainer {
    report: DrainReport,
}

impl Drainer {
    /// Nothing counted yet.
    pub fn new(digests: bool) -> Drainer {
        Drainer {
            report: DrainReport {
                batches: 0,
                rows: 0,
                bytes: 0,
                wire_bytes: 0,
                digests: digests.then(HashMap::new),
            },
        }
    }

    /// Batches counted so far.
    pub fn batches(&self) -> u64 {
        self.report.batches
    }

    /// Counts `batch`.
    pub fn add(&mut self, batch: &Batch) {
        self.report.batches += 1;
        self.report.rows += batch.len() as u64;
        self.report.bytes += batch.tensors.iter().map(|tensor| tensor.data.len() as u64).sum::<u64>();
        self.report.wire_bytes += batch.wire_bytes;
        if let Some(digests) = self.report.digests.as_mut() {
            for (row, key) in batch.keys.iter().enumerate() {
                digests.insert((batch.epoch, key.clone()), element_digest(batch, row));
            }
        }
    }

    /// The report.
    pub fn finish(self) -> DrainReport {
        self.report
    }
}

/// SHA-256 over each tensor's name and the bytes of its row `row`, in tensor order.
fn element_digest(batch: &Batch, row: usize) -> String {
    let rows = batch.len().max(1);
    let mut hasher = Sha256::new();
    for tensor in &batch.tensors {
        let stride = tensor.data.len() / rows;
        hasher.update(tensor.name.as_bytes());
        hasher.update(tensor.data.get(row * stride..(row + 1) * stride).unwrap_or_default());
    }
    hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use granary_client::Tensor;

    #[test]
    fn digests_each_row_of_every_tensor() {
        let batch = Batch {
            epoch: 0,
            slot: 3,
            keys: vec!["a".into(), "b".into()],
            tensors: vec![
                Tensor {
                    name: "x".into(),
                    dtype: "uint8".into(),
                    shape: vec![2, 2],
                    data: Bytes::from_static(&[1, 2, 3, 4]),
                },
                Tensor {
                    name: "y".into(),
                    dtype: "uint8".into(),
                    shape: vec![2],
                    data: Bytes::from_static(&[5, 6]),
                },
            ],
            wire_bytes: 6,
        };
        let mut drainer = Drainer::new(true);
        drainer.add(&batch);
        let report = drainer.finish();
        assert_eq!((report.batches, report.rows, report.bytes, report.wire_bytes), (1, 2, 6, 6));
        let digests = report.digests.unwrap();
        let expected = |bytes: &[u8]| -> String {
            Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
        };
        assert_eq!(digests[&(0, "a".to_string())], expected(b"x\x01\x02y\x05"));
        assert_eq!(digests[&(0, "b".to_string())], expected(b"x\x03\x04y\x06"));
    }
}
