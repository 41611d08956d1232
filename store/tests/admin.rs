//! Entry administration on `file://` and `memory://` caches: entry info, listing, inspecting,
//! removing entries and splits, probing and throttling the store.

mod common;

use std::time::Instant;

use common::*;
use granary_store::cache::{CacheError, CacheStore, Throttle};
use object_store::path::Path;

#[tokio::test]
async fn entry_info_is_created_once_and_touched_forward() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        assert!(matches!(cache.touch(&fp, 10).await, Err(CacheError::Missing { .. })));
        cache.put_entry_info(&info(&fp, "train", 4, 100)).await.unwrap();
        cache.put_entry_info(&info(&fp, "other", 9, 200)).await.unwrap();
        let listed = cache.list_entries().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].info, Some(info(&fp, "train", 4, 100)), "the first info stays");
        cache.touch(&fp, 500).await.unwrap();
        cache.touch(&fp, 300).await.unwrap();
        let touched = cache.list_entries().await.unwrap().remove(0).info.unwrap();
        assert_eq!(touched.last_used_unix_s, 500);
        assert_eq!(touched.created_unix_s, 100);
        let mut bad = info(&fp, "train", 4, 1);
        bad.fingerprint = "xyz".into();
        assert!(matches!(cache.put_entry_info(&bad).await, Err(CacheError::Format(_))));
    }
}

#[tokio::test]
async fn lists_inspects_and_removes_entries() {
    for t in caches() {
        let cache = &t.cache;
        let (a, b) = (fingerprint(1), fingerprint(2));
        cache.put_entry_info(&info(&a, "train", 3, 100)).await.unwrap();
        let a0 = write_split(cache, &a, 0, &records(0, 10), "w", 4).await;
        let a2 = write_split(cache, &a, 2, &records(2, 3), "w", 4).await;
        // An interrupted writer of split 1 (neither finished nor aborted).
        let mut left = cache.split_writer(&a, 1, "crashed").with_chunk_limits(usize::MAX, 2);
        for r in records(1, 5) {
            left.push(&r).await.unwrap();
        }
        drop(left);
        // Entry b has a split but no info.
        write_split(cache, &b, 0, &records(0, 2), "w", 4).await;
        // Neither a probe object nor a foreign folder is an entry.
        cache.probe(64).await.unwrap();
        put(cache, &cache.root().clone().join("not-an-entry").join("x"), &b"x"[..]).await;
        put(cache, &cache.root().clone().join(".probe").join("stale"), &b"x"[..]).await;

        let entries = cache.list_entries().await.unwrap();
        let mut expected = vec![a.to_string(), b.to_string()];
        expected.sort();
        assert_eq!(entries.iter().map(|e| e.fingerprint.clone()).collect::<Vec<_>>(), expected);
        let ea = entries.iter().find(|e| e.fingerprint == a.as_str()).unwrap();
        assert_eq!(ea.splits, 2);
        assert_eq!(ea.objects, 1 + 2 + a0.chunks.len() as u64 + a2.chunks.len() as u64 + 2);
        assert!(ea.bytes > a0.stored_bytes() + a2.stored_bytes());
        assert!(ea.last_modified_unix_s > 1_600_000_000);
        assert_eq!(ea.info.as_ref().map(|i| i.pipeline.as_str()), Some("train"));
        assert_eq!(ea.last_used_unix_s(), 100);
        let eb = entries.iter().find(|e| e.fingerprint == b.as_str()).unwrap();
        assert!(eb.info.is_none());
        assert_eq!(eb.last_used_unix_s(), eb.last_modified_unix_s);

        let detail = cache.inspect(&a).await.unwrap();
        assert_eq!(detail.fingerprint, a.as_str());
        assert_eq!(detail.manifests, vec![a0.clone(), a2.clone()]);
        assert_eq!(detail.unpublished_objects, 2, "the interrupted writer's two chunks");
        assert_eq!(detail.objects, ea.objects);
        assert_eq!(detail.bytes, ea.bytes);
        assert!(detail.problems.is_empty());
        assert!(matches!(cache.inspect(&fingerprint(3)).await, Err(CacheError::Missing { .. })));

        assert_eq!(cache.remove_split(&a, 0).await.unwrap(), 1 + a0.chunks.len() as u64);
        assert_eq!(cache.completed_splits(&a).await.unwrap().keys().copied().collect::<Vec<_>>(), [2]);
        assert!(matches!(cache.open_split(&a, 0).await, Err(CacheError::Missing { .. })));

        let removed = cache.remove(&a).await.unwrap();
        assert_eq!(removed, ea.objects - 1 - a0.chunks.len() as u64);
        assert!(objects_under(cache, &cache.entry_location(&a)).await.is_empty());
        assert_eq!(cache.remove(&a).await.unwrap(), 0);
        let left: Vec<String> =
            cache.list_entries().await.unwrap().into_iter().map(|e| e.fingerprint).collect();
        assert_eq!(left, [b.to_string()]);
    }
}

#[tokio::test]
async fn a_cache_at_the_store_top_level_lists_its_entries() {
    let t = memory_cache();
    assert_eq!(t.cache.root(), &Path::default());
    let fp = fingerprint(7);
    write_split(&t.cache, &fp, 0, &records(0, 1), "w", 1).await;
    assert_eq!(t.cache.list_entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn probe_measures_positive_rates_and_cleans_up() {
    for t in caches() {
        let cache = &t.cache;
        let rates = cache.probe(1 << 20).await.unwrap();
        assert!(rates.read_bytes_per_s > 0.0 && rates.read_bytes_per_s.is_finite(), "{rates:?}");
        assert!(rates.write_bytes_per_s > 0.0 && rates.write_bytes_per_s.is_finite(), "{rates:?}");
        assert!(objects_under(cache, &cache.root().clone().join(".probe")).await.is_empty());
        assert!(matches!(cache.probe(0).await, Err(CacheError::Format(_))));
    }
}

#[tokio::test]
async fn a_throttled_store_is_slower() {
    let t = memory_cache();
    let slow = t.cache.clone().throttled(Throttle {
        get_per_byte_ns: 10_000,
        put_per_byte_ns: 20_000,
        per_call_ms: 5,
    });
    let started = Instant::now();
    let rates = slow.probe(2000).await.unwrap();
    // put: 5 ms + 2000 × 20 µs = 45 ms; get: 5 ms + 2000 × 10 µs = 25 ms.
    assert!(started.elapsed().as_millis() >= 70, "{:?}", started.elapsed());
    assert!(rates.write_bytes_per_s <= 2000.0 / 0.045, "{rates:?}");
    assert!(rates.read_bytes_per_s <= 2000.0 / 0.025, "{rates:?}");
    // The throttled and the plain cache share the objects.
    let fp = fingerprint(1);
    write_split(&slow, &fp, 0, &records(0, 3), "w", 2).await;
    assert_eq!(read_split(&t.cache, &fp, 0).await.unwrap(), records(0, 3));
}

#[test]
fn bad_urls_are_url_errors() {
    assert!(matches!(CacheStore::open("not a url"), Err(CacheError::Url(_))));
    let err = CacheStore::open("nope://bucket/").unwrap_err();
    assert!(matches!(err, CacheError::Url(_)), "{err}");
}
