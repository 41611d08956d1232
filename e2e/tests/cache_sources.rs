//! Caching a mixed pipeline end to end: `granary run` (dispatcher in process, a worker process)
//! over two JSONL sources mixed by weight, the smaller one upsampled, with a `file://` cache.
//!
//! - With `policy: at` every source split is written once, into its own source's entry, and
//!   read in the later epochs (further passes of the upsampled source included), delivering
//!   every epoch whole and exactly what `policy: never` delivers.
//! - A pipeline reading one of the sources alone afterwards reads the mixed run's entry of it
//!   and writes nothing.

use granary_e2e::*;
use granary_store::cache::{CacheStore, Fingerprint};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const EPOCHS: usize = 4;
/// Elements per mixed epoch: `code` (90 elements) is drawn about three times over.
const ELEMENTS: u64 = 600;
const WEB_FILES: u64 = 6;
const CODE_FILES: u64 = 3;
/// Epochs of the pipeline reading `code` alone: enough to outlast its own cache profile.
const ALONE_EPOCHS: usize = 8;

/// `files` JSONL files `{prefix}-NNN.jsonl` of `lines` records each in `dir`, their `x` from
/// `salt` up.
fn write_source(dir: &Path, prefix: &str, files: u64, lines: u64, salt: u64) -> PathBuf {
    std::fs::create_dir_all(dir).expect("source folder");
    for f in 0..files {
        let text: String = (0..lines)
            .map(|i| format!("{{\"x\": {}, \"src\": \"{prefix}\"}}\n", salt + f * 1000 + i))
            .collect();
        std::fs::write(dir.join(format!("{prefix}-{f:03}.jsonl")), text).expect("source file");
    }
    dir.to_path_buf()
}

/// The stages every pipeline here runs; `sel` ends the deterministic prefix. The sleep makes an
/// epoch that computes outlast the cache profile, measured beside the first splits.
const STAGES: &str = "  stages:
    - {op: test.sleep, ms: 5}
    - {op: table.select, columns: [x], name: sel}
  shuffle: {buffer: 16}
  batch: {size: 50}
  seed: 7
";

fn url(dir: &Path) -> String {
    format!("file://{}/", dir.display())
}

fn cache(policy: &str, store: &Path) -> String {
    let at = if policy == "at" { "    at: sel\n" } else { "" };
    format!("  cache:\n    policy: {policy}\n{at}    store: '{}'\n", url(store))
}

fn write_manifest(dir: &Path, name: &str, sources: &str, epochs: usize, cache: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: {name}}}
spec:
{sources}{STAGES}  epochs: {epochs}
{cache}"
    );
    std::fs::write(&path, text).expect("manifest");
    path
}

fn mixed(dir: &Path, name: &str, web: &Path, code: &Path, cache: &str) -> PathBuf {
    let sources = format!(
        "  sources:
    - {{name: web, url: '{}', format: jsonl, weight: 0.6}}
    - {{name: code, url: '{}', format: jsonl, weight: 0.4}}
  mixing: {{stop: elements, elements: {ELEMENTS}, block: 8}}
",
        url(web),
        url(code)
    );
    write_manifest(dir, name, &sources, EPOCHS, cache)
}

fn single(dir: &Path, name: &str, source: &Path, cache: &str) -> PathBuf {
    let sources = format!("  source: {{url: '{}', format: jsonl}}\n", url(source));
    write_manifest(dir, name, &sources, ALONE_EPOCHS, cache)
}

/// `granary run MANIFEST --json --digest --workers 1`: the summary.
fn run(manifest: &Path) -> Value {
    let output = Command::new(granary_bin())
        .arg("run")
        .arg(manifest)
        .args(["--json", "--digest", "--workers", "1", "--threads", "2"])
        .stderr(Stdio::inherit())
        .output()
        .expect("granary run starts");
    assert!(output.status.success(), "granary run failed: {}", String::from_utf8_lossy(&output.stdout));
    serde_json::from_slice(&output.stdout).expect("one JSON summary")
}

fn epochs(summary: &Value) -> &Vec<Value> {
    summary["epochs"].as_array().expect("epochs")
}

fn field(summary: &Value, name: &str) -> Vec<Value> {
    epochs(summary).iter().map(|e| e[name].clone()).collect()
}

/// Per epoch of the cache report: `name` (a split count).
fn splits(summary: &Value, name: &str) -> Vec<u64> {
    let report = summary["cache"]["epochs"].as_array().expect("cache epochs");
    report.iter().map(|e| e[name].as_u64().unwrap_or(0)).collect()
}

/// (source URL, published splits, splits the entry's source lists) of every entry.
fn entries(store: &Path) -> Vec<(String, u64, u64)> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = CacheStore::open(&url(store)).expect("cache store");
    let mut out: Vec<(String, u64, u64)> = rt
        .block_on(store.list_entries())
        .expect("entries")
        .into_iter()
        .map(|e| {
            let fp = Fingerprint::parse(&e.fingerprint).expect("fingerprint");
            let done = rt.block_on(store.completed_splits(&fp)).expect("completed splits");
            let info = e.info.expect("entry.json");
            (info.source_url, done.len() as u64, info.splits_total)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_mixed_pipeline_caches_per_source_and_a_single_source_pipeline_reads_its_entry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let web = write_source(&dir.path().join("web"), "web", WEB_FILES, 50, 0);
    let code = write_source(&dir.path().join("code"), "code", CODE_FILES, 30, 1_000_000);
    let store = dir.path().join("cache");
    std::fs::create_dir_all(&store).expect("cache folder");

    let cached = run(&mixed(dir.path(), "mixed", &web, &code, &cache("at", &store)));
    let computed = run(&mixed(dir.path(), "mixed-never", &web, &code, "  cache: {policy: never}\n"));
    // Every epoch whole, and element for element what computing delivers.
    assert_eq!(field(&cached, "items"), vec![Value::from(ELEMENTS); EPOCHS], "{cached}");
    assert_eq!(field(&cached, "digest"), field(&computed, "digest"));
    // Each source split written once (splits leased before the decision compute, and are
    // written in a later epoch); the last epoch only reads, further passes of `code` included.
    assert_eq!(splits(&cached, "splits_written").iter().sum::<u64>(), WEB_FILES + CODE_FILES, "{cached}");
    assert_eq!(splits(&cached, "splits_bad").iter().sum::<u64>(), 0, "{cached}");
    let last = EPOCHS - 1;
    assert_eq!(
        (splits(&cached, "splits_computed")[last], splits(&cached, "splits_written")[last]),
        (0, 0),
        "{cached}"
    );
    assert!(splits(&cached, "splits_read")[last] > WEB_FILES + CODE_FILES, "passes read: {cached}");
    assert_eq!(field(&cached, "cache")[last], "read", "{cached}");
    let sources = &cached["cache"]["sources"];
    assert_eq!(sources.as_array().map(Vec::len), Some(2), "{cached}");
    let web_entry = (url(&web), WEB_FILES, WEB_FILES);
    let code_entry = (url(&code), CODE_FILES, CODE_FILES);
    assert_eq!(entries(&store), vec![code_entry.clone(), web_entry.clone()], "one entry per source");

    // `code` alone: the same entry, complete, so it reads from its decision on.
    let alone = run(&single(dir.path(), "code", &code, &cache("at", &store)));
    let alone_computed = run(&single(dir.path(), "code-never", &code, "  cache: {policy: never}\n"));
    assert_eq!(field(&alone, "digest"), field(&alone_computed, "digest"));
    assert_eq!(field(&alone, "items"), vec![Value::from(CODE_FILES * 30); ALONE_EPOCHS]);
    assert_eq!(splits(&alone, "splits_written"), vec![0; ALONE_EPOCHS], "{alone}");
    assert_eq!(splits(&alone, "splits_read")[ALONE_EPOCHS - 1], CODE_FILES, "{alone}");
    assert_eq!(alone["cache"]["fingerprint"], sources[1]["fingerprint"], "{alone}");
    assert_eq!(entries(&store), vec![code_entry, web_entry], "nothing new was written");
}
