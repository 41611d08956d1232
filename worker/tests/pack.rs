//! `text.pack` through the engine: JSONL documents tokenized by a byte-level BPE and packed into
//! rows. Per epoch, the tokens of the rows are exactly the tokenized corpus plus one `eos` per
//! document, each split's rows hold its documents in order, positions restart at every document
//! and count on across a row boundary, segment ids number the documents of each row, the
//! output is the same for any thread count, `SplitDone` counts rows, and the stages after the
//! pack run on the rows.

use bytes::Bytes;
use granary_crds::ops::Tokenize;
use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::ops::text::tokenize::TokenizeOp;
use granary_worker::ops::{BuildContext, BuildError, Operator};
use granary_worker::seed::SeededRng;
use granary_worker::store::memory_store;
use granary_worker::{Batch, DType, Element, Engine, EngineOptions, Value};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const LENGTH: usize = 16;
const EOS: i64 = 0;
const PAD: i64 = 7;

/// Three files (splits): an empty document, documents shorter than a row, and ones that span
/// several rows.
const TEXTS: [&[&str]; 3] = [
    &["a cat", "", "the quick brown fox jumps over the lazy dog and then the slow green turtle naps", "hi"],
    &[
        "one",
        "two words",
        "three little words are here and a much longer sentence about nothing in particular",
    ],
    &["tokens and more tokens", "", "", "ça va très bien", "the end of the corpus is near now"],
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

fn text_source(name: &str) {
    let store = memory_store(name);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for (f, lines) in TEXTS.iter().enumerate() {
        let body: String =
            lines.iter().map(|text| format!("{}\n", serde_json::json!({"text": text, "n": f}))).collect();
        rt.block_on(store.put(&StorePath::from(format!("text/part-{f}.jsonl")), Bytes::from(body).into()))
            .unwrap();
    }
}

fn manifest(name: &str, pack: &str, after: &str) -> granary_crds::Manifest {
    manifest_with(name, pack, after, "")
}

fn manifest_with(name: &str, pack: &str, after: &str, extra: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: packed}}
spec:
  source: {{url: "memory://{name}/text/", format: jsonl}}
  stages:
    - {{op: text.tokenize, tokenizer: bytelevel.json, addSpecialTokens: false}}
    - {{op: text.pack, length: {LENGTH}, eos: {EOS}, padId: {PAD}{pack}}}
{after}
  shuffle: {{buffer: 3}}
  batch: {{size: 4}}
  seed: 9
  epochs: 1
{extra}"#
    );
    granary_crds::parse_manifest(&text, &fixtures(), &[]).unwrap_or_else(|p| panic!("{p:?}"))
}

/// The token ids of `text`, as `text.tokenize` gives them.
fn tokens(text: &str) -> Vec<i64> {
    let base = fixtures();
    let root = base.clone();
    let ctx = BuildContext {
        base_dir: base,
        read: Box::new(move |p| std::fs::read(root.join(p)).map_err(|e| BuildError(format!("{p}: {e}")))),
        python: None,
    };
    let config =
        Tokenize { tokenizer: "bytelevel.json".into(), field: "text".into(), add_special_tokens: false };
    let op = TokenizeOp::new(&config, &ctx).unwrap();
    let mut el = Element::new("k");
    el.set("text", Value::Text(text.into()));
    op.apply(&mut el, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap();
    match el.get("input_ids") {
        Some(Value::Tensor(t)) => bytemuck::cast_slice::<u8, i64>(t.as_le_bytes()).to_vec(),
        other => panic!("no token ids: {other:?}"),
    }
}

fn open(manifest: &granary_crds::Manifest, threads: usize) -> Engine {
    let options = EngineOptions { threads, prefetch_bytes: 1 << 20, ..Default::default() };
    Engine::open(manifest, options).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs epoch 0: the batches and each split's `SplitDone` count by split index.
fn run(manifest: &granary_crds::Manifest, threads: usize) -> (Vec<Batch>, BTreeMap<usize, u64>) {
    let engine = open(manifest, threads);
    run_tasks(&engine, |_| CacheUse::Compute)
}

/// Runs epoch 0 with each split's cache use: the batches and each split's `SplitDone` count by
/// split index; fails on a cache entry that reads back bad.
fn run_tasks(engine: &Engine, cache: impl Fn(usize) -> CacheUse) -> (Vec<Batch>, BTreeMap<usize, u64>) {
    let tasks: Vec<Task> = engine
        .split_order(0)
        .into_iter()
        .map(|split| Task { epoch: 0, split, cache: cache(split), images_on_client: ClientShare::NONE })
        .collect();
    let mut batches = Vec::new();
    let mut counts = BTreeMap::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output.unwrap_or_else(|e| panic!("{e}")) {
            Output::Batch { batch, .. } => batches.push(batch),
            Output::SplitDone { task, elements, cache, .. } => {
                assert!(!cache.bad && cache.recomputed == 0, "split {}: {cache:?}", task.split);
                counts.insert(task.split, elements);
            }
        }
    }
    (batches, counts)
}

/// One row: input ids, positions, segments.
type Row = (Vec<i64>, Vec<i64>, Vec<i64>);

fn column(batch: &Batch, name: &str, i: usize) -> Vec<i64> {
    let t = batch.tensor(name).unwrap_or_else(|| panic!("no `{name}`"));
    assert_eq!(t.shape, [batch.len(), LENGTH], "{name}");
    let row = t.data.len() / batch.len();
    match t.dtype {
        DType::Int64 => bytemuck::cast_slice::<u8, i64>(&t.data[i * row..(i + 1) * row]).to_vec(),
        DType::Int32 => bytemuck::cast_slice::<u8, i32>(&t.data[i * row..(i + 1) * row])
            .iter()
            .map(|&v| v.into())
            .collect(),
        other => panic!("{name} is {other:?}"),
    }
}

/// Rows by split and row index, from their keys `split<N>#row<R>`.
fn rows(batches: &[Batch]) -> BTreeMap<(u64, u64), Row> {
    let mut out = BTreeMap::new();
    for b in batches {
        for (i, key) in b.keys.iter().enumerate() {
            let (split, row) =
                key.strip_prefix("split").and_then(|k| k.split_once("#row")).expect("a row key");
            let at = (split.parse().unwrap(), row.parse().unwrap());
            let row = (column(b, "input_ids", i), column(b, "position_ids", i), column(b, "segment_ids", i));
            assert!(out.insert(at, row).is_none(), "row {key} came twice");
        }
    }
    out
}

/// Checks the acceptance property on one epoch's rows; `drop_last` says whether the splits'
/// last partial rows were left out.
fn check(rows: &BTreeMap<(u64, u64), Row>, drop_last: bool) {
    let mut all_packed = Vec::new();
    let mut all_expected = Vec::new();
    for (f, texts) in TEXTS.iter().enumerate() {
        let split: Vec<&Row> = rows.range((f as u64, 0)..(f as u64 + 1, 0)).map(|(_, r)| r).collect();
        let row_indices: Vec<u64> =
            rows.range((f as u64, 0)..(f as u64 + 1, 0)).map(|((_, r), _)| *r).collect();
        assert_eq!(row_indices, (0..split.len() as u64).collect::<Vec<_>>(), "split {f}: rows 0, 1, ...");
        // The split's documents in order, each followed by eos, with each token's position.
        let docs: Vec<Vec<i64>> = texts.iter().map(|t| tokens(t)).collect();
        let expected: Vec<i64> = docs.iter().flat_map(|d| d.iter().copied().chain([EOS])).collect();
        let positions: Vec<i64> = docs.iter().flat_map(|d| 0..=d.len() as i64).collect();
        assert_eq!(
            split.len(),
            if drop_last { expected.len() / LENGTH } else { expected.len().div_ceil(LENGTH) }
        );
        let mut packed = Vec::new();
        let mut packed_positions = Vec::new();
        for (r, (ids, pos, seg)) in split.iter().enumerate() {
            assert_eq!((ids.len(), pos.len(), seg.len()), (LENGTH, LENGTH, LENGTH));
            let real = seg.iter().take_while(|s| **s != 0).count();
            // Only the split's last row has padding, and it is padId with position and segment 0.
            assert!(real == LENGTH || r + 1 == split.len(), "split {f} row {r}: padding inside the split");
            assert!(ids[real..].iter().all(|t| *t == PAD) && pos[real..].iter().all(|p| *p == 0));
            assert!(seg[real..].iter().all(|s| *s == 0));
            // Segments: 1 for the first (maybe continued) document, +1 at each document start.
            assert_eq!(seg[0], 1, "split {f} row {r}");
            for j in 1..real {
                assert_eq!(
                    seg[j],
                    seg[j - 1] + i64::from(pos[j] == 0),
                    "split {f} row {r} token {j}: {seg:?}"
                );
            }
            packed.extend_from_slice(&ids[..real]);
            packed_positions.extend_from_slice(&pos[..real]);
        }
        // Every token in order, positions restarting at 0 per document and counting on across
        // row boundaries.
        let n = packed.len();
        assert_eq!(packed, expected[..n], "split {f}");
        assert_eq!(packed_positions, positions[..n], "split {f}");
        if drop_last {
            assert_eq!(n, expected.len() / LENGTH * LENGTH);
        } else {
            assert_eq!(n, expected.len(), "split {f}: every token packed");
        }
        all_packed.extend(packed);
        all_expected.extend(expected);
    }
    if !drop_last {
        all_packed.sort_unstable();
        all_expected.sort_unstable();
        assert_eq!(all_packed, all_expected, "the epoch's tokens are the corpus plus one eos per document");
    }
}

/// Keys, and each tensor's name and bytes, of every batch in order.
type Comparable = Vec<(Vec<String>, Vec<(String, Vec<u8>)>)>;

fn comparable(batches: &[Batch]) -> Comparable {
    batches
        .iter()
        .map(|b| (b.keys.clone(), b.tensors.iter().map(|t| (t.name.clone(), t.data.clone())).collect()))
        .collect()
}

#[test]
fn an_epoch_holds_the_tokenized_corpus_plus_one_eos_per_document() {
    text_source("pack-corpus");
    let m = manifest("pack-corpus", "", "");
    assert!(
        TEXTS.iter().flat_map(|f| f.iter()).any(|t| tokens(t).len() > 2 * LENGTH),
        "a document spans rows"
    );
    let (batches, counts) = run(&m, 1);
    let rows = rows(&batches);
    check(&rows, false);
    for (split, count) in &counts {
        let made = rows.keys().filter(|(s, _)| *s == *split as u64).count() as u64;
        assert_eq!(*count, made, "split {split}: SplitDone counts its rows");
    }
    for threads in [2, 3] {
        let (again, again_counts) = run(&m, threads);
        assert_eq!(comparable(&again), comparable(&batches), "threads {threads}");
        assert_eq!(again_counts, counts);
    }
}

#[test]
fn last_row_drop_leaves_out_each_splits_partial_row() {
    text_source("pack-drop");
    let (batches, _) = run(&manifest("pack-drop", ", lastRow: drop", ""), 2);
    check(&rows(&batches), true);
}

#[test]
fn stages_after_the_pack_run_on_its_rows() {
    text_source("pack-after");
    let after = "    - {op: table.cast, columns: {segment_ids: int32}}";
    let (batches, _) = run(&manifest("pack-after", "", after), 2);
    assert!(batches.iter().all(|b| b.tensor("segment_ids").is_some_and(|t| t.dtype == DType::Int32)));
    check(&rows(&batches), false);
}

#[test]
fn a_cache_entry_before_the_pack_reads_back_as_the_same_rows() {
    text_source("pack-cache");
    let dir = tempfile::tempdir().unwrap();
    let cache = format!(
        "  cache:\n    policy: at\n    at: text.tokenize\n    store: \"file://{}/\"\n",
        dir.path().display()
    );
    let engine = open(&manifest_with("pack-cache", "", "", &cache), 2);
    let cuts: Vec<usize> = engine.cache().expect("the spec caches").cuts.iter().map(|c| c.index).collect();
    assert_eq!(cuts, [1], "the entry holds the tokenized documents, before the pack");
    let (computed, counts) = run_tasks(&engine, |_| CacheUse::Compute);
    let (written, written_counts) = run_tasks(&engine, |_| CacheUse::Write { cut: 1 });
    assert_eq!(comparable(&written), comparable(&computed));
    // A read is told the split's listed documents; the rows it makes are counted as computing
    // counts them.
    let (read, read_counts) =
        run_tasks(&engine, |s| CacheUse::Read { cut: 1, elements: TEXTS[s].len() as u64 });
    assert_eq!(comparable(&read), comparable(&computed));
    assert_eq!((&written_counts, &read_counts), (&counts, &counts));
    check(&rows(&read), false);
}
