//! Measuring the cache store's throughput: [`CacheStore::probe`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{CacheError, CacheStore, layout};

/// Throughput of a store, as measured by [`CacheStore::probe`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreRates {
    /// Bytes per second reading one object.
    pub read_bytes_per_s: f64,
    /// Bytes per second writing one object.
    pub write_bytes_per_s: f64,
}

/// Shortest duration a rate is computed over, so that a clock too coarse to see the transfer
/// still gives a finite rate.
const MIN_ELAPSED_S: f64 = 1e-6;

impl CacheStore {
    /// Writes one object of `bytes` pseudo-random (incompressible) bytes under `<root>/.probe/`,
    /// reads it back, deletes it, and reports the rates. `bytes` must be positive; a read that
    /// returns other bytes is [`CacheError::Corrupt`].
    pub async fn probe(&self, bytes: usize) -> Result<StoreRates, CacheError> {
        if bytes == 0 {
            return Err(CacheError::Format("probe: the object size must be positive".into()));
        }
        let data = Bytes::from(noise(bytes, unique_seed()));
        let location = self.root.clone().join(layout::PROBE).join(format!("probe-{:016x}", unique_seed()));
        let started = Instant::now();
        self.put_overwrite(&location, data.clone()).await?;
        let write_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let read = self.get_bytes(&location).await;
        let read_s = started.elapsed().as_secs_f64();
        if let Err(e) = self.delete_all(&location, vec![location.clone()]).await {
            tracing::debug!(error = %e, "cannot delete the probe object");
        }
        if read? != data {
            return Err(CacheError::corrupt(
                &location,
                "the probe object read back differs from what was written",
            ));
        }
        let rate = |seconds: f64| bytes as f64 / seconds.max(MIN_ELAPSED_S);
        Ok(StoreRates { read_bytes_per_s: rate(read_s), write_bytes_per_s: rate(write_s) })
    }
}

/// A seed that differs between calls and processes.
fn unique_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    splitmix(nanos ^ u64::from(std::process::id()).rotate_left(32) ^ splitmix(count))
}

/// One step of splitmix64.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` pseudo-random bytes from `seed` (xorshift64*; not for cryptography).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_incompressible_and_seeded() {
        let a = noise(1 << 16, 7);
        assert_eq!(a.len(), 1 << 16);
        assert_eq!(a, noise(1 << 16, 7));
        assert_ne!(a, noise(1 << 16, 8));
        let compressed = zstd::bulk::compress(&a, 1).unwrap();
        assert!(compressed.len() > a.len() * 99 / 100);
        assert_ne!(unique_seed(), unique_seed());
    }
}
