//! The engine's cache paths over a `file://` store: write-through in one epoch and reads in the
//! next give the same batches as computing; legal cuts and fingerprints; and 100 corruptions of
//! a written entry, each detected and recomputed from the first bad chunk with every element
//! delivered once.

mod support;

use granary_worker::cache::CacheOutcome;
use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::{Batch, Engine, EngineOptions};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ELEMENTS: usize = 40;
/// Stages decode, resize and center_crop are deterministic: cut 3 holds center_crop's output.
const CUT: usize = 3;

fn manifest(data: &str, cache: &str) -> granary_crds::Manifest {
    manifest_with(data, cache, 24, "crop")
}

fn manifest_with(data: &str, cache: &str, resize: u32, crop: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: cached}}
spec:
  source: {{url: "memory://{data}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 8}}
  stages:
    - op: image.decode
    - op: image.resize
      size: {resize}
    - {{op: image.center_crop, name: {crop}, size: 24}}
    - op: image.flip
    - op: image.normalize
      mean: [0.5, 0.5, 0.5]
      std: [0.25, 0.25, 0.25]
  shuffle: {{buffer: 6}}
  batch: {{size: 4}}
  seed: 11
  epochs: 2
{cache}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

fn cache_spec(policy: &str, store: &Path) -> String {
    let at = if policy == "at" { "\n    at: crop" } else { "" };
    format!("  cache:\n    policy: {policy}{at}\n    store: \"file://{}/\"\n", store.display())
}

fn open(m: &granary_crds::Manifest) -> Engine {
    // Chunks of about 4 KiB: two or three records each, so a split has several.
    let options =
        EngineOptions { threads: 2, prefetch_bytes: 1 << 20, cache_chunk_bytes: 4096, ..Default::default() };
    Engine::open(m, options).unwrap()
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

/// Runs `tasks` and returns the batches and each split's (task, elements, cache outcome).
fn run(engine: &Engine, tasks: Vec<Task>) -> (Vec<Batch>, Vec<(Task, u64, CacheOutcome)>) {
    let mut batches = Vec::new();
    let mut splits = Vec::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap() {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { task, elements, cache, .. } => splits.push((task, elements, cache)),
        }
    }
    (batches, splits)
}

fn tasks(engine: &Engine, epoch: u32, cache: impl Fn(usize) -> CacheUse) -> Vec<Task> {
    engine
        .split_order(epoch)
        .into_iter()
        .map(|split| Task { epoch, split, cache: cache(split), images_on_client: ClientShare::NONE })
        .collect()
}

/// Elements of each split, from a compute run.
fn counts(engine: &Engine) -> Vec<u64> {
    let (_, splits) = run(engine, tasks(engine, 0, |_| CacheUse::Compute));
    let mut counts = vec![0; engine.source().splits().len()];
    for (task, elements, _) in splits {
        counts[task.split] = elements;
    }
    counts
}

#[test]
fn an_entry_written_in_one_epoch_reads_back_as_the_computed_epoch() {
    support::dataset("cache-roundtrip", ELEMENTS);
    let dir = tempfile::tempdir().unwrap();
    let reference = open(&manifest("cache-roundtrip", ""));
    let cached = open(&manifest("cache-roundtrip", &cache_spec("at", dir.path())));
    assert!(reference.cache().is_none());
    let cuts: Vec<usize> = cached.cache().unwrap().cuts.iter().map(|c| c.index).collect();
    assert_eq!(cuts, vec![CUT], "policy `at` pins its cut");
    let counts = counts(&cached);

    // Epoch 0 writes through and delivers what computing delivers.
    let (written, splits) = run(&cached, tasks(&cached, 0, |_| CacheUse::Write { cut: CUT }));
    let (computed0, _) = run(&reference, tasks(&reference, 0, |_| CacheUse::Compute));
    assert_eq!(comparable(&written), comparable(&computed0));
    for (task, _, outcome) in &splits {
        assert!(outcome.written, "split {} not published: {:?}", task.split, outcome.problem);
        assert!(outcome.bytes_written > 0);
    }

    // Epoch 1 reads: the same batches as computing epoch 1, element for element.
    let (read, splits) =
        run(&cached, tasks(&cached, 1, |s| CacheUse::Read { cut: CUT, elements: counts[s] }));
    let (computed1, _) = run(&reference, tasks(&reference, 1, |_| CacheUse::Compute));
    assert_eq!(comparable(&read), comparable(&computed1));
    assert_ne!(comparable(&computed0), comparable(&computed1), "augmentation differs per epoch");
    for (task, _, outcome) in &splits {
        assert!(!outcome.bad && outcome.recomputed == 0, "split {}: {outcome:?}", task.split);
        assert!(outcome.bytes_read > 0);
    }
}

#[test]
fn auto_offers_every_cut_of_the_deterministic_prefix_with_its_own_fingerprint() {
    support::dataset("cache-cuts", 12);
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&manifest("cache-cuts", &cache_spec("auto", dir.path())));
    let cache = engine.cache().unwrap();
    let cuts: Vec<(usize, &str)> = cache.cuts.iter().map(|c| (c.index, c.stage.as_str())).collect();
    assert_eq!(cuts, vec![(0, "source"), (1, "image.decode"), (2, "image.resize"), (3, "crop")]);
    // (A renamed stage is reported under its new name but shares the entry.)
    let fps: BTreeSet<&str> = cache.cuts.iter().map(|c| c.fingerprint().as_str()).collect();
    assert_eq!(fps.len(), 4);

    // Renaming a stage changes nothing; changing its arguments or the data does.
    let fp3 = |m: &granary_crds::Manifest| open(m).cache().unwrap().cut(3).unwrap().fingerprint().to_string();
    let spec = cache_spec("auto", dir.path());
    let base = fp3(&manifest("cache-cuts", &spec));
    assert_eq!(fp3(&manifest_with("cache-cuts", &spec, 24, "square")), base);
    assert_ne!(fp3(&manifest_with("cache-cuts", &spec, 25, "crop")), base);
    support::dataset("cache-cuts", 13);
    assert_ne!(fp3(&manifest("cache-cuts", &cache_spec("auto", dir.path()))), base, "the data changed");
}

#[test]
fn a_fused_stage_is_never_cut_by_auto() {
    support::dataset("cache-fused", 8);
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: fused}}
spec:
  source: {{url: "memory://cache-fused/data/train/", format: files, labels: ../labels.jsonl}}
  stages:
    - op: image.decode
    - {{op: image.random_resized_crop, size: 16}}
  batch: {{size: 4}}
{}"#,
        cache_spec("auto", dir.path())
    );
    let m = granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap();
    let engine = open(&m);
    let cuts: Vec<usize> = engine.cache().unwrap().cuts.iter().map(|c| c.index).collect();
    assert_eq!(cuts, vec![0], "decode is fused with the random crop: only the source cut is legal");
}

/// Copies a directory tree.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every file under `dir`, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The folder of split `split` of the entry with fingerprint `fp`.
fn split_dir(store: &Path, fp: &str, split: usize) -> PathBuf {
    store.join(fp).join("splits").join(format!("{split:08}"))
}

fn chunks_of(store: &Path, fp: &str, split: usize) -> Vec<PathBuf> {
    files(&split_dir(store, fp, split))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "grc"))
        .collect()
}

/// Damages split `split` of the entry in `store` the way `kind` says; returns what it did.
fn corrupt(
    store: &Path,
    fp: &str,
    other_fp: &str,
    split: usize,
    kind: usize,
    rng: &mut ChaCha8Rng,
) -> String {
    let dir = split_dir(store, fp, split);
    let manifest = dir.join("manifest.json");
    let chunks = chunks_of(store, fp, split);
    let chunk = chunks[rng.random_range(0..chunks.len())].clone();
    let name = chunk.file_name().unwrap().to_string_lossy().to_string();
    match kind {
        0 => {
            let mut bytes = std::fs::read(&chunk).unwrap();
            let i = rng.random_range(0..bytes.len());
            bytes[i] ^= 1 << rng.random_range(0..8);
            std::fs::write(&chunk, bytes).unwrap();
            format!("flipped a bit of byte {i} of {name}")
        }
        1 => {
            let bytes = std::fs::read(&chunk).unwrap();
            let len = rng.random_range(0..bytes.len());
            std::fs::write(&chunk, &bytes[..len]).unwrap();
            format!("truncated {name} to {len} bytes")
        }
        2 => {
            std::fs::remove_file(&chunk).unwrap();
            format!("deleted {name}")
        }
        3 => {
            std::fs::remove_file(&manifest).unwrap();
            "deleted the manifest".into()
        }
        4 => {
            let other = (split + 1 + rng.random_range(0..3)) % 5;
            std::fs::copy(split_dir(store, fp, other).join("manifest.json"), &manifest).unwrap();
            format!("replaced the manifest with split {other}'s")
        }
        5 => {
            std::fs::copy(split_dir(store, other_fp, split).join("manifest.json"), &manifest).unwrap();
            "replaced the manifest with another entry's".into()
        }
        6 => {
            let mut bytes = std::fs::read(&manifest).unwrap();
            let len = rng.random_range(0..bytes.len());
            bytes.truncate(len);
            std::fs::write(&manifest, bytes).unwrap();
            format!("truncated the manifest to {len} bytes")
        }
        7 => {
            let mut bytes = std::fs::read(&chunk).unwrap();
            bytes.extend_from_slice(b"trailing");
            std::fs::write(&chunk, bytes).unwrap();
            format!("appended bytes to {name}")
        }
        8 => {
            let text = std::fs::read_to_string(&manifest).unwrap();
            let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
            json["elements"] = serde_json::json!(json["elements"].as_u64().unwrap() - 1);
            std::fs::write(&manifest, json.to_string()).unwrap();
            "changed the manifest's element count".into()
        }
        _ => {
            // Swap the contents of two chunks: each one's bytes are well-formed but misplaced.
            let a = &chunks[0];
            let b = &chunks[chunks.len() - 1];
            let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
            std::fs::write(a, y).unwrap();
            std::fs::write(b, x).unwrap();
            "swapped the first and last chunks".into()
        }
    }
}

#[test]
fn a_hundred_corruptions_are_each_detected_and_recomputed_without_duplicates() {
    support::dataset("cache-corrupt", ELEMENTS);
    let pristine = tempfile::tempdir().unwrap();
    // The reference computes with the same plan: under `policy: auto` the deterministic image
    // stages stay apart (the cache may cut between them), where without a cache they would fuse.
    let empty = tempfile::tempdir().unwrap();
    let reference = open(&manifest("cache-corrupt", &cache_spec("auto", empty.path())));
    let writer = open(&manifest("cache-corrupt", &cache_spec("auto", pristine.path())));
    let fp = writer.cache().unwrap().cut(CUT).unwrap().fingerprint().to_string();
    let other_fp = writer.cache().unwrap().cut(2).unwrap().fingerprint().to_string();
    let counts = counts(&writer);
    // Two entries: the one read (cut 3) and another (cut 2) whose manifests make foreign ones.
    for cut in [CUT, 2] {
        let (_, splits) = run(&writer, tasks(&writer, 0, |_| CacheUse::Write { cut }));
        assert!(splits.iter().all(|(_, _, o)| o.written));
    }
    for split in 0..counts.len() {
        assert!(chunks_of(pristine.path(), &fp, split).len() >= 2, "split {split} needs several chunks");
    }
    let expected = comparable(&run(&reference, tasks(&reference, 1, |_| CacheUse::Compute)).0);

    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    // Cases where the entry supplied the split's first chunks and the source only the rest.
    let mut partial = 0;
    for case in 0..100 {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(pristine.path(), dir.path());
        let split = rng.random_range(0..counts.len());
        let what = corrupt(dir.path(), &fp, &other_fp, split, case % 10, &mut rng);
        let engine = open(&manifest("cache-corrupt", &cache_spec("auto", dir.path())));
        let (batches, splits) =
            run(&engine, tasks(&engine, 1, |s| CacheUse::Read { cut: CUT, elements: counts[s] }));
        let context = format!("case {case}: split {split}: {what}");
        assert_eq!(comparable(&batches), expected, "{context}: output differs");
        let keys: Vec<&String> = batches.iter().flat_map(|b| &b.keys).collect();
        let unique: BTreeSet<&&String> = keys.iter().collect();
        assert_eq!((keys.len(), unique.len()), (ELEMENTS, ELEMENTS), "{context}: an element twice or lost");
        for (task, elements, outcome) in &splits {
            assert_eq!(*elements, counts[task.split], "{context}");
            if task.split == split {
                assert!(outcome.bad, "{context}: not detected: {outcome:?}");
                assert!(
                    outcome.recomputed > 0 && outcome.recomputed <= counts[split],
                    "{context}: {outcome:?}"
                );
                assert!(outcome.problem.is_some(), "{context}");
                partial += usize::from(outcome.recomputed < counts[split]);
            } else {
                assert!(
                    !outcome.bad && outcome.recomputed == 0,
                    "{context}: split {}: {outcome:?}",
                    task.split
                );
            }
        }
    }
    assert!(partial >= 10, "only {partial} cases recomputed from a chunk after the first");
}

#[test]
fn the_profile_measures_every_cut_and_the_store() {
    support::dataset("cache-profile", 24);
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&manifest("cache-profile", &cache_spec("auto", dir.path())));
    let limits = granary_worker::cache::profile::Limits {
        elements: 8,
        time: std::time::Duration::from_secs(5),
        probe_bytes: 1 << 20,
        cut_bytes: 1 << 20,
    };
    let profile = engine.cache_profile(limits).unwrap();
    assert_eq!(profile.error, "");
    assert_eq!(profile.sampled_elements, 8);
    assert_eq!(profile.cores, 2);
    assert!(profile.compute_seconds_per_element > 0.0);
    assert!(profile.read_bytes_per_second > 0.0 && profile.write_bytes_per_second > 0.0);
    let cuts: Vec<(u32, &str)> = profile.boundaries.iter().map(|b| (b.index, b.stage.as_str())).collect();
    assert_eq!(cuts, vec![(0, "source"), (1, "image.decode"), (2, "image.resize"), (3, "crop")]);
    let cache = engine.cache().unwrap();
    for b in &profile.boundaries {
        assert_eq!(b.fingerprint, cache.cut(b.index as usize).unwrap().fingerprint().to_string());
        assert!(
            b.bytes_per_element > 0.0
                && b.encode_seconds_per_element > 0.0
                && b.decode_seconds_per_element > 0.0
        );
        // Prefix and suffix split the whole pipeline between them.
        let whole = b.prefix_seconds_per_element + b.suffix_seconds_per_element;
        assert!((whole - profile.compute_seconds_per_element).abs() < 1e-9, "{b:?}");
    }
    // Decoding makes the element bigger; resizing it to 24 pixels smaller again.
    let bytes: Vec<f64> = profile.boundaries.iter().map(|b| b.bytes_per_element).collect();
    assert!(bytes[1] > bytes[2], "{bytes:?}");
    // A profile of a pipeline that does not cache is nothing.
    assert!(open(&manifest("cache-profile", "")).cache_profile(limits).is_none());
}

#[test]
fn a_tokenizer_edited_in_place_changes_the_entries_after_its_stage() {
    use granary_worker::store::memory_store;
    use object_store::ObjectStoreExt;
    use object_store::path::Path as StorePath;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..20).map(|i| format!("{{\"text\": \"line number {i}\"}}\n")).collect();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(
        memory_store("cache-tokenizer").put(&StorePath::from("text/a.jsonl"), lines.into_bytes().into()),
    )
    .unwrap();
    let tokenizer = dir.path().join("tokenizer.json");
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: text}}
spec:
  source: {{url: "memory://cache-tokenizer/text/", format: jsonl}}
  stages:
    - {{op: table.select, columns: [text]}}
    - {{op: text.tokenize, tokenizer: "{}"}}
    - {{op: text.truncate_pad, length: 16}}
  batch: {{size: 4}}
{}"#,
        tokenizer.display(),
        cache_spec("auto", dir.path())
    );
    let fingerprints = || {
        let m = granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap();
        let engine = open(&m);
        let cache = engine.cache().unwrap();
        cache.cuts.iter().map(|c| (c.index, c.fingerprint().to_string())).collect::<Vec<_>>()
    };
    std::fs::copy(fixtures.join("wordpiece.json"), &tokenizer).unwrap();
    let before = fingerprints();
    std::fs::copy(fixtures.join("wordpiece_padded.json"), &tokenizer).unwrap();
    let after = fingerprints();
    assert_eq!(before.len(), 4);
    // Cuts 0 and 1 (before the tokenizer) keep their entries; cuts 2 and 3 get new ones.
    assert_eq!(before[..2], after[..2]);
    assert_ne!(before[2].1, after[2].1);
    assert_ne!(before[3].1, after[3].1);
}

#[test]
fn a_cache_store_that_cannot_be_opened_turns_caching_off_not_the_pipeline() {
    support::dataset("cache-unopenable", 8);
    // An Azure URL with no account anywhere: valid in the spec, refused by the store's builder.
    let m =
        manifest("cache-unopenable", "  cache:\n    policy: auto\n    store: \"az://container/cache/\"\n");
    let engine = open(&m);
    assert!(engine.cache().is_none());
    let error = engine.cache_error().unwrap();
    assert!(error.starts_with("spec.cache.store: "), "{error}");
    let (batches, _) = run(&engine, tasks(&engine, 0, |_| CacheUse::Compute));
    assert_eq!(batches.iter().map(|b| b.len()).sum::<usize>(), 8);
}
