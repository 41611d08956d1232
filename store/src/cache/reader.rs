//! Reading published splits: [`CacheStore::open_split`], [`CacheStore::read_chunk`],
//! [`CacheStore::completed_splits`].

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, ObjectStore};

use super::layout::{self, EntryObject};
use super::{CONCURRENCY, CacheError, CacheStore, Fingerprint, SplitManifest, chunk};

impl CacheStore {
    /// The published manifest of split `split` of entry `fp`: [`CacheError::Missing`] when there is
    /// none, [`CacheError::Corrupt`] when it does not parse, has another format version, belongs
    /// to another entry or split, or is inconsistent (chunk ranges, element count, chunk names).
    pub async fn open_split(&self, fp: &Fingerprint, split: u64) -> Result<SplitManifest, CacheError> {
        let location = self.manifest_location(fp, split);
        let bytes = self.get_bytes(&location).await?;
        SplitManifest::parse_checked(&bytes, fp, split)
            .map_err(|reason| CacheError::corrupt(&location, reason))
    }

    /// The records of chunk `index` of `manifest` (as returned by [`open_split`](Self::open_split)
    /// for entry `fp`), verified against the manifest: object size, header, crc32, decoded length,
    /// record count. A bad object is [`CacheError::Corrupt`], an absent one
    /// [`CacheError::Missing`]; an index out of range or a manifest of another entry is
    /// [`CacheError::Format`].
    pub async fn read_chunk(
        &self,
        fp: &Fingerprint,
        manifest: &SplitManifest,
        index: usize,
    ) -> Result<Vec<Bytes>, CacheError> {
        if manifest.fingerprint != fp.as_str() {
            return Err(CacheError::Format(format!(
                "read_chunk: the manifest is of entry {}, not {fp}",
                manifest.fingerprint
            )));
        }
        let Some(meta) = manifest.chunks.get(index) else {
            return Err(CacheError::Format(format!(
                "read_chunk: split {} has {} chunks, there is no chunk {index}",
                manifest.split,
                manifest.chunks.len()
            )));
        };
        let location = self.chunk_location(fp, manifest.split, meta)?;
        let result = self
            .store
            .get_opts(&location, GetOptions::default())
            .await
            .map_err(|e| CacheError::from_store("read", &location, e))?;
        // Refuse before downloading an object of the wrong size.
        if result.meta.size != meta.stored_bytes {
            return Err(CacheError::corrupt(
                &location,
                format!("object is {} bytes, the manifest says {}", result.meta.size, meta.stored_bytes),
            ));
        }
        let bytes = result.bytes().await.map_err(|e| CacheError::from_store("read", &location, e))?;
        self.get_throttle(bytes.len()).await;
        chunk::decode(bytes, meta).map_err(|reason| CacheError::corrupt(&location, reason))
    }

    /// The published splits of entry `fp` whose manifests parse and belong there, with their
    /// stored bytes. Manifests that are missing or corrupt are skipped; store errors are returned.
    pub async fn completed_splits(&self, fp: &Fingerprint) -> Result<BTreeMap<u64, u64>, CacheError> {
        let dir = self.entry_location(fp);
        let splits = layout::splits_dir(&self.root, fp);
        let found: Vec<u64> = self
            .store
            .list(Some(&splits))
            .map_err(|e| CacheError::from_store("list", &splits, e))
            .try_filter_map(|meta| {
                let split = match layout::classify(&dir, &meta.location) {
                    EntryObject::Manifest(split) => Some(split),
                    _ => None,
                };
                futures::future::ready(Ok(split))
            })
            .try_collect()
            .await?;
        let opened: Vec<(u64, Result<SplitManifest, CacheError>)> = futures::stream::iter(found)
            .map(|split| async move { (split, self.open_split(fp, split).await) })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut done = BTreeMap::new();
        for (split, manifest) in opened {
            match manifest {
                Ok(manifest) => {
                    done.insert(split, manifest.stored_bytes());
                }
                Err(e) if e.is_corrupt() => {
                    tracing::debug!(error = %e, "skipping an unreadable split manifest")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}
