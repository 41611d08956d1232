//! Entry-level operations: creating and touching an entry's info, listing, inspecting and
//! removing entries and splits.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;
use object_store::ObjectStore;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use super::layout::{self, EntryObject};
use super::{CONCURRENCY, CacheError, CacheStore, EntryInfo, Fingerprint, SplitManifest};

/// One entry as [`CacheStore::list_entries`] sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntrySummary {
    /// The entry's fingerprint (64 hex digits).
    pub fingerprint: String,
    /// Its `entry.json`, when present and readable.
    pub info: Option<EntryInfo>,
    /// Published split manifests (counted, not verified).
    pub splits: u64,
    /// Bytes of all its objects.
    pub bytes: u64,
    /// Number of its objects.
    pub objects: u64,
    /// Latest modification time of any of its objects (seconds since the Unix epoch).
    pub last_modified_unix_s: u64,
}

impl EntrySummary {
    /// When the entry was last used: its info's `last_used_unix_s`, else the newest object's time.
    pub fn last_used_unix_s(&self) -> u64 {
        self.info.as_ref().map_or(self.last_modified_unix_s, |i| i.last_used_unix_s)
    }
}

/// A split of an entry that a reader would reject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SplitProblem {
    /// The split.
    pub split: u64,
    /// What is wrong.
    pub reason: String,
}

/// One entry in detail, from [`CacheStore::inspect`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryDetail {
    /// The entry's fingerprint (64 hex digits).
    pub fingerprint: String,
    /// Its `entry.json`, when present and readable.
    pub info: Option<EntryInfo>,
    /// The manifests that parse and belong to their split, by split.
    pub manifests: Vec<SplitManifest>,
    /// Objects neither `entry.json`, nor a good manifest, nor a chunk one names: left-overs of
    /// aborted or crashed writers, writers that lost a race, corrupt manifests.
    pub unpublished_objects: u64,
    /// Bytes of all the entry's objects.
    pub bytes: u64,
    /// Number of the entry's objects.
    pub objects: u64,
    /// Splits a reader would reject: a corrupt manifest, or a manifest naming a chunk that is
    /// missing or of the wrong size (chunk contents are not read).
    pub problems: Vec<SplitProblem>,
}

impl CacheStore {
    /// Creates `<fp>/entry.json` from `info` unless it exists (then it is left as is).
    pub async fn put_entry_info(&self, info: &EntryInfo) -> Result<(), CacheError> {
        let fp = Fingerprint::parse(&info.fingerprint)?;
        let bytes = serde_json::to_vec_pretty(info)
            .map_err(|e| CacheError::Format(format!("cannot encode the entry info: {e}")))?;
        self.put_if_absent(&layout::entry_info(&self.root, &fp), Bytes::from(bytes)).await.map(|_| ())
    }

    /// Sets entry `fp`'s `last_used_unix_s` to `now_unix_s` (it never moves back). A missing
    /// `entry.json` is [`CacheError::Missing`], an unreadable one [`CacheError::Corrupt`].
    pub async fn touch(&self, fp: &Fingerprint, now_unix_s: u64) -> Result<(), CacheError> {
        let location = layout::entry_info(&self.root, fp);
        let mut info = read_info(&self.get_bytes(&location).await?, &location)?;
        if now_unix_s <= info.last_used_unix_s {
            return Ok(());
        }
        info.last_used_unix_s = now_unix_s;
        let bytes = serde_json::to_vec_pretty(&info)
            .map_err(|e| CacheError::Format(format!("cannot encode the entry info: {e}")))?;
        self.put_overwrite(&location, Bytes::from(bytes)).await
    }

    /// Every entry under the root (folders named by a fingerprint; `.probe` and anything else
    /// are skipped), by fingerprint.
    pub async fn list_entries(&self) -> Result<Vec<EntrySummary>, CacheError> {
        let top = self.store.list_with_delimiter(self.root_prefix()).await.map_err(|e| {
            CacheError::from_store(
                "list",
                if self.root.as_ref().is_empty() { "/" } else { self.root.as_ref() },
                e,
            )
        })?;
        let mut fps: Vec<Fingerprint> = top
            .common_prefixes
            .iter()
            .filter_map(|prefix| prefix.filename())
            .filter(|name| *name != layout::PROBE)
            .filter_map(|name| Fingerprint::parse(name).ok())
            .collect();
        fps.sort();
        fps.dedup();
        let summaries: Vec<Option<EntrySummary>> = futures::stream::iter(fps)
            .map(|fp| self.summarize(fp))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(summaries.into_iter().flatten().collect())
    }

    /// Entry `fp`'s summary, or `None` when it has no objects (left-over empty folders).
    async fn summarize(&self, fp: Fingerprint) -> Result<Option<EntrySummary>, CacheError> {
        let dir = self.entry_location(&fp);
        let objects = self.list_all(&dir).await?;
        if objects.is_empty() {
            return Ok(None);
        }
        let info = self.info_if_listed(&fp, &objects).await?;
        let splits = objects
            .iter()
            .filter(|o| matches!(layout::classify(&dir, &o.location), EntryObject::Manifest(_)))
            .count();
        Ok(Some(EntrySummary {
            fingerprint: fp.to_string(),
            info,
            splits: splits as u64,
            bytes: objects.iter().map(|o| o.size).sum(),
            objects: objects.len() as u64,
            last_modified_unix_s: objects
                .iter()
                .map(|o| o.last_modified.timestamp().max(0) as u64)
                .max()
                .unwrap_or(0),
        }))
    }

    /// The entry info, read when `objects` (the entry's listing) has one; `None` when it is absent
    /// or unreadable.
    async fn info_if_listed(
        &self,
        fp: &Fingerprint,
        objects: &[ObjectMeta],
    ) -> Result<Option<EntryInfo>, CacheError> {
        let location = layout::entry_info(&self.root, fp);
        if !objects.iter().any(|o| o.location == location) {
            return Ok(None);
        }
        match self.get_bytes(&location).await {
            Ok(bytes) => Ok(read_info(&bytes, &location).ok()),
            Err(CacheError::Missing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Entry `fp` in detail: its info, verified manifests, problems and left-over objects.
    /// [`CacheError::Missing`] when the entry has no objects.
    pub async fn inspect(&self, fp: &Fingerprint) -> Result<EntryDetail, CacheError> {
        let dir = self.entry_location(fp);
        let objects = self.list_all(&dir).await?;
        if objects.is_empty() {
            return Err(CacheError::Missing { location: dir.to_string() });
        }
        let info = self.info_if_listed(fp, &objects).await?;
        let mut in_splits: BTreeMap<(u64, String), u64> = BTreeMap::new();
        let mut manifest_splits = Vec::new();
        for object in &objects {
            match layout::classify(&dir, &object.location) {
                EntryObject::Manifest(split) => manifest_splits.push(split),
                EntryObject::InSplit { split, object: name } => {
                    in_splits.insert((split, name), object.size);
                }
                EntryObject::Info | EntryObject::Other => {}
            }
        }
        let opened: Vec<(u64, Result<SplitManifest, CacheError>)> = futures::stream::iter(manifest_splits)
            .map(|split| async move { (split, self.open_split(fp, split).await) })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        let mut manifests = Vec::new();
        let mut problems = Vec::new();
        for (split, result) in opened {
            match result {
                Ok(manifest) => manifests.push(manifest),
                Err(e) if e.is_corrupt() => problems.push(SplitProblem { split, reason: e.to_string() }),
                Err(e) => return Err(e),
            }
        }
        manifests.sort_by_key(|m| m.split);
        let mut referenced = BTreeSet::new();
        for manifest in &manifests {
            for chunk in &manifest.chunks {
                let key = (manifest.split, chunk.object.clone());
                match in_splits.get(&key) {
                    None => problems.push(SplitProblem {
                        split: manifest.split,
                        reason: format!("chunk `{}` is missing", chunk.object),
                    }),
                    Some(&size) if size != chunk.stored_bytes => problems.push(SplitProblem {
                        split: manifest.split,
                        reason: format!(
                            "chunk `{}` is {size} bytes, the manifest says {}",
                            chunk.object, chunk.stored_bytes
                        ),
                    }),
                    Some(_) => {}
                }
                referenced.insert(key);
            }
        }
        problems.sort_by_key(|p| p.split);
        let good_manifests = manifests.len() as u64;
        let info_location = layout::entry_info(&self.root, fp);
        let info_objects = u64::from(objects.iter().any(|o| o.location == info_location));
        let referenced_present = in_splits.keys().filter(|k| referenced.contains(*k)).count() as u64;
        let total = objects.len() as u64;
        Ok(EntryDetail {
            fingerprint: fp.to_string(),
            info,
            manifests,
            unpublished_objects: total - good_manifests - info_objects - referenced_present,
            bytes: objects.iter().map(|o| o.size).sum(),
            objects: total,
            problems,
        })
    }

    /// Deletes every object of entry `fp`: manifests first (so readers stop seeing splits), then
    /// chunks and the rest, `entry.json` last. Returns how many objects were deleted.
    pub async fn remove(&self, fp: &Fingerprint) -> Result<u64, CacheError> {
        let dir = self.entry_location(fp);
        let objects = self.list_all(&dir).await?;
        let (mut manifests, mut rest, mut info) = (Vec::new(), Vec::new(), Vec::new());
        for object in objects {
            match layout::classify(&dir, &object.location) {
                EntryObject::Manifest(_) => manifests.push(object.location),
                EntryObject::Info => info.push(object.location),
                EntryObject::InSplit { .. } | EntryObject::Other => rest.push(object.location),
            }
        }
        let mut deleted = 0;
        for batch in [manifests, rest, info] {
            deleted += self.delete_all(&dir, batch).await?;
        }
        Ok(deleted)
    }

    /// Deletes split `split` of entry `fp`: its manifest first, then its chunks and anything else
    /// in its folder. Returns how many objects were deleted.
    pub async fn remove_split(&self, fp: &Fingerprint, split: u64) -> Result<u64, CacheError> {
        let dir = self.split_location(fp, split);
        let manifest = self.manifest_location(fp, split);
        let mut deleted = self.delete_all(&dir, vec![manifest.clone()]).await?;
        let rest: Vec<Path> =
            self.list_all(&dir).await?.into_iter().map(|o| o.location).filter(|l| *l != manifest).collect();
        deleted += self.delete_all(&dir, rest).await?;
        Ok(deleted)
    }
}

/// Parses an `entry.json` read from `location`.
fn read_info(bytes: &[u8], location: &Path) -> Result<EntryInfo, CacheError> {
    serde_json::from_slice(bytes)
        .map_err(|e| CacheError::corrupt(location, format!("not an entry info: {e}")))
}
