//! Shared fixtures of the cache tests: caches on a `file://` tempdir and on `memory://`, entries,
//! deterministic records.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::TryStreamExt;
use granary_store::cache::{
    CacheError, CacheStore, EntryIdentity, EntryInfo, FORMAT_VERSION, Fingerprint, SplitManifest,
};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// A cache and the tempdir that holds it (for `file://`).
pub struct TestCache {
    /// The cache.
    pub cache: CacheStore,
    /// Kept alive as long as the cache.
    _dir: Option<tempfile::TempDir>,
}

/// A cache in a fresh tempdir, below a `cache/` folder.
pub fn file_cache() -> TestCache {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}/cache/", dir.path().display());
    TestCache { cache: CacheStore::open(&url).expect("open file cache"), _dir: Some(dir) }
}

/// A cache in a fresh `memory://` store, at its top level.
pub fn memory_cache() -> TestCache {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let url = format!("memory://cache-test-{}/", NEXT.fetch_add(1, Ordering::Relaxed));
    TestCache { cache: CacheStore::open(&url).expect("open memory cache"), _dir: None }
}

/// One cache of each kind.
pub fn caches() -> Vec<TestCache> {
    vec![file_cache(), memory_cache()]
}

/// The fingerprint of a small identity distinguished by `n`.
pub fn fingerprint(n: u32) -> Fingerprint {
    EntryIdentity {
        source_url: format!("file:///data/{n}/"),
        source_format: "files".into(),
        objects: Vec::new(),
        stages: vec![serde_json::json!({"op": "decode_image"})],
        extra: serde_json::Value::Null,
    }
    .fingerprint()
}

/// Entry info for `fp`.
pub fn info(fp: &Fingerprint, pipeline: &str, splits_total: u64, last_used: u64) -> EntryInfo {
    EntryInfo {
        format_version: FORMAT_VERSION,
        fingerprint: fp.to_string(),
        pipeline: pipeline.to_string(),
        source_url: "file:///data/".into(),
        boundary: 1,
        stage: "decode_image".into(),
        stages: vec!["decode_image".into()],
        splits_total,
        created_unix_s: last_used,
        last_used_unix_s: last_used,
    }
}

/// `n` records of split `split`, of varied lengths (some empty), partly compressible.
pub fn records(split: u64, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let len = (i * 37 + split as usize * 11) % 97;
            (0..len).map(|j| ((i * 31 + j * 7) as u8) ^ (split as u8)).collect()
        })
        .collect()
}

/// Writes `records` as split `split` with writer `writer`, chunks of at most `per_chunk`
/// records, and publishes it.
pub async fn write_split(
    cache: &CacheStore,
    fp: &Fingerprint,
    split: u64,
    records: &[Vec<u8>],
    writer: &str,
    per_chunk: u32,
) -> SplitManifest {
    let mut w = cache.split_writer(fp, split, writer).with_chunk_limits(usize::MAX, per_chunk);
    for r in records {
        w.push(r).await.expect("push");
    }
    w.finish().await.expect("finish")
}

/// Every record of split `split`, read chunk by chunk.
pub async fn read_split(cache: &CacheStore, fp: &Fingerprint, split: u64) -> Result<Vec<Bytes>, CacheError> {
    let manifest = cache.open_split(fp, split).await?;
    let mut out = Vec::new();
    for i in 0..manifest.chunks.len() {
        out.extend(cache.read_chunk(fp, &manifest, i).await?);
    }
    Ok(out)
}

/// Every object under `prefix`.
pub async fn objects_under(cache: &CacheStore, prefix: &Path) -> Vec<Path> {
    let mut found: Vec<Path> =
        cache.store().list(Some(prefix)).map_ok(|m| m.location).try_collect().await.expect("list");
    found.sort();
    found
}

/// The bytes of the object at `location`.
pub async fn get(cache: &CacheStore, location: &Path) -> Bytes {
    cache.store().get(location).await.expect("get").bytes().await.expect("bytes")
}

/// Replaces the object at `location`.
pub async fn put(cache: &CacheStore, location: &Path, bytes: impl Into<Bytes>) {
    cache.store().put(location, PutPayload::from(bytes.into())).await.expect("put");
}
