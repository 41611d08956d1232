//! `granary bench --workers 1` with `--tls` (the served path measured plaintext and with TLS in
//! one run) and with `--trainers` (one trainer against several reading at once), on a few
//! generated images.

mod support;

use serde_json::Value;
use std::path::Path;

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/imagenet-resnet50-uint8.yaml");

/// Generates 24 small images and returns the `--set` pointing the manifest at them (as files).
fn data(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    support::succeed("demo", &["--no-run", "--images", "24", "--dir", &dir]);
    vec![
        "--set".into(),
        format!("spec.source.url=file://{dir}/images/train/"),
        "--set".into(),
        "spec.source.format=files".into(),
        "--set".into(),
        "spec.batch.size=4".into(),
    ]
}

/// `granary bench MANIFEST FLAGS… SET…`, which must succeed; its stdout.
fn bench(flags: &[&str], set: &[String]) -> String {
    let mut args = vec![MANIFEST];
    args.extend_from_slice(flags);
    args.extend(set.iter().map(String::as_str));
    support::succeed("bench", &args)
}

#[test]
fn bench_tls_reports_both_paths_the_handshake_and_the_cpu_cost() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let out = bench(
        &["--json", "--tls", "--workers", "1", "--warmup", "1", "--batches", "4", "--threads", "1"],
        &set,
    );
    let r: Value = serde_json::from_str(out.lines().last().expect("a JSON line")).expect("JSON");
    assert_eq!(r["transport"], "grpc-loopback");
    // Two rounds of each kind, each timing half of the 4 batches of 4.
    assert_eq!(r["items"], 16, "{r}");
    for key in ["items_per_s", "tls_items_per_s", "tls_vs_plain", "tls_mb_per_s", "tls_handshake_ms"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    assert!(r["tls_worker_handshake_ms"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    assert!(r["plain_connect_ms"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    for key in ["cpu_s_per_gb", "tls_cpu_s_per_gb", "tls_extra_cpu_s_per_gb"] {
        assert!(r[key].is_number(), "{key} in {r}");
    }
    assert!(r["cpu_s_per_gb"].as_f64().is_some_and(|v| v >= 0.0), "{r}");
}

#[test]
fn bench_tls_text_names_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let out = bench(&["--tls", "--workers", "1", "--warmup", "0", "--batches", "2", "--threads", "1"], &set);
    assert!(out.contains("served, TLS") && out.contains("× plaintext"), "{out}");
    assert!(out.contains("handshake") && out.contains("to a worker"), "{out}");
}

#[test]
fn tls_needs_workers() {
    let out = support::granary("bench", &[MANIFEST, "--tls"]);
    assert!(!out.status.success());
    assert!(support::text(&out.stderr).contains("--workers"), "{out:?}");
}

#[test]
fn bench_trainers_reports_the_aggregate_the_waits_and_the_workers_memory() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let flags = [
        "--json",
        "--trainers",
        "3",
        "--workers",
        "1",
        "--warmup",
        "1",
        "--batches",
        "6",
        "--threads",
        "1",
        "--stall-seconds",
        "0.5",
    ];
    let r: Value =
        serde_json::from_str(bench(&flags, &set).lines().last().expect("a JSON line")).expect("JSON");
    // The headline is one trainer's: two rounds, each timing half of the 6 batches of 4.
    assert_eq!((r["trainers"].as_u64(), r["items"].as_u64()), (Some(3), Some(24)), "{r}");
    for key in ["items_per_s", "trainers_items_per_s", "trainers_vs_one", "trainers_mb_per_s"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    for key in
        ["next_wait_p50_ms", "next_wait_p99_ms", "trainers_next_wait_p50_ms", "trainers_next_wait_p99_ms"]
    {
        assert!(r[key].as_f64().is_some_and(|v| v >= 0.0), "{key} in {r}");
    }
    assert!(r["trainers_next_wait_p99_ms"].as_f64() >= r["trainers_next_wait_p50_ms"].as_f64(), "{r}");
    for key in ["worker_cpu_s_per_gb", "trainers_worker_cpu_s_per_gb"] {
        assert!(r[key].as_f64().is_some_and(|v| v >= 0.0), "{key} in {r}");
    }
    assert!(r["worker_cpu_s_per_gb"].as_f64() <= r["cpu_s_per_gb"].as_f64(), "the workers' share: {r}");
    // A worker process holds at least its binary and a decoded image.
    assert!(r["worker_peak_rss_bytes"].as_u64().is_some_and(|b| b > 1 << 20), "{r}");
    // One compute thread per worker (`--threads 1`): all of it.
    assert_eq!(r["worker_peak_rss_bytes_per_core"], r["worker_peak_rss_bytes"], "{r}");
    assert_eq!(r["stall_seconds"].as_f64(), Some(0.5), "{r}");
}

#[test]
fn bench_trainers_text_names_the_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let out = bench(
        &["--trainers", "2", "--workers", "1", "--warmup", "0", "--batches", "2", "--threads", "1"],
        &set,
    );
    assert!(out.contains("2 trainers") && out.contains("× one trainer"), "{out}");
    assert!(out.contains("wait in next()") && out.contains("peak resident memory of a worker"), "{out}");
}

#[test]
fn trainers_need_workers_and_do_not_mix_with_tls_and_bad_stalls_are_refused() {
    let out = support::granary("bench", &[MANIFEST, "--trainers", "2"]);
    assert!(!out.status.success());
    assert!(support::text(&out.stderr).contains("--workers"), "{out:?}");
    let out = support::granary("bench", &[MANIFEST, "--trainers", "2", "--workers", "1", "--tls"]);
    assert!(!out.status.success());
    assert!(support::text(&out.stderr).contains("--tls"), "{out:?}");
    for bad in ["-1", "nan", "7200"] {
        let flag = format!("--stall-seconds={bad}");
        let out = support::granary("bench", &[MANIFEST, "--workers", "1", &flag]);
        assert!(!out.status.success(), "{bad}");
        let err = support::text(&out.stderr);
        assert!(err.contains("--stall-seconds") && err.contains("seconds"), "{bad}: {err}");
    }
}

#[test]
fn bench_steps_report_the_rate_against_the_steps_bound() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let flags =
        ["--json", "--workers", "1", "--warmup", "1", "--batches", "4", "--threads", "1", "--step-ms", "20"];
    let r: Value =
        serde_json::from_str(bench(&flags, &set).lines().last().expect("a JSON line")).expect("JSON");
    assert_eq!(r["step_ms"].as_f64(), Some(20.0), "{r}");
    // A batch every 20 ms at most: 50 batches/s. A trainer can read no faster than its steps.
    let bound = r["vs_step_bound"].as_f64().expect("vs_step_bound");
    assert!(bound > 0.0 && bound <= 1.05, "{r}");
    let batches = r["batches"].as_f64().expect("batches") / r["seconds"].as_f64().expect("seconds");
    assert!((batches / 50.0 - bound).abs() < 0.01, "the ratio is the batches a second over 50: {r}");
    // The gap's parts: how late the steps ended, and the wait in next().
    for key in ["step_overrun_ms", "next_wait_mean_ms"] {
        assert!(r[key].as_f64().is_some_and(|ms| ms >= 0.0), "{key}: {r}");
    }

    let text = bench(
        &["--workers", "1", "--warmup", "0", "--batches", "2", "--threads", "1", "--step-ms", "5"],
        &set,
    );
    assert!(text.contains("batches/s that 5 ms steps allow"), "{text}");
    assert!(text.contains("a step ran late on average"), "{text}");
    for bad in ["-1", "nan", "3600001"] {
        let flag = format!("--step-ms={bad}");
        let out = support::granary("bench", &[MANIFEST, "--workers", "1", &flag]);
        assert!(!out.status.success(), "{bad}");
        assert!(support::text(&out.stderr).contains("milliseconds"), "{bad}");
    }
    let out = support::granary("bench", &[MANIFEST, "--step-ms", "20"]);
    assert!(!out.status.success() && support::text(&out.stderr).contains("--workers"), "{out:?}");
}
