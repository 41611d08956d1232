//! `granary bench --workers 1 --tls`: the served path measured plaintext and with TLS in one
//! run, on a few generated images.

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

fn manifest() -> std::path::PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/imagenet-resnet50-uint8.yaml")).to_path_buf()
}

/// Generates 24 small images and returns the `--set` pointing the manifest at them (as files).
fn data(dir: &Path) -> Vec<String> {
    ok(granary().args(["demo", "--no-run", "--images", "24", "--dir"]).arg(dir));
    vec![
        "--set".into(),
        format!("spec.source.url=file://{}/images/train/", dir.display()),
        "--set".into(),
        "spec.source.format=files".into(),
        "--set".into(),
        "spec.batch.size=4".into(),
    ]
}

#[test]
fn bench_tls_reports_both_paths_the_handshake_and_the_cpu_cost() {
    let dir = tempfile::tempdir().unwrap();
    let set = data(dir.path());
    let out = ok(granary()
        .arg("bench")
        .arg(manifest())
        .args(["--json", "--tls", "--workers", "1", "--warmup", "1", "--batches", "4", "--threads", "1"])
        .args(&set));
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
    let out = ok(granary()
        .arg("bench")
        .arg(manifest())
        .args(["--tls", "--workers", "1", "--warmup", "0", "--batches", "2", "--threads", "1"])
        .args(&set));
    assert!(out.contains("served, TLS") && out.contains("× plaintext"), "{out}");
    assert!(out.contains("handshake") && out.contains("to a worker"), "{out}");
}

#[test]
fn tls_needs_workers() {
    let out = granary().arg("bench").arg(manifest()).arg("--tls").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"), "{out:?}");
}
