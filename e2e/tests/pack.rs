//! `text.pack` served by two worker processes to two data-parallel consumers on 127.0.0.1: the
//! dispatcher learns each split's row count once a worker has packed it, every row arrives
//! exactly once per epoch in equal batch counts, and each row is byte for byte the row the
//! in-process engine packs for that key (a split packed on either worker makes the same rows).

use granary_e2e::*;
use granary_worker::executor::{Output, Task};
use granary_worker::{Engine, EngineOptions};
use sha2::Digest;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);
const LENGTH: usize = 32;
const BATCH: usize = 4;
const EPOCHS: u32 = 2;

const WORDS: [&str; 12] =
    ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "ça", "très", "bien", "tokens"];

/// `files` JSONL files of documents from a few words up to several rows long, some empty.
fn write_documents(dir: &Path, files: usize, docs: usize) {
    for f in 0..files {
        let text: String = (0..docs)
            .map(|d| {
                let n = (f * 31 + d * 17) % 60;
                let words: Vec<&str> = (0..n).map(|w| WORDS[(f + d * 5 + w * 7) % WORDS.len()]).collect();
                format!("{}\n", serde_json::json!({"text": words.join(" "), "doc": d}))
            })
            .collect();
        std::fs::write(dir.join(format!("part-{f:03}.jsonl")), text).expect("source file");
    }
}

fn packed_pipeline() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("text");
    std::fs::create_dir_all(&data).expect("data folder");
    write_documents(&data, 6, 24);
    let tokenizer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../worker/tests/fixtures/tokenizer/bytelevel.json");
    std::fs::copy(&tokenizer, dir.path().join("bytelevel.json")).expect("tokenizer");
    let manifest = dir.path().join("pipeline.yaml");
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: jsonl}}
  stages:
    - {{op: text.tokenize, tokenizer: '{}', addSpecialTokens: false}}
    - {{op: text.pack, length: {LENGTH}, eos: 0, padId: 0}}
  shuffle: {{buffer: 8}}
  batch: {{size: {BATCH}}}
  seed: 11
  epochs: {EPOCHS}
",
        data.display(),
        dir.path().join("bytelevel.json").display()
    );
    std::fs::write(&manifest, text).expect("manifest");
    (dir, manifest)
}

/// Each row's digest by key, as the in-process engine packs epoch 0; digests as the consumer's
/// `--rows` computes them (every tensor's name and the row's bytes, tensors in order).
fn engine_rows(manifest: &Path) -> BTreeMap<String, String> {
    let m = granary_crds::load_manifest(manifest, &[]).unwrap_or_else(|p| panic!("{p:?}"));
    let engine = Engine::open(&m, EngineOptions { threads: 2, ..Default::default() }).expect("engine");
    let tasks: Vec<Task> = engine.split_order(0).into_iter().map(|s| Task::compute(0, s)).collect();
    let mut rows = BTreeMap::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        let Output::Batch { batch, .. } = output.expect("the engine runs") else { continue };
        for (i, key) in batch.keys.iter().enumerate() {
            let mut hash = sha2::Sha256::new();
            for t in &batch.tensors {
                let row = t.data.len() / batch.keys.len();
                hash.update(t.name.as_bytes());
                hash.update(&t.data[i * row..(i + 1) * row]);
            }
            let digest: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
            assert!(rows.insert(key.clone(), digest).is_none(), "{key} twice");
        }
    }
    rows
}

#[test]
fn packed_rows_arrive_once_each_as_the_engine_packs_them_through_two_workers() {
    let (dir, manifest) = packed_pipeline();
    let expected = engine_rows(&manifest);
    assert!(expected.len() > 6 * 2, "several rows per split: {}", expected.len());
    let d = start_dispatcher(&manifest, "127.0.0.1:0", &dir.path().join("journal"));
    let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
    let mut a = start_consumer(&d.address, &["--index", "0", "--consumers", "2", "--rows"]);
    let mut b = start_consumer(&d.address, &["--index", "1", "--consumers", "2", "--rows"]);
    assert!(a.finish(LONG), "consumer 0 did not finish");
    assert!(b.finish(LONG), "consumer 1 did not finish");
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_exactly_once(a.seen.iter().chain(&b.seen), &keys, EPOCHS);
    for epoch in 0..EPOCHS {
        let na = a.seen.iter().filter(|s| s.epoch == epoch).count();
        let nb = b.seen.iter().filter(|s| s.epoch == epoch).count();
        assert_eq!(na, nb, "epoch {epoch}: consumers got {na} and {nb} batches");
        assert_eq!(na, keys.len().div_ceil(BATCH).div_ceil(2), "epoch {epoch}: batches per consumer");
    }
    for seen in a.seen.iter().chain(&b.seen) {
        assert_eq!(seen.rows.len(), seen.keys.len());
        for (key, digest) in seen.keys.iter().zip(&seen.rows) {
            assert_eq!(
                Some(digest),
                expected.get(key),
                "epoch {}: row {key} differs from the engine's",
                seen.epoch
            );
        }
    }
}
