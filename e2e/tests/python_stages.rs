//! `python.map` across real processes: a random function gives the same data after a worker is
//! killed and its splits replayed (exactly once), a deterministic one is cached once and read
//! after, and one that crashes fails the pipeline after 3 attempts with the cause.
//!
//! The Python comes from `GRANARY_PYTHON` (scripts/test makes a venv with NumPy).

use granary_e2e::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);

/// Puts the test functions beside `manifest`, where its stages import them from.
fn with_functions(manifest: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/augment.py");
    let dir = manifest.parent().expect("manifest folder");
    std::fs::copy(source, dir.join("augment.py")).expect("copy augment.py");
}

/// Per (epoch, key), the digest of the element's data.
fn rows(seen: &[Seen]) -> BTreeMap<(u32, String), String> {
    let mut out = BTreeMap::new();
    for s in seen {
        assert_eq!(s.rows.len(), s.keys.len(), "a row digest per key");
        for (k, r) in s.keys.iter().zip(&s.rows) {
            out.insert((s.epoch, k.clone()), r.clone());
        }
    }
    out
}

#[test]
fn a_random_function_replays_the_same_data_after_a_worker_is_killed() {
    let normalize = "    - {op: image.normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}\n";
    let stages =
        format!("    - {{op: python.map, function: 'augment:jitter', args: {{strength: 0.4}}}}\n{normalize}");
    let data = dataset_with(240, 8, 16, 1, &stages);
    with_functions(&data.manifest);

    // Undisturbed: one worker.
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal-a"));
    let _w = start_worker(&d.address);
    let mut calm = start_consumer(&d.address, &["--rows"]);
    assert!(calm.finish(LONG), "the undisturbed consumer did not finish");
    assert_exactly_once(&calm.seen, &data.keys, 1);
    drop((d, _w));

    // Two workers, one killed mid-epoch: its splits are replayed on the other.
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal-b"));
    let workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
    let mut c = start_consumer(&d.address, &["--rows", "--step-ms", "5"]);
    c.collect(6, LONG);
    workers[1].signal(libc::SIGKILL);
    assert!(c.finish(LONG), "the consumer did not finish after a worker was killed");
    assert_exactly_once(&c.seen, &data.keys, 1);
    let (calm, killed) = (rows(&calm.seen), rows(&c.seen));
    assert_eq!(calm.len(), data.keys.len());
    let differing: Vec<_> = calm.iter().filter(|(k, v)| killed.get(*k) != Some(*v)).map(|(k, _)| k).collect();
    assert!(differing.is_empty(), "{} elements differ after the replay: {differing:?}", differing.len());
}

#[test]
fn a_deterministic_function_is_cached_once_and_read_after() {
    let stages =
        "    - {op: python.map, name: invert, function: 'augment:invert_slowly', deterministic: true}\n";
    let data = dataset_with(32, 4, 4, 4, "");
    with_functions(&data.manifest);
    // Right after the decode, before the random crop: in the deterministic prefix.
    let text = std::fs::read_to_string(&data.manifest).expect("manifest");
    let text = text.replace("    - op: image.decode\n", &format!("    - op: image.decode\n{stages}"));
    let cache = data.dir.path().join("cache");
    let run = |policy: &str, name: &str| {
        let manifest = data.dir.path().join(format!("{name}.yaml"));
        let at = if policy == "at" { "    at: invert\n" } else { "" };
        let body = format!(
            "{}  cache:\n    policy: {policy}\n{at}    store: 'file://{}/'\n",
            text.replace("name: e2e", &format!("name: {name}")),
            cache.display()
        );
        std::fs::write(&manifest, body).expect("manifest");
        let output = Command::new(granary_bin())
            .arg("run")
            .arg(&manifest)
            .args(["--json", "--digest", "--workers", "1", "--threads", "2"])
            .stderr(Stdio::inherit())
            .output()
            .expect("granary run starts");
        assert!(output.status.success(), "granary run failed: {}", String::from_utf8_lossy(&output.stdout));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("a JSON summary")
    };
    let summary = |s: &serde_json::Value, field: &str| -> Vec<String> {
        s["epochs"].as_array().expect("epochs").iter().map(|e| e[field].to_string()).collect()
    };
    let cached = run("at", "cached");
    // Each split is written once (the first splits compute while the profile is measured, so
    // writing may spill into epoch 1), and every later epoch only reads.
    let per_epoch = cached["cache"]["epochs"].as_array().expect("cache epochs");
    let count = |e: &serde_json::Value, f: &str| e[f].as_u64().unwrap_or(0);
    let splits = 8;
    assert_eq!(per_epoch.iter().map(|e| count(e, "splits_written")).sum::<u64>(), splits, "{cached}");
    let last = &per_epoch[per_epoch.len() - 1];
    assert_eq!((count(last, "splits_read"), count(last, "splits_computed")), (splits, 0), "{cached}");
    assert_eq!(summary(&cached, "cache").last().map(String::as_str), Some("\"read\""), "{cached}");
    let computed = run("never", "computed");
    assert_eq!(
        summary(&cached, "digest"),
        summary(&computed, "digest"),
        "reading gives what computing gives"
    );
}

/// `granary run` of a dataset with `stage`, which must fail; its standard error.
fn failing_run(stage: &str) -> String {
    let data = dataset_with(16, 4, 8, 1, stage);
    with_functions(&data.manifest);
    let output = Command::new(granary_bin())
        .arg("run")
        .arg(&data.manifest)
        .args(["--workers", "1", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("granary run starts");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("failed 3 times"), "{stderr}");
    stderr
}

#[test]
fn a_crashing_function_fails_the_pipeline_after_three_attempts() {
    let stderr = failing_run("    - {op: python.map, function: 'augment:crash'}\n");
    assert!(stderr.contains("`augment:crash` died"), "{stderr}");
    assert!(stderr.contains("SIGSEGV"), "{stderr}");
}

#[test]
fn a_function_that_does_not_import_fails_the_pipeline_with_the_reason() {
    let stderr = failing_run("    - {op: python.map, function: 'augment:missing'}\n");
    assert!(stderr.contains("spec.stages[3].function: `augment` ("), "{stderr}");
    assert!(stderr.contains("has no `missing`"), "{stderr}");
}
