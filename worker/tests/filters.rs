//! `op: filter`: each predicate drops exactly the elements it rejects (characters of text, tokens
//! after `text.tokenize`, the size of decoded images); the output is the same for any thread
//! count and on a re-run; `SplitDone` counts what each split produced; a budget far smaller than
//! the data neither leaks nor stalls when most elements are dropped; and a cache entry written
//! before a filter reads back as computing.

mod support;

use bytes::Bytes;
use granary_crds::ops::Tokenize;
use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::ops::text::tokenize::TokenizeOp;
use granary_worker::ops::{BuildContext, BuildError, Operator};
use granary_worker::seed::SeededRng;
use granary_worker::source::SplitKind;
use granary_worker::store::memory_store;
use granary_worker::{Batch, Element, Engine, EngineOptions, ImagePath, Value};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Sizes of the test images `support::dataset` writes: (width, height) of image `i`.
fn image_size(i: usize) -> (usize, usize) {
    (40 + (i * 7) % 50, 30 + (i * 11) % 60)
}

fn image_manifest(name: &str, filter: &str, batch: usize, cache: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: filtered}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 8}}
  stages:
    - op: image.decode
{filter}
    - op: image.random_resized_crop
      size: 12
    - op: image.flip
  shuffle: {{buffer: 5}}
  batch: {{size: {batch}}}
  seed: 3
  epochs: 1
{cache}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap_or_else(|p| panic!("{p:?}"))
}

fn open(manifest: &granary_crds::Manifest, threads: usize, prefetch_bytes: usize) -> Engine {
    let options = EngineOptions { threads, prefetch_bytes, ..Default::default() };
    Engine::open(manifest, options).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs epoch 0 split by split: the batches, and each split's `SplitDone` count by split index.
fn run(engine: &Engine) -> (Vec<Batch>, BTreeMap<usize, u64>) {
    run_tasks(engine, engine.split_order(0).into_iter().map(|s| Task::compute(0, s)).collect())
}

fn run_tasks(engine: &Engine, tasks: Vec<Task>) -> (Vec<Batch>, BTreeMap<usize, u64>) {
    let mut batches = Vec::new();
    let mut counts = BTreeMap::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap_or_else(|e| panic!("{e}")) {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { task, elements, .. } => {
                counts.insert(task.split, elements);
            }
        }
    }
    (batches, counts)
}

/// Keys, and each tensor's name, shape and bytes, of every batch in order.
type Comparable = Vec<(Vec<String>, Vec<(String, Vec<usize>, Vec<u8>)>)>;

fn comparable(batches: &[Batch]) -> Comparable {
    batches
        .iter()
        .map(|b| {
            (
                b.keys.clone(),
                b.tensors.iter().map(|t| (t.name.clone(), t.shape.clone(), t.data.clone())).collect(),
            )
        })
        .collect()
}

fn keys(batches: &[Batch]) -> BTreeSet<String> {
    batches.iter().flat_map(|b| b.keys.iter().cloned()).collect()
}

/// Checks that each split's `SplitDone` count is the number of rows its batches carried.
fn assert_counts_match_batches(batches: &[Batch], counts: &BTreeMap<usize, u64>, engine: &Engine) {
    let mut rows: BTreeMap<u64, u64> = BTreeMap::new();
    for b in batches {
        let origin = b.origin.expect("engine batches name their split");
        *rows.entry(origin.split).or_default() += b.len() as u64;
    }
    for (split, &elements) in counts {
        let id = engine.source().splits()[*split].id;
        assert_eq!(rows.get(&id).copied().unwrap_or(0), elements, "split {split}");
    }
}

#[test]
fn image_min_size_drops_the_small_images_the_same_for_any_threads_and_runs() {
    let n = 40;
    support::dataset("flt-images", n);
    let filter = "    - {op: filter, predicate: image.min_size, minWidth: 60, minHeight: 50}";
    let m = image_manifest("flt-images", filter, 4, "");
    let expected: BTreeSet<String> = (0..n)
        .filter(|&i| image_size(i).0 >= 60 && image_size(i).1 >= 50)
        .map(|i| format!("{i:05}.jpg"))
        .collect();
    assert!(!expected.is_empty() && expected.len() < n, "the test data has both kinds");

    let engine = open(&m, 1, 1 << 20);
    let (first, counts) = run(&engine);
    assert_eq!(keys(&first), expected);
    assert_eq!(first.iter().map(Batch::len).sum::<usize>(), expected.len(), "each element once");
    assert_eq!(counts.len(), 5, "every split reports");
    assert_eq!(counts.values().sum::<u64>(), expected.len() as u64);
    assert_counts_match_batches(&first, &counts, &engine);
    for b in &first {
        assert_eq!(b.tensor("image").unwrap().shape, [b.len(), 12, 12, 3]);
    }

    for threads in [2, 2, 1] {
        let (again, counts_again) = run(&open(&m, threads, 1 << 20));
        assert_eq!(comparable(&again), comparable(&first), "threads {threads}");
        assert_eq!(counts_again, counts);
    }
    // The stages after the filter draw from each element's own stream: the kept elements get the
    // crops and flips they get without the filter.
    // (A filter that keeps everything, so that both run the same, separate, image stages.)
    let keep_all = "    - {op: filter, predicate: image.min_size, minWidth: 1}";
    let plain = run(&open(&image_manifest("flt-images", keep_all, 1, ""), 2, 1 << 20)).0;
    assert_eq!(plain.len(), n);
    let filtered = run(&open(&image_manifest("flt-images", filter, 1, ""), 2, 1 << 20)).0;
    let by_key = |batches: &[Batch]| -> BTreeMap<String, Vec<u8>> {
        batches.iter().map(|b| (b.keys[0].clone(), b.tensor("image").unwrap().data.clone())).collect()
    };
    let plain = by_key(&plain);
    for (key, pixels) in by_key(&filtered) {
        assert_eq!(plain.get(&key), Some(&pixels), "{key}");
    }
}

#[test]
fn a_budget_far_below_the_data_neither_leaks_nor_stalls_when_most_elements_are_dropped() {
    support::dataset("flt-budget", 48);
    // Keeps only the widest images; 16 KiB of budget is a few encoded images.
    let m =
        image_manifest("flt-budget", "    - {op: filter, predicate: image.min_size, minWidth: 85}", 3, "");
    for threads in [1, 2] {
        let engine = open(&m, threads, 16 << 10);
        let (batches, counts) = run(&engine);
        let expected: BTreeSet<String> =
            (0..48).filter(|&i| image_size(i).0 >= 85).map(|i| format!("{i:05}.jpg")).collect();
        assert_eq!(keys(&batches), expected);
        assert_counts_match_batches(&batches, &counts, &engine);
    }
    // Nothing kept: every split still completes, with 0 elements and no batch.
    let none =
        image_manifest("flt-budget", "    - {op: filter, predicate: image.min_size, minHeight: 1000}", 3, "");
    let engine = open(&none, 2, 16 << 10);
    let (batches, counts) = run(&engine);
    assert!(batches.is_empty());
    assert_eq!(counts.len(), 6);
    assert!(counts.values().all(|&c| c == 0), "{counts:?}");
    // Two epochs back to back through the merging engine iterator.
    assert_eq!(engine.run_epochs(0..2).count(), 0);
}

#[test]
fn a_cache_entry_written_before_a_filter_reads_back_as_computing() {
    support::dataset("flt-cache", 24);
    let dir = tempfile::tempdir().unwrap();
    let cache = format!(
        "  cache:\n    policy: at\n    at: image.decode\n    store: \"file://{}/\"\n",
        dir.path().display()
    );
    let filter = "    - {op: filter, predicate: image.min_size, minWidth: 60}";
    let cached = open(&image_manifest("flt-cache", filter, 4, &cache), 2, 1 << 20);
    // The pinned cut keeps the decode on its own, so the reference runs the stages separately
    // too (the fast path crops with other rounding).
    let options = EngineOptions {
        threads: 2,
        prefetch_bytes: 1 << 20,
        image_path: ImagePath::Separate,
        ..Default::default()
    };
    let reference = Engine::open(&image_manifest("flt-cache", filter, 4, ""), options).unwrap();
    let cut = 1;
    assert_eq!(cached.cache().unwrap().cuts.iter().map(|c| c.index).collect::<Vec<_>>(), [cut]);
    let tasks = |epoch: u32, cache: &dyn Fn(usize) -> CacheUse| -> Vec<Task> {
        cached
            .split_order(epoch)
            .into_iter()
            .map(|split| Task { epoch, split, cache: cache(split), images_on_client: ClientShare::NONE })
            .collect()
    };
    // The entry holds every element at the cut: the listed count, not the filtered one.
    let listed = |split: usize| match &cached.source().splits()[split].kind {
        SplitKind::Files(files) => files.len() as u64,
        _ => unreachable!("a files source"),
    };
    let (written, written_counts) = run_tasks(&cached, tasks(0, &|_| CacheUse::Write { cut }));
    let (computed, computed_counts) = run(&reference);
    assert_eq!(comparable(&written), comparable(&computed));
    assert_eq!(written_counts, computed_counts);
    let (read, read_counts) = run_tasks(&cached, tasks(0, &|s| CacheUse::Read { cut, elements: listed(s) }));
    assert_eq!(comparable(&read), comparable(&computed));
    assert_eq!(read_counts, computed_counts);
}

/// Writes JSON Lines files into `memory://NAME/text/`, one split each.
fn text_source(name: &str, files: &[&[&str]]) {
    let store = memory_store(name);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut id = 0;
    for (f, lines) in files.iter().enumerate() {
        let mut body = String::new();
        for text in *lines {
            body.push_str(&serde_json::json!({"id": id, "text": text}).to_string());
            body.push('\n');
            id += 1;
        }
        rt.block_on(store.put(&StorePath::from(format!("text/part-{f}.jsonl")), Bytes::from(body).into()))
            .unwrap();
    }
}

const TEXTS: [&[&str]; 3] = [
    &["a cat", "the quick brown fox jumps over the lazy dog", "ünïcödé wörds", "", "hello world"],
    &["one", "two words", "three little words", "a much longer sentence about nothing in particular"],
    &["tokens and more tokens", "short", "ça va très bien", "the end of the corpus is near now"],
];

fn text_manifest(name: &str, stages: &str, threads_note: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: text-{threads_note}}}
spec:
  source: {{url: "memory://{name}/text/", format: jsonl}}
  stages:
{stages}
  shuffle: {{buffer: 3}}
  batch: {{size: 2}}
  seed: 9
  epochs: 1
"#
    );
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    granary_crds::parse_manifest(&text, &base, &[]).unwrap_or_else(|p| panic!("{p:?}"))
}

fn ids(batches: &[Batch]) -> BTreeSet<i64> {
    batches
        .iter()
        .flat_map(|b| bytemuck::cast_slice::<u8, i64>(&b.tensor("id").unwrap().data).to_vec())
        .collect()
}

/// Runs with 1 and 2 threads, twice, checks all four agree and the counts match the batches;
/// returns the batches.
fn run_everywhere(m: &granary_crds::Manifest) -> Vec<Batch> {
    let engine = open(m, 1, 1 << 20);
    let (first, counts) = run(&engine);
    assert_counts_match_batches(&first, &counts, &engine);
    for threads in [2, 2, 1] {
        let (again, again_counts) = run(&open(m, threads, 1 << 20));
        assert_eq!(comparable(&again), comparable(&first), "threads {threads}");
        assert_eq!(again_counts, counts);
    }
    first
}

#[test]
fn text_length_in_chars_keeps_the_texts_within_bounds() {
    text_source("flt-chars", &TEXTS);
    let stages = "    - {op: filter, predicate: text.length, unit: chars, min: 5, max: 20}\n    - {op: table.select, columns: [id]}";
    let batches = run_everywhere(&text_manifest("flt-chars", stages, "chars"));
    let expected: BTreeSet<i64> = TEXTS
        .iter()
        .flat_map(|f| f.iter())
        .enumerate()
        .filter(|(_, t)| (5..=20).contains(&t.chars().count()))
        .map(|(i, _)| i as i64)
        .collect();
    // "ünïcödé wörds" is 13 characters (19 bytes); "" and "one" are too short.
    assert!(expected.contains(&2) && !expected.contains(&3) && !expected.contains(&1));
    assert_eq!(ids(&batches), expected);
}

fn token_count(text: &str) -> usize {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let root: PathBuf = base.clone();
    let ctx = BuildContext {
        base_dir: base,
        read: Box::new(move |p| std::fs::read(root.join(p)).map_err(|e| BuildError(format!("{p}: {e}")))),
        python: None,
    };
    let config =
        Tokenize { tokenizer: "wordpiece.json".into(), field: "text".into(), add_special_tokens: true };
    let op = TokenizeOp::new(&config, &ctx).unwrap();
    let mut el = Element::new("k");
    el.set("text", Value::Text(text.into()));
    op.apply(&mut el, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap();
    match el.get("input_ids") {
        Some(Value::Tensor(t)) => t.shape[0],
        other => panic!("no token ids: {other:?}"),
    }
}

#[test]
fn text_length_in_tokens_counts_the_ids_after_tokenize() {
    text_source("flt-tokens", &TEXTS);
    let stages = "    - {op: text.tokenize, tokenizer: wordpiece.json}\n    - {op: filter, predicate: text.length, unit: tokens, min: 4, max: 8}\n    - {op: text.truncate_pad, length: 8}";
    let batches = run_everywhere(&text_manifest("flt-tokens", stages, "tokens"));
    let counts: Vec<usize> = TEXTS.iter().flat_map(|f| f.iter()).map(|t| token_count(t)).collect();
    let expected: BTreeSet<i64> =
        counts.iter().enumerate().filter(|(_, c)| (4..=8).contains(*c)).map(|(i, _)| i as i64).collect();
    assert!(!expected.is_empty() && expected.len() < counts.len(), "token counts {counts:?}");
    assert_eq!(ids(&batches), expected, "token counts {counts:?}");
    for b in &batches {
        assert_eq!(b.tensor("input_ids").unwrap().shape, [b.len(), 8]);
    }
}

#[test]
fn a_filter_error_names_the_stage_and_the_element() {
    text_source("flt-error", &TEXTS);
    // `id` is a number: counting its characters is an error, not a drop.
    let stages = "    - {op: filter, name: short, predicate: text.length, unit: chars, field: id, max: 3}";
    let engine = open(&text_manifest("flt-error", stages, "error"), 2, 1 << 20);
    let error = engine.run_epoch(0).find_map(Result::err).map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("spec.stages[0] (`short`)"), "{error}");
    assert!(error.contains("failed on element `part-"), "{error}");
    assert!(error.contains("field `id`"), "{error}");
}

#[test]
fn a_size_filter_after_the_decode_joins_the_fast_path_and_drops_what_the_separate_stages_drop() {
    support::dataset("flt-fused", 32);
    let m = image_manifest(
        "flt-fused",
        "    - {op: filter, predicate: image.min_size, minWidth: 60, minHeight: 40}",
        4,
        "",
    );
    let fused = open(&m, 2, 1 << 20);
    assert_eq!(
        fused.stages()[0].0,
        "spec.stages[0..=3]",
        "decode, filter, crop and flip run as one: {:?}",
        fused.stages()
    );
    let separate = Engine::open(
        &m,
        EngineOptions {
            threads: 2,
            prefetch_bytes: 1 << 20,
            image_path: ImagePath::Separate,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(separate.stages().len(), 4);
    let (fast, fast_counts) = run(&fused);
    let (slow, slow_counts) = run(&separate);
    let order = |batches: &[Batch]| batches.iter().map(|b| b.keys.clone()).collect::<Vec<_>>();
    assert_eq!(order(&fast), order(&slow), "the same elements kept, in the same order");
    assert_eq!(fast_counts, slow_counts);
    let expected: BTreeSet<String> = (0..32)
        .filter(|&i| image_size(i).0 >= 60 && image_size(i).1 >= 40)
        .map(|i| format!("{i:05}.jpg"))
        .collect();
    assert_eq!(keys(&fast), expected);
    assert_eq!(comparable(&run(&open(&m, 1, 1 << 20)).0), comparable(&fast), "threads 1 and 2 agree");
}
