//! The autocache's entries on an object store.
//!
//! An entry caches the output of a pipeline's deterministic stage prefix for one [`Fingerprint`]
//! (see [`EntryIdentity`]). Its objects, under the cache root:
//!
//! ```text
//! <fp>/entry.json                                        EntryInfo, created once by the first writer
//! <fp>/splits/<split:08>/manifest.json                   SplitManifest, written last
//! <fp>/splits/<split:08>/<writer>/chunk-<i:05>.grc       chunks (format: see MAGIC), visible only
//!                                                        through a published manifest
//! .probe/<random>                                        CacheStore::probe's scratch object
//! ```
//!
//! A [`SplitWriter`] puts chunk objects as its records fill them, then the split's manifest, only
//! if no other writer published the split first. A crashed or aborted writer therefore leaves
//! nothing a reader would use (its objects show as unpublished in [`CacheStore::inspect`]).
//!
//! Readers ([`CacheStore::open_split`], [`CacheStore::read_chunk`]) verify the manifest belongs
//! where it was found, and each chunk's size, header, crc32, decoded length and record count;
//! every mismatch is a [`CacheError::Corrupt`] (an absent object a [`CacheError::Missing`]), so
//! the caller can fall back to computing the split. Eviction is planned by the pure
//! [`plan_eviction`] over [`CacheStore::list_entries`] and carried out with [`CacheStore::remove`].

mod admin;
mod chunk;
mod error;
mod eviction;
mod fingerprint;
mod layout;
mod manifest;
mod probe;
mod reader;
mod throttle;
mod writer;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore, PutMode, PutOptions, PutPayload};

pub use admin::{EntryDetail, EntrySummary, SplitProblem};
pub use chunk::{CODEC_NONE, CODEC_ZSTD, HEADER_LEN, MAGIC};
pub use error::CacheError;
pub use eviction::{EvictionRules, plan_eviction};
pub use fingerprint::{EntryIdentity, FINGERPRINT_HEX_LEN, Fingerprint, ObjectIdentity};
pub use manifest::{ChunkMeta, EntryInfo, SplitManifest};
pub use probe::StoreRates;
pub use throttle::{THROTTLE_ENV, Throttle};
pub use writer::{CHUNK_MAX_RAW_BYTES, CHUNK_MAX_RECORDS, SplitWriter};

/// Version of the entry format; part of every fingerprint, manifest and entry info.
pub const FORMAT_VERSION: u32 = 1;

/// The parsers of what a cache store holds, for the fuzz targets (the `granary-fuzz` crate):
/// not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::{ChunkMeta, Fingerprint, SplitManifest, chunk};
    use bytes::Bytes;

    /// Parses and checks a split manifest read from `fp`'s split `split`, as a reader does.
    pub fn parse_split_manifest(bytes: &[u8], fp: &Fingerprint, split: u64) -> Result<SplitManifest, String> {
        SplitManifest::parse_checked(bytes, fp, split)
    }

    /// Decodes a chunk object against its manifest entry, as a reader does.
    pub fn decode_chunk(object: Bytes, meta: &ChunkMeta) -> Result<Vec<Bytes>, String> {
        chunk::decode(object, meta)
    }

    /// Encodes `records` as a chunk object, as a writer does: the object and its manifest
    /// entry (named `object`, starting at element 0).
    pub fn encode_chunk(records: &[&[u8]]) -> Result<(Bytes, ChunkMeta), String> {
        let mut buffer = chunk::ChunkBuffer::default();
        for record in records {
            buffer.push(record)?;
        }
        let encoded = buffer.take_encoded()?;
        let meta = ChunkMeta {
            object: "object".into(),
            first: 0,
            elements: u64::from(encoded.records),
            stored_bytes: encoded.bytes.len() as u64,
            raw_bytes: u64::from(encoded.raw_len),
            crc32: encoded.crc32,
        };
        Ok((Bytes::from(encoded.bytes), meta))
    }
}

/// Concurrent requests for operations over many objects (reading manifests, listing entries).
const CONCURRENCY: usize = 16;

/// A cache root on an object store.
#[derive(Clone, Debug)]
pub struct CacheStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
    throttle: Option<Throttle>,
}

/// Whether a put-if-absent created the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// This call created it.
    Created,
    /// It was there already; nothing was written.
    Exists,
}

impl CacheStore {
    /// Opens the cache rooted at `url` (`file://`, `s3://`, `gs://`, `az://`, `memory://`). When
    /// [`THROTTLE_ENV`] is set, the store is slowed down as it says (tests only).
    ///
    /// Requests to a cloud store are retried at most twice within 5 s: a cache that is slow to
    /// answer is worth less than computing, which every cache operation can fall back to.
    pub fn open(url: &str) -> Result<CacheStore, CacheError> {
        let retry = object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: std::time::Duration::from_millis(50),
                max_backoff: std::time::Duration::from_secs(1),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: std::time::Duration::from_secs(5),
        };
        let located = crate::url::open_with_retry(url, retry)?;
        let cache = CacheStore::new(located.store, located.path, url.to_string());
        Ok(match Throttle::from_env()? {
            Some(throttle) => cache.throttled(throttle),
            None => cache,
        })
    }

    /// The cache rooted at `root` in `store`; `url` is what [`url`](Self::url) reports.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path, url: String) -> CacheStore {
        CacheStore { store, root, url, throttle: None }
    }

    /// This cache, slowed down by `throttle` (tests only).
    pub fn throttled(self, throttle: Throttle) -> CacheStore {
        CacheStore { throttle: Some(throttle), ..self }
    }

    /// The URL the cache was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cache root inside the store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The underlying store (throttled, if it is).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The folder of entry `fp`.
    pub fn entry_location(&self, fp: &Fingerprint) -> Path {
        layout::entry_dir(&self.root, fp)
    }

    /// The folder of split `split` of entry `fp`.
    pub fn split_location(&self, fp: &Fingerprint, split: u64) -> Path {
        layout::split_dir(&self.root, fp, split)
    }

    /// The manifest object of split `split` of entry `fp`.
    pub fn manifest_location(&self, fp: &Fingerprint, split: u64) -> Path {
        layout::manifest(&self.root, fp, split)
    }

    /// The object of chunk `chunk` of split `split` of entry `fp`; a chunk name that is not one
    /// (a corrupt manifest) is [`CacheError::Corrupt`].
    pub fn chunk_location(
        &self,
        fp: &Fingerprint,
        split: u64,
        chunk: &ChunkMeta,
    ) -> Result<Path, CacheError> {
        let dir = self.split_location(fp, split);
        layout::chunk_path(&dir, &chunk.object).map_err(|reason| CacheError::corrupt(&dir, reason))
    }

    /// The root as a list prefix (`None` for the store's top level).
    fn root_prefix(&self) -> Option<&Path> {
        (!self.root.as_ref().is_empty()).then_some(&self.root)
    }

    /// Reads the whole object at `location`.
    pub(crate) async fn get_bytes(&self, location: &Path) -> Result<Bytes, CacheError> {
        let result = self
            .store
            .get_opts(location, GetOptions::default())
            .await
            .map_err(|e| CacheError::from_store("read", location, e))?;
        let bytes = result.bytes().await.map_err(|e| CacheError::from_store("read", location, e))?;
        self.get_throttle(bytes.len()).await;
        Ok(bytes)
    }

    /// Waits the throttle's per-byte delay for reading `bytes` bytes (tests only).
    pub(crate) async fn get_throttle(&self, bytes: usize) {
        if let Some(throttle) = &self.throttle {
            let delay = throttle.get_delay(bytes);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
    }

    /// Writes `bytes` at `location` with `mode`, after the throttle's per-byte delay.
    async fn put_raw(&self, location: &Path, bytes: Bytes, mode: PutMode) -> object_store::Result<()> {
        if let Some(throttle) = &self.throttle {
            let delay = throttle.put_delay(bytes.len());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        let options = PutOptions { mode, ..PutOptions::default() };
        self.store.put_opts(location, PutPayload::from(bytes), options).await.map(|_| ())
    }

    /// Writes `bytes` at `location`, replacing what is there.
    pub(crate) async fn put_overwrite(&self, location: &Path, bytes: Bytes) -> Result<(), CacheError> {
        self.put_raw(location, bytes, PutMode::Overwrite)
            .await
            .map_err(|e| CacheError::from_store("write", location, e))
    }

    /// Writes `bytes` at `location` unless an object is there: atomically with `PutMode::Create`
    /// where the store supports it, else by a check then a plain put.
    pub(crate) async fn put_if_absent(&self, location: &Path, bytes: Bytes) -> Result<Put, CacheError> {
        match self.put_raw(location, bytes.clone(), PutMode::Create).await {
            Ok(()) => Ok(Put::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::Exists),
            Err(object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. }) => {
                match self.store.get_opts(location, GetOptions::new().with_head(true)).await {
                    Ok(_) => return Ok(Put::Exists),
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(CacheError::from_store("check", location, e)),
                }
                self.put_overwrite(location, bytes).await.map(|()| Put::Created)
            }
            Err(e) => Err(CacheError::from_store("write", location, e)),
        }
    }

    /// Deletes `locations` (objects under `scope`), treating objects already gone as deleted.
    /// Returns how many were deleted; an error stops nothing, the first one is returned at the end.
    pub(crate) async fn delete_all(&self, scope: &Path, locations: Vec<Path>) -> Result<u64, CacheError> {
        let mut deleted = 0u64;
        let mut first_error = None;
        let stream = futures::stream::iter(locations.into_iter().map(Ok)).boxed();
        let mut results = self.store.delete_stream(stream);
        while let Some(result) = results.next().await {
            match result {
                Ok(_) => deleted += 1,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(CacheError::from_store("delete objects under", scope, e));
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }

    /// Every object under `prefix` (recursively).
    pub(crate) async fn list_all(&self, prefix: &Path) -> Result<Vec<ObjectMeta>, CacheError> {
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| CacheError::from_store("list", prefix, e))
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
