//! Pipelines that differ only in `batch.size` share their cache entries: a sweep over batch
//! sizes computes and stores the cached prefix once. For `format: files` (default
//! `filesPerSplit`) and `format: jsonl`, a pipeline with batches of 128 writes the entry, and the
//! same pipeline with batches of 256 finds every split of it, writes 0 bytes, reads it, and
//! delivers the same elements.

mod support;

use bytes::Bytes;
use granary_store::cache::{CacheStore, Fingerprint};
use granary_worker::cache::CacheOutcome;
use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::store::memory_store;
use granary_worker::{Batch, Engine, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::path::Path;

/// Images: three splits of the default `filesPerSplit` (256, 256, 88).
const FILES: usize = 600;
/// JSONL: three files (one split each) of this many lines.
const LINES: usize = 300;

/// An element as delivered: its key and, per field, its row of the batch tensor.
type Element = (String, Vec<(String, Vec<u8>)>);

/// What one run delivered and what its cache did.
struct Served {
    /// Every element delivered, sorted: the multiset.
    elements: Vec<Element>,
    /// Each split's cache outcome.
    outcomes: Vec<CacheOutcome>,
    /// Elements of each split, by split id.
    counts: Vec<u64>,
}

impl Served {
    fn bytes_written(&self) -> u64 {
        self.outcomes.iter().map(|o| o.bytes_written).sum()
    }
}

fn images_manifest(batch: u32, files_per_split: &str, cache: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: sweep-images-{batch}}}
spec:
  source: {{url: "memory://cache-batch-images/data/train/", format: files, labels: ../labels.jsonl{files_per_split}}}
  stages:
    - op: image.decode
    - {{op: image.resize, size: 16}}
    - {{op: image.center_crop, name: crop, size: 16}}
    - op: image.flip
  shuffle: {{buffer: 64}}
  batch: {{size: {batch}}}
  seed: 3
{cache}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

fn text_manifest(batch: u32, cache: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: sweep-text-{batch}}}
spec:
  source: {{url: "memory://cache-batch-text/text/", format: jsonl}}
  stages:
    - {{op: table.select, name: crop, columns: [id, x]}}
  shuffle: {{buffer: 64}}
  batch: {{size: {batch}}}
  seed: 3
{cache}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

/// Writes three JSONL files of [`LINES`] records `{"id", "x", "note"}` into
/// `memory://cache-batch-text/text/`.
fn text_dataset() {
    let store = memory_store("cache-batch-text");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for f in 0..3 {
        let mut body = String::new();
        for i in 0..LINES {
            let id = f * LINES + i;
            let record = serde_json::json!({"id": id, "x": id as f64 / 7.0, "note": format!("line {id}")});
            body.push_str(&record.to_string());
            body.push('\n');
        }
        let path = StorePath::from(format!("text/part-{f}.jsonl"));
        rt.block_on(store.put(&path, Bytes::from(body).into())).unwrap();
    }
}

/// The cache of `policy: at` at stage `crop` in `store`.
fn cache_at(store: &Path) -> String {
    format!("  cache:\n    policy: at\n    at: crop\n    store: \"file://{}/\"\n", store.display())
}

fn open(m: &granary_crds::Manifest) -> Engine {
    let options = EngineOptions {
        threads: 2,
        prefetch_bytes: 8 << 20,
        cache_chunk_bytes: 1 << 16,
        ..Default::default()
    };
    Engine::open(m, options).unwrap()
}

/// The pinned cut and its entry's fingerprint.
fn entry(engine: &Engine) -> (usize, Fingerprint) {
    let cache = engine.cache().expect("the spec caches");
    assert_eq!(cache.cuts.len(), 1, "policy `at` pins one cut");
    (cache.cuts[0].index, cache.cuts[0].fingerprint().clone())
}

/// Each element of `batches`, sorted.
fn elements(batches: &[Batch]) -> Vec<Element> {
    let mut out = Vec::new();
    for b in batches {
        for (row, key) in b.keys.iter().enumerate() {
            let fields = b
                .tensors
                .iter()
                .map(|t| {
                    let width = t.data.len() / t.shape[0];
                    (t.name.clone(), t.data[row * width..(row + 1) * width].to_vec())
                })
                .collect();
            out.push((key.clone(), fields));
        }
    }
    out.sort();
    out
}

/// Runs epoch 0 with each split's cache use from `cache(split)`.
fn run(engine: &Engine, cache: impl Fn(usize) -> CacheUse) -> Served {
    let tasks: Vec<Task> = engine
        .split_order(0)
        .into_iter()
        .map(|split| Task { epoch: 0, split, cache: cache(split), images_on_client: ClientShare::NONE })
        .collect();
    let mut batches = Vec::new();
    let mut outcomes = Vec::new();
    let mut counts = vec![0; engine.source().splits().len()];
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap() {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { task, elements, cache, .. } => {
                counts[task.split] = elements;
                outcomes.push(cache);
            }
        }
    }
    Served { elements: elements(&batches), outcomes, counts }
}

/// Serves epoch 0 as the dispatcher does once the pipeline caches at its pinned cut: a split
/// whose manifest the store holds is read, any other is computed and written.
fn serve(engine: &Engine, store: &CacheStore, counts: &[u64]) -> Served {
    let (cut, fp) = entry(engine);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let present: Vec<bool> =
        (0..counts.len()).map(|s| rt.block_on(store.open_split(&fp, s as u64)).is_ok()).collect();
    run(engine, |s| {
        if present[s] { CacheUse::Read { cut, elements: counts[s] } } else { CacheUse::Write { cut } }
    })
}

/// Runs the sweep: batches of 128, then of 256, sharing `store`.
fn sweep(small: &Engine, large: &Engine, reference: &Engine, store_dir: &Path) {
    let (cut, fp) = entry(small);
    assert_eq!(entry(large), (cut, fp.clone()), "the batch size is not part of the entry");
    assert_eq!(small.source().splits().len(), 3);
    assert_eq!(large.source().splits().len(), 3, "the batch size does not shape the splits");

    let computed = run(reference, |_| CacheUse::Compute);
    let counts = &computed.counts;
    let store = CacheStore::open(&format!("file://{}/", store_dir.display())).unwrap();

    // Batches of 128: nothing is cached yet, so every split is computed and written.
    let first = serve(small, &store, counts);
    assert!(first.outcomes.iter().all(|o| o.written && o.bytes_written > 0), "{:?}", first.outcomes);
    assert_eq!(first.elements, computed.elements);

    // Batches of 256: every split is in the entry the first pipeline wrote.
    let second = serve(large, &store, counts);
    assert_eq!(second.bytes_written(), 0, "{:?}", second.outcomes);
    assert!(
        second.outcomes.iter().all(|o| !o.written && !o.bad && o.recomputed == 0 && o.bytes_read > 0),
        "{:?}",
        second.outcomes
    );
    assert_eq!(second.elements, first.elements, "the same elements, from the entry");

    // One entry in the store, every split of it written once.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let entries = rt.block_on(store.list_entries()).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].splits, 3);
}

#[test]
fn files_pipelines_differing_only_in_batch_size_share_one_entry() {
    support::dataset("cache-batch-images", FILES);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path());
    let small = open(&images_manifest(128, "", &cache));
    let large = open(&images_manifest(256, "", &cache));
    sweep(&small, &large, &open(&images_manifest(128, "", "")), dir.path());

    // The split layout still enters the entry: other splits, another entry.
    let other = open(&images_manifest(128, ", filesPerSplit: 128", &cache));
    assert_eq!(other.source().splits().len(), 5);
    assert_ne!(entry(&other).1, entry(&small).1);
    // An explicit `filesPerSplit` keeps its splits at every batch size, and its entry.
    assert_eq!(entry(&open(&images_manifest(256, ", filesPerSplit: 128", &cache))).1, entry(&other).1);
}

#[test]
fn jsonl_pipelines_differing_only_in_batch_size_share_one_entry() {
    text_dataset();
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path());
    let small = open(&text_manifest(128, &cache));
    let large = open(&text_manifest(256, &cache));
    sweep(&small, &large, &open(&text_manifest(128, "")), dir.path());
}
