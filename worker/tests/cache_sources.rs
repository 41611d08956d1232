//! Cache entries per source: a pipeline mixing `spec.sources` has, at each cut, one entry per
//! source, and it is the very entry a single-source pipeline over that source with the same
//! stages uses (written by one, read by the other); a source's name and weight do not enter it;
//! and further passes of an upsampled source (virtual split ids) read their base split's entry
//! while their random stages still follow their own seeds.

use bytes::Bytes;
use granary_store::cache::CacheStore;
use granary_worker::cache::CacheOutcome;
use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::store::memory_store;
use granary_worker::{Batch, Engine, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::path::Path;

/// Cut 3 holds `crop`'s output: decode, resize and center_crop are deterministic, flip is not.
const CUT: usize = 3;

/// Writes `n` small JPEGs whose pixels depend on `salt` into `memory://NAME/data/train/`.
fn dataset(name: &str, n: usize, salt: u32) {
    let store = memory_store(name);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for i in 0..n as u32 {
        let (w, h) = (30 + (i * 7) % 20, 28 + (i * 11) % 24);
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x * 5 + i + salt) as u8, (y * 3 + salt * 7) as u8, ((x + y) * 2) as u8])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&img).unwrap();
        let path = StorePath::from(format!("data/train/{i:05}.jpg"));
        rt.block_on(store.put(&path, Bytes::from(jpeg).into())).unwrap();
    }
}

const STAGES: &str = "  stages:
    - op: image.decode
    - {op: image.resize, size: 24}
    - {op: image.center_crop, name: crop, size: 24}
    - op: image.flip
  shuffle: {buffer: 3}
  batch: {size: 4}
  seed: 5
";

fn source(data: &str) -> String {
    format!("url: 'memory://{data}/data/train/', format: files, filesPerSplit: 4")
}

/// A pipeline mixing `inputs` (data set, name, weight) by weight.
fn mixed(inputs: &[(&str, &str, f64)], cache: &str) -> granary_crds::Manifest {
    let sources: String = inputs
        .iter()
        .map(|(data, name, weight)| format!("    - {{name: {name}, weight: {weight}, {}}}\n", source(data)))
        .collect();
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: mixed}}
spec:
  sources:
{sources}  mixing: {{stop: elements, elements: 100}}
{STAGES}{cache}"
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

/// A pipeline reading `data` alone.
fn single(data: &str, cache: &str) -> granary_crds::Manifest {
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: single-{data}}}
spec:
  source: {{{}}}
{STAGES}{cache}",
        source(data)
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

fn cache_spec(policy: &str, store: &Path) -> String {
    let at = if policy == "at" { "\n    at: crop" } else { "" };
    format!("  cache:\n    policy: {policy}{at}\n    store: \"file://{}/\"\n", store.display())
}

fn open(m: &granary_crds::Manifest) -> Engine {
    let options =
        EngineOptions { threads: 2, prefetch_bytes: 1 << 20, cache_chunk_bytes: 4096, ..Default::default() };
    Engine::open(m, options).unwrap()
}

/// Each cut's entries, by cut.
fn fingerprints(engine: &Engine) -> Vec<(usize, Vec<String>)> {
    let cache = engine.cache().expect("the spec caches");
    cache.cuts.iter().map(|c| (c.index, c.fingerprints.iter().map(|f| f.to_string()).collect())).collect()
}

type Comparable = Vec<(Vec<String>, Vec<(String, Vec<usize>, Vec<u8>)>)>;

fn comparable(batches: &[Batch]) -> Comparable {
    batches
        .iter()
        .map(|b| {
            let tensors =
                b.tensors.iter().map(|t| (t.name.clone(), t.shape.clone(), t.data.clone())).collect();
            (b.keys.clone(), tensors)
        })
        .collect()
}

/// Runs `splits` of epoch `epoch`, each with `cache(split)`: the batches and each split's
/// (split, elements, cache outcome).
fn run(
    engine: &Engine,
    epoch: u32,
    splits: impl IntoIterator<Item = usize>,
    cache: impl Fn(usize) -> CacheUse,
) -> (Comparable, Vec<(usize, u64, CacheOutcome)>) {
    let tasks: Vec<Task> = splits
        .into_iter()
        .map(|split| Task { epoch, split, cache: cache(split), images_on_client: ClientShare::NONE })
        .collect();
    let mut batches = Vec::new();
    let mut done = Vec::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap() {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { task, elements, cache, .. } => done.push((task.split, elements, cache)),
        }
    }
    (comparable(&batches), done)
}

#[test]
fn each_source_has_the_entry_a_single_source_pipeline_over_it_has() {
    dataset("fp-a", 12, 0);
    dataset("fp-b", 8, 90);
    let dir = tempfile::tempdir().unwrap();
    let auto = cache_spec("auto", dir.path());
    let mix = fingerprints(&open(&mixed(&[("fp-a", "web", 0.7), ("fp-b", "code", 0.3)], &auto)));
    let a = fingerprints(&open(&single("fp-a", &auto)));
    let b = fingerprints(&open(&single("fp-b", &auto)));
    assert_eq!(mix.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [0, 1, 2, 3], "every cut of the prefix");
    for ((k, entries), ((_, fa), (_, fb))) in mix.iter().zip(a.iter().zip(&b)) {
        assert_eq!(entries, &vec![fa[0].clone(), fb[0].clone()], "cut {k}: the single-source entries");
        assert_ne!(fa, fb, "cut {k}: each source has its own entry");
    }
    // Names and weights choose what is drawn, not what the elements are.
    let renamed = fingerprints(&open(&mixed(&[("fp-a", "x", 1.0), ("fp-b", "y", 9.0)], &auto)));
    assert_eq!(renamed, mix);
    // Each source keeps its entry wherever it stands in `spec.sources`.
    let swapped = fingerprints(&open(&mixed(&[("fp-b", "code", 0.3), ("fp-a", "web", 0.7)], &auto)));
    for ((_, s), (_, m)) in swapped.iter().zip(&mix) {
        assert_eq!(s, &vec![m[1].clone(), m[0].clone()]);
    }
    // Split ids of the combined listing (3 splits of `fp-a`, then 2 of `fp-b`) and of further
    // passes map to each source's own split numbering.
    let engine = open(&mixed(&[("fp-a", "web", 0.7), ("fp-b", "code", 0.3)], &auto));
    let cache = engine.cache().unwrap();
    let located: Vec<Option<(usize, u64)>> =
        [0, 2, 3, 4, 5, 8, 9, 14].iter().map(|&s| cache.locate(s)).collect();
    let expected = [(0, 0), (0, 2), (1, 0), (1, 1), (0, 0), (1, 0), (1, 1), (1, 1)];
    assert_eq!(located, expected.map(Some));
}

#[test]
fn a_mixed_pipelines_entries_serve_later_passes_and_a_single_source_pipeline() {
    dataset("share-a", 12, 3);
    dataset("share-b", 8, 77);
    let dir = tempfile::tempdir().unwrap();
    let at = cache_spec("at", dir.path());
    let inputs = [("share-a", "web", 0.5), ("share-b", "code", 0.5)];
    let cached = open(&mixed(&inputs, &at));
    let reference = open(&mixed(&inputs, ""));
    let listed = cached.source().splits().len();
    assert_eq!(listed, 5);
    let counts: Vec<u64> =
        run(&reference, 0, 0..listed, |_| CacheUse::Compute).1.iter().map(|s| s.1).collect();

    // Epoch 0 writes every split of both sources and delivers what computing delivers.
    let (written, done) = run(&cached, 0, 0..listed, |_| CacheUse::Write { cut: CUT });
    assert_eq!(written, run(&reference, 0, 0..listed, |_| CacheUse::Compute).0);
    assert!(done.iter().all(|(_, _, o)| o.written && o.bytes_written > 0), "{done:?}");

    // A second pass (virtual ids listed..2×listed) reads its base splits' entries; its flips
    // follow its own seeds, exactly as computing it does.
    let passes = listed..2 * listed;
    let read = |s: usize| CacheUse::Read { cut: CUT, elements: counts[s % listed] };
    let (second, done) = run(&cached, 0, passes.clone(), read);
    let computed = run(&reference, 0, passes, |_| CacheUse::Compute).0;
    assert_eq!(second, computed);
    assert_ne!(second, written, "a further pass draws its own augmentations");
    assert!(done.iter().all(|(_, _, o)| !o.bad && o.recomputed == 0 && o.bytes_read > 0), "{done:?}");

    // A pipeline reading `share-b` alone reads the mixed pipeline's entry of it, by its own
    // split numbering, and delivers what it computes.
    let alone = open(&single("share-b", &at));
    let alone_reference = open(&single("share-b", ""));
    let b_counts = &counts[3..];
    let (got, done) = run(&alone, 1, 0..2, |s| CacheUse::Read { cut: CUT, elements: b_counts[s] });
    assert_eq!(got, run(&alone_reference, 1, 0..2, |_| CacheUse::Compute).0);
    assert!(done.iter().all(|(_, _, o)| !o.bad && o.recomputed == 0 && o.bytes_read > 0), "{done:?}");

    // One entry per source, each describing its own source.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = CacheStore::open(&format!("file://{}/", dir.path().display())).unwrap();
    let mut entries: Vec<(String, u64, u64)> = rt
        .block_on(store.list_entries())
        .unwrap()
        .into_iter()
        .map(|e| {
            let info = e.info.expect("entry.json");
            (info.source_url, info.splits_total, e.splits)
        })
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [
            ("memory://share-a/data/train/".to_string(), 3, 3),
            ("memory://share-b/data/train/".to_string(), 2, 2)
        ]
    );
}
