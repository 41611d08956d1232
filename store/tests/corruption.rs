//! Damaged cache objects are detected as `Corrupt` or `Missing`, never trusted and never a panic:
//! flipped bits and truncations at every position of a chunk, deleted chunks and manifests,
//! manifests copied from another split or another entry, chunks swapped between splits.

mod common;

use common::*;
use granary_store::cache::{CacheError, CacheStore, Fingerprint, SplitManifest};
use object_store::ObjectStoreExt;

/// Entry 1 with splits 0 and 1 of 12 records in chunks of 5.
async fn setup(cache: &CacheStore) -> (Fingerprint, SplitManifest, SplitManifest) {
    let fp = fingerprint(1);
    let m0 = write_split(cache, &fp, 0, &records(0, 12), "w", 5).await;
    let m1 = write_split(cache, &fp, 1, &records(1, 12), "w", 5).await;
    (fp, m0, m1)
}

fn assert_corrupt(result: Result<impl std::fmt::Debug, CacheError>, needle: &str) {
    match result {
        Err(e @ CacheError::Corrupt { .. }) => {
            assert!(e.is_corrupt());
            assert!(e.to_string().contains(needle), "`{e}` should mention `{needle}`");
        }
        other => panic!("expected Corrupt mentioning `{needle}`, got {other:?}"),
    }
}

#[tokio::test]
async fn every_bit_flip_and_truncation_of_a_chunk_is_detected() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, _) = setup(cache).await;
        let location = cache.chunk_location(&fp, 0, &m0.chunks[1]).unwrap();
        let good = get(cache, &location).await;
        for i in 0..good.len() {
            for bit in [0, 3, 7] {
                let mut bad = good.to_vec();
                bad[i] ^= 1 << bit;
                put(cache, &location, bad).await;
                let result = cache.read_chunk(&fp, &m0, 1).await;
                assert!(
                    matches!(result, Err(CacheError::Corrupt { .. })),
                    "bit {bit} of byte {i}: {result:?}"
                );
            }
        }
        for len in 0..good.len() {
            put(cache, &location, good.slice(..len)).await;
            assert_corrupt(cache.read_chunk(&fp, &m0, 1).await, "the manifest says");
        }
        let mut longer = good.to_vec();
        longer.push(0);
        put(cache, &location, longer).await;
        assert_corrupt(cache.read_chunk(&fp, &m0, 1).await, "the manifest says");
        put(cache, &location, good).await;
        assert_eq!(read_split(cache, &fp, 0).await.unwrap(), records(0, 12));
    }
}

#[tokio::test]
async fn a_flipped_payload_byte_fails_the_crc() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, _) = setup(cache).await;
        let location = cache.chunk_location(&fp, 0, &m0.chunks[0]).unwrap();
        let mut bad = get(cache, &location).await.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        put(cache, &location, bad).await;
        assert_corrupt(cache.read_chunk(&fp, &m0, 0).await, "crc32");
        // The other chunks still read.
        assert_eq!(cache.read_chunk(&fp, &m0, 1).await.unwrap().len(), 5);
    }
}

#[tokio::test]
async fn a_deleted_chunk_is_missing() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, _) = setup(cache).await;
        let location = cache.chunk_location(&fp, 0, &m0.chunks[2]).unwrap();
        cache.store().delete(&location).await.unwrap();
        let err = cache.read_chunk(&fp, &m0, 2).await.unwrap_err();
        assert!(matches!(err, CacheError::Missing { .. }) && err.is_corrupt(), "{err}");
        let detail = cache.inspect(&fp).await.unwrap();
        assert_eq!(detail.problems.len(), 1);
        assert!(detail.problems[0].reason.contains("missing"), "{:?}", detail.problems);
    }
}

#[tokio::test]
async fn a_deleted_manifest_unpublishes_the_split() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, _) = setup(cache).await;
        cache.store().delete(&cache.manifest_location(&fp, 0)).await.unwrap();
        let err = cache.open_split(&fp, 0).await.unwrap_err();
        assert!(matches!(err, CacheError::Missing { .. }) && err.is_corrupt(), "{err}");
        assert_eq!(cache.completed_splits(&fp).await.unwrap().keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(cache.inspect(&fp).await.unwrap().unpublished_objects, m0.chunks.len() as u64);
    }
}

#[tokio::test]
async fn a_manifest_copied_from_another_split_is_rejected() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, _, _) = setup(cache).await;
        let theirs = get(cache, &cache.manifest_location(&fp, 1)).await;
        put(cache, &cache.manifest_location(&fp, 0), theirs).await;
        assert_corrupt(cache.open_split(&fp, 0).await, "manifest of split 1 found in split 0");
        assert_eq!(cache.completed_splits(&fp).await.unwrap().keys().copied().collect::<Vec<_>>(), [1]);
        let detail = cache.inspect(&fp).await.unwrap();
        assert_eq!(detail.problems.iter().map(|p| p.split).collect::<Vec<_>>(), [0]);
    }
}

#[tokio::test]
async fn a_manifest_copied_from_another_entry_is_rejected() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, _, _) = setup(cache).await;
        let other = fingerprint(2);
        let foreign = get(cache, &cache.manifest_location(&fp, 0)).await;
        put(cache, &cache.manifest_location(&other, 0), foreign).await;
        assert_corrupt(
            cache.open_split(&other, 0).await,
            &format!("manifest of entry {fp} found in entry {other}"),
        );
        assert!(cache.completed_splits(&other).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn garbage_and_inconsistent_manifests_are_rejected() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, _) = setup(cache).await;
        let location = cache.manifest_location(&fp, 0);
        put(cache, &location, &b"\x00\xffnot json"[..]).await;
        assert_corrupt(cache.open_split(&fp, 0).await, "not a split manifest");
        let mut bad = m0.clone();
        bad.elements += 1;
        put(cache, &location, serde_json::to_vec(&bad).unwrap()).await;
        assert_corrupt(cache.open_split(&fp, 0).await, "elements");
        let mut bad = m0.clone();
        bad.chunks[0].object = "../../../escape/chunk-00000.grc".into();
        put(cache, &location, serde_json::to_vec(&bad).unwrap()).await;
        assert_corrupt(cache.open_split(&fp, 0).await, "not a chunk name");
        // A manifest that passes its own checks but lies about a chunk is caught on read.
        let mut bad = m0.clone();
        bad.chunks[0].crc32 ^= 1;
        put(cache, &location, serde_json::to_vec(&bad).unwrap()).await;
        let opened = cache.open_split(&fp, 0).await.unwrap();
        assert_corrupt(cache.read_chunk(&fp, &opened, 0).await, "crc32");
    }
}

#[tokio::test]
async fn a_chunk_swapped_in_from_another_split_is_rejected() {
    for t in caches() {
        let cache = &t.cache;
        let (fp, m0, m1) = setup(cache).await;
        let theirs = get(cache, &cache.chunk_location(&fp, 1, &m1.chunks[0]).unwrap()).await;
        put(cache, &cache.chunk_location(&fp, 0, &m0.chunks[0]).unwrap(), theirs).await;
        let err = cache.read_chunk(&fp, &m0, 0).await.unwrap_err();
        assert!(matches!(err, CacheError::Corrupt { .. }), "{err}");
    }
}
