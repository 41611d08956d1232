//! `granary run` and `granary demo` as a user runs them: real processes, generated data.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn granary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_granary"))
}

/// Runs granary and returns stdout; panics with stderr on failure.
fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("granary runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn json_line(stdout: &str) -> Value {
    let line = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(line).expect("valid JSON")
}

fn examples() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples"))
}

fn demo_data(dir: &Path, images: usize) {
    ok(granary().args(["demo", "--no-run", "--images", &images.to_string(), "--dir"]).arg(dir));
}

#[test]
fn demo_generates_data_and_runs_every_example() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(granary().args(["demo", "--json", "--images", "96", "--dir"]).arg(dir.path()));
    let runs: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(runs.len(), 4, "{out}");
    let by_name =
        |n: &str| runs.iter().find(|r| r["pipeline"] == n).unwrap_or_else(|| panic!("{n} in {out}"));
    assert_eq!(by_name("imagenet-resnet50")["items"], 96);
    assert_eq!(by_name("imagenet-resnet50-uint8")["items"], 96);
    // 2048 lines in batches of 256 with dropRemainder: 8 batches.
    assert_eq!(by_name("bert-tokenize")["batches"], 8);
    assert_eq!(by_name("parquet-features")["items"], 4096);
}

#[test]
fn run_json_reports_epochs_and_is_deterministic_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 70);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let run = |threads: &str| {
        json_line(&ok(granary()
            .arg("run")
            .arg(examples().join("imagenet-resnet50.yaml"))
            .args(["--json", "--digest", "--epochs", "2", "--threads", threads])
            .args(["--set", &url, "--set", "spec.batch.size=16"])))
    };
    let one = run("1");
    let two = run("2");
    assert_eq!(one["items"], 140);
    assert_eq!(one["batches"], 10, "4 full + 1 partial per epoch");
    let epochs = one["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    assert_eq!(epochs[0]["items"], 70);
    for key in ["items", "batches", "seconds", "items_per_s"] {
        assert!(one.get(key).is_some(), "missing {key}");
    }
    let digests =
        |v: &Value| v["epochs"].as_array().unwrap().iter().map(|e| e["digest"].clone()).collect::<Vec<_>>();
    assert_eq!(digests(&one), digests(&two), "same batches with 1 and 2 threads");
    assert_ne!(digests(&one)[0], digests(&one)[1], "another epoch, another augmentation");
}

#[test]
fn limit_batches_stops_early() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 40);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let v = json_line(&ok(granary().arg("run").arg(examples().join("imagenet-resnet50.yaml")).args([
        "--json",
        "--limit-batches",
        "2",
        "--set",
        &url,
        "--set",
        "spec.batch.size=8",
    ])));
    assert_eq!(v["batches"], 2);
    assert_eq!(v["items"], 16);
}

#[test]
fn invalid_manifest_is_rejected_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let out = granary()
        .arg("run")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--set", "spec.batch.size=0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.batch.size"), "{stderr}");
}

/// A dataset ten times larger than `--prefetch-bytes` runs within budget + 256 MiB of peak RSS.
/// The JPEGs decode and augment into far more bytes than they occupy on disk (float32 224×224),
/// so an engine that did not bound its in-flight data would exceed the bound many times over.
#[test]
fn peak_rss_stays_within_prefetch_budget() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 1200);
    let dataset: u64 = std::fs::read_dir(dir.path().join("images/train"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let budget = dataset / 10;
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let v = json_line(&ok(granary()
        .arg("run")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--prefetch-bytes", &budget.to_string(), "--set", &url])
        .args(["--set", "spec.batch.size=32", "--set", "spec.shuffle.buffer=16"])));
    assert_eq!(v["items"], 1200);
    let peak = v["peak_rss_bytes"].as_u64().expect("VmHWM is reported on Linux");
    let output_bytes = v["bytes"].as_u64().unwrap();
    assert!(output_bytes > dataset * 5, "the test must move far more bytes than the budget");
    assert!(
        peak <= budget + (256 << 20),
        "peak RSS {} MiB exceeds budget {} MiB + 256 MiB (dataset {} MiB)",
        peak >> 20,
        budget >> 20,
        dataset >> 20
    );
}

#[test]
fn bench_reports_the_fast_path_and_its_same_run_ratios() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 48);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let out = ok(granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--warmup", "1", "--batches", "3", "--threads", "2"])
        .args(["--set", &url, "--set", "spec.batch.size=8"]));
    let r = json_line(&out);
    assert_eq!(r["system"], "granary");
    assert_eq!(r["pipeline"], "imagenet-resnet50");
    assert_eq!(r["config"], "float32");
    assert_eq!(r["batches"], 3);
    assert_eq!(r["items"], 24, "3 timed batches of 8");
    for key in
        ["items_per_s", "baseline_items_per_s", "decode_only_items_per_s", "vs_baseline", "vs_decode_only"]
    {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    assert!(r["cores"].as_u64().is_some_and(|c| c >= 1));

    // Text mode names the fused stages and prints the three figures.
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--warmup", "0", "--batches", "2", "--set", &url, "--set", "spec.batch.size=8"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.stages[0..=3]"), "{err}");
    assert!(
        text.contains("fast path") && text.contains("baseline") && text.contains("decode only"),
        "{text}"
    );
}

#[test]
fn bench_with_workers_measures_the_served_path_against_in_process() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 48);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let r = json_line(&ok(granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--workers", "1", "--warmup", "1", "--batches", "4", "--threads", "2"])
        .args(["--set", &url, "--set", "spec.batch.size=8"])));
    assert_eq!(r["transport"], "grpc-loopback");
    assert_eq!(r["service_workers"], 1);
    assert_eq!(r["items"], 32, "4 timed batches of 8");
    for key in ["items_per_s", "in_process_items_per_s", "vs_in_process", "mb_per_s", "wire_mb_per_s"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    // float32 is normalized by the client: the wire carries a quarter of the bytes.
    let ratio = r["wire_mb_per_s"].as_f64().unwrap() / r["mb_per_s"].as_f64().unwrap();
    assert!(ratio < 0.5, "wire/delivered = {ratio} in {r}");
    assert!(r.get("baseline_items_per_s").is_none(), "served mode skips the baselines: {r}");
}

#[test]
fn bench_rejects_zero_batches_and_bad_manifests() {
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--batches", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batches"));
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--set", "spec.batch.size=0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.batch.size"));
}
