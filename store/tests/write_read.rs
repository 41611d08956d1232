//! Writing and reading splits on `file://` and `memory://` caches: roundtrips over several
//! multi-chunk splits, publication only at `finish`, `abort`, and two writers racing for a split.

mod common;

use common::*;
use granary_store::cache::{CHUNK_MAX_RECORDS, CacheError, FORMAT_VERSION};

#[tokio::test]
async fn roundtrips_several_multi_chunk_splits() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        // Split 0: default limits, split by record count into three chunks.
        let many = records(0, 2 * CHUNK_MAX_RECORDS as usize + 5);
        let mut w = cache.split_writer(&fp, 0, "worker-0");
        for r in &many {
            w.push(r).await.unwrap();
        }
        assert!(w.stored_bytes() > 0, "full chunks are stored while pushing");
        assert_eq!(w.elements(), many.len() as u64);
        let m0 = w.finish().await.unwrap();
        assert_eq!(m0.chunks.len(), 3);
        assert_eq!((m0.format_version, m0.split, m0.elements), (FORMAT_VERSION, 0, many.len() as u64));
        assert_eq!(m0.writer, "worker-0");
        // Split 1: by size, two records of 3 MiB per chunk.
        let big: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 3 << 20]).collect();
        let mut w = cache.split_writer(&fp, 1, "worker-1");
        for r in &big {
            w.push(r).await.unwrap();
        }
        let m1 = w.finish().await.unwrap();
        assert_eq!(m1.chunks.iter().map(|c| c.elements).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(m1.stored_bytes() < m1.raw_bytes() / 10, "repetitive records compress");
        // Split 2: small chunks; split 3: empty.
        let small = records(2, 50);
        let m2 = write_split(cache, &fp, 2, &small, "w", 7).await;
        assert_eq!(m2.chunks.len(), 8);
        let m3 = write_split(cache, &fp, 3, &[], "w", 7).await;
        assert!(m3.chunks.is_empty());

        assert_eq!(read_split(cache, &fp, 0).await.unwrap(), many);
        assert_eq!(read_split(cache, &fp, 1).await.unwrap(), big);
        assert_eq!(read_split(cache, &fp, 2).await.unwrap(), small);
        assert!(read_split(cache, &fp, 3).await.unwrap().is_empty());
        assert_eq!(cache.open_split(&fp, 2).await.unwrap(), m2);

        let done = cache.completed_splits(&fp).await.unwrap();
        let expected: Vec<(u64, u64)> =
            [&m0, &m1, &m2, &m3].iter().map(|m| (m.split, m.stored_bytes())).collect();
        assert_eq!(done.into_iter().collect::<Vec<_>>(), expected);
        assert!(cache.completed_splits(&fingerprint(2)).await.unwrap().is_empty());

        let err = cache.read_chunk(&fp, &m2, 8).await.unwrap_err();
        assert!(matches!(err, CacheError::Format(_)) && err.to_string().contains("no chunk 8"), "{err}");
        let err = cache.read_chunk(&fingerprint(2), &m2, 0).await.unwrap_err();
        assert!(matches!(err, CacheError::Format(_)), "{err}");
    }
}

#[tokio::test]
async fn a_split_is_invisible_until_finish() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        let mut w = cache.split_writer(&fp, 4, "w").with_chunk_limits(usize::MAX, 3);
        for r in records(4, 10) {
            w.push(&r).await.unwrap();
        }
        assert_eq!(objects_under(cache, &cache.split_location(&fp, 4)).await.len(), 3, "three chunks stored");
        assert!(matches!(cache.open_split(&fp, 4).await, Err(CacheError::Missing { .. })));
        assert!(cache.completed_splits(&fp).await.unwrap().is_empty());
        let detail = cache.inspect(&fp).await.unwrap();
        assert!(detail.manifests.is_empty());
        assert_eq!(detail.unpublished_objects, 3);
        w.finish().await.unwrap();
        assert_eq!(read_split(cache, &fp, 4).await.unwrap(), records(4, 10));
        assert_eq!(cache.inspect(&fp).await.unwrap().unpublished_objects, 0);
    }
}

#[tokio::test]
async fn abort_leaves_nothing() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        let mut w = cache.split_writer(&fp, 0, "w").with_chunk_limits(64, 1000);
        for r in records(0, 40) {
            w.push(&r).await.unwrap();
        }
        assert!(w.stored_bytes() > 0);
        w.abort().await;
        assert!(objects_under(cache, &cache.entry_location(&fp)).await.is_empty());
        assert!(cache.list_entries().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_second_writer_of_a_split_loses_cleanly() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        let data = records(5, 20);
        let first = write_split(cache, &fp, 5, &data, "first", 6).await;
        let second = write_split(cache, &fp, 5, &data, "second", 4).await;
        assert_eq!(second, first, "the loser gets the published manifest");
        assert_eq!(second.writer, "first");
        let detail = cache.inspect(&fp).await.unwrap();
        assert_eq!(detail.unpublished_objects, 0, "the loser deleted its chunks");
        assert_eq!(detail.objects, 1 + first.chunks.len() as u64);
        assert_eq!(read_split(cache, &fp, 5).await.unwrap(), data);

        // A writer reusing the winner's id must not delete the chunks the manifest names.
        let again = write_split(cache, &fp, 5, &data, "first", 6).await;
        assert_eq!(again, first);
        assert_eq!(read_split(cache, &fp, 5).await.unwrap(), data);
        assert!(cache.inspect(&fp).await.unwrap().problems.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_agree_on_one_manifest() {
    for t in caches() {
        let cache = &t.cache;
        let fp = fingerprint(1);
        for split in 0..8u64 {
            let data = records(split, 30);
            let (a, b) = tokio::join!(
                write_split(cache, &fp, split, &data, "a", 4),
                write_split(cache, &fp, split, &data, "b", 5)
            );
            assert_eq!(a, b, "split {split}");
            assert_eq!(read_split(cache, &fp, split).await.unwrap(), data);
        }
        let detail = cache.inspect(&fp).await.unwrap();
        assert_eq!(detail.manifests.len(), 8);
        assert_eq!(detail.unpublished_objects, 0);
    }
}

#[tokio::test]
async fn writer_ids_are_sanitized() {
    let t = memory_cache();
    let fp = fingerprint(1);
    let m = write_split(&t.cache, &fp, 0, &records(0, 3), "pod/a b:1", 2).await;
    assert_eq!(m.writer, "pod/a b:1");
    assert!(m.chunks.iter().all(|c| c.object.starts_with("pod_a_b_1/chunk-")), "{:?}", m.chunks);
    assert_eq!(read_split(&t.cache, &fp, 0).await.unwrap(), records(0, 3));
}

/// The futures of the cache API can move between threads (for `tokio::spawn`).
#[test]
fn futures_are_send() {
    fn send<T: Send>(_: T) {}
    let t = memory_cache();
    let fp = fingerprint(1);
    let mut w = t.cache.split_writer(&fp, 0, "w");
    send(w.push(b"x"));
    send(t.cache.open_split(&fp, 0));
    send(t.cache.completed_splits(&fp));
    send(t.cache.list_entries());
    send(t.cache.inspect(&fp));
    send(t.cache.remove(&fp));
    send(t.cache.probe(1));
    send(w.finish());
}
