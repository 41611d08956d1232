//! How many changes a second the dispatcher journals with group commit, against the path before
//! it (one unconditional put per change, one at a time), in the same run on the same disk; both
//! flush each object to the disk before a change counts.
//! Run: `cargo nextest run -p granary-dispatcher --run-ignored only -E 'test(bench_)' --no-capture`.

use super::Journal;
use crate::service::{Dispatcher, DispatcherConfig};
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;
use std::time::Instant;

/// Concurrent requests, and changes each makes.
const TASKS: usize = 32;
const PER_TASK: usize = 25;

/// A catalog with no sources: the journal tests register none.
pub(super) struct NoSources;

impl crate::Catalog for NoSources {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<crate::Listing, String> {
        Ok(Default::default())
    }
}

fn evicted(task: usize, n: usize) -> crate::state::Event {
    crate::state::Event::CacheEvicted { store: "s3://cache/".into(), fingerprint: format!("f{task}-{n}") }
}

/// Changes a second through one put per change behind a lock, as before.
async fn one_put_per_change(dir: &std::path::Path) -> f64 {
    std::fs::create_dir_all(dir).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap());
    let next = Arc::new(tokio::sync::Mutex::new(0_u64));
    let local = super::durable::LocalFolder { folder: dir.to_path_buf() };
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (store, next, local) = (Arc::clone(&store), Arc::clone(&next), local.clone());
            tokio::spawn(async move {
                for n in 0..PER_TASK {
                    let body = serde_json::to_vec(&[evicted(task, n)]).unwrap();
                    let mut next = next.lock().await;
                    let location = object_store::path::Path::from(format!("journal/{:020}.json", *next));
                    store.put(&location, PutPayload::from(body)).await.unwrap();
                    // As durable as the journal's records: flushed to the disk.
                    local.sync(&object_store::path::Path::from(""), &location).await.unwrap();
                    *next += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (TASKS * PER_TASK) as f64 / started.elapsed().as_secs_f64()
}

/// Changes a second through `Dispatcher::mutate`: create-only records, group commit, each
/// answered once durable.
async fn group_commit(dir: &std::path::Path) -> f64 {
    let (journal, events) = Journal::open(&dir.display().to_string()).await.unwrap();
    let d = Dispatcher::on_journal(DispatcherConfig::default(), Arc::new(NoSources), journal, events);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let d = d.clone();
            tokio::spawn(async move {
                for n in 0..PER_TASK {
                    let crate::state::Event::CacheEvicted { store, fingerprint } = evicted(task, n) else {
                        unreachable!()
                    };
                    d.mutate(|s, _| {
                        s.cache_evicted(&store, &fingerprint);
                        Ok(())
                    })
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = (TASKS * PER_TASK) as f64 / started.elapsed().as_secs_f64();
    let (ok, failed) = d.journal_writes().unwrap();
    // Every change is in the journal, once.
    let (_, events) = Journal::open(&dir.display().to_string()).await.unwrap();
    assert_eq!(events.len(), TASKS * PER_TASK);
    assert_eq!(failed, 0);
    println!("group commit: {} changes in {ok} records", TASKS * PER_TASK);
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark, run by hand"]
async fn bench_group_commit_against_one_put_per_change() {
    let dir = tempfile::tempdir().unwrap();
    let before = one_put_per_change(&dir.path().join("before")).await;
    let after = group_commit(&dir.path().join("after")).await;
    println!(
        "journal, {TASKS} concurrent requests: one put per change {before:.0}/s, group commit {after:.0}/s, ratio {:.2}",
        after / before
    );
}
