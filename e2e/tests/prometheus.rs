//! Observability end to end, against Debian's Prometheus on 127.0.0.1: `granary run --serve` with
//! two worker processes (a caching, autoscaled pipeline) and a trainer that computes 60 ms a
//! step; Prometheus finds every process through the dispatcher's `/targets` and scrapes each
//! every second. Then:
//!
//! - every PromQL expression of every dashboard panel, annotation and variable, and the signal
//!   of every alert rule, returns data over the run, except those listed in [`ALLOWED_EMPTY`]
//!   with the reason;
//! - `promtool check metrics` passes on every process' `/metrics`.
//!
//! The Prometheus binary is `GRANARY_PROMETHEUS`, else `/usr/bin/prometheus`, else on `PATH`
//! (scripts/test installs Debian's package); promtool likewise with `GRANARY_PROMTOOL`.

use granary_e2e::prometheus::{Prometheus, alert_signals, dashboard_exprs, now, substitute, tool};
use granary_e2e::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Expressions that may return nothing on this machine, with the reason.
const ALLOWED_EMPTY: [(&str, &str); 1] = [(
    "granary_operator_",
    "the operator's own series exist only under `granary operator`, which needs a Kubernetes API \
     server; the control-plane suite checks them there",
)];

/// `granary run --serve` stopped with SIGTERM on drop, so that it stops its worker processes
/// (a kill would leave them running).
struct Service(Dispatcher);

impl Drop for Service {
    fn drop(&mut self) {
        self.0.proc.signal(libc::SIGTERM);
        if !self.0.proc.wait_for(Duration::from_secs(30)) {
            eprintln!("granary run did not stop within 30 s of SIGTERM; killing it");
        }
    }
}

/// Writes the demo images' manifest: a cached prefix (`at: crop`), autoscaled 2..3 workers.
fn manifest(data: &Dataset, store: &Path) -> PathBuf {
    let train = data.dir.path().join("images/train");
    let path = data.dir.path().join("observed.yaml");
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: files, labels: ../labels.jsonl, filesPerSplit: 4}}
  stages:
    - op: image.decode
    - {{op: image.resize, size: 40}}
    - {{op: image.center_crop, size: 32, name: crop}}
    - {{op: image.flip, p: 0.5}}
  shuffle: {{buffer: 8}}
  batch: {{size: 4}}
  seed: 5
  epochs: 3
  scaling: {{minWorkers: 2, maxWorkers: 3}}
  cache:
    policy: at
    at: crop
    store: 'file://{}/'
",
        train.display(),
        store.display()
    );
    std::fs::write(&path, text).expect("manifest");
    path
}

#[test]
fn every_dashboard_and_alert_query_returns_data_from_a_real_run() {
    let data = dataset(96, 4, 4, 1);
    let store = data.dir.path().join("cache");
    std::fs::create_dir_all(&store).expect("cache folder");
    let manifest = manifest(&data, &store);
    let metrics = format!("127.0.0.1:{}", free_port());
    let d = Service(start_dispatcher_with(
        &manifest,
        "127.0.0.1:0",
        &data.dir.path().join("journal"),
        &["--metrics-addr", &metrics, "--policy-period", "1", "--threads", "1"],
    ));
    let prometheus = Prometheus::start(&metrics);
    // The dispatcher and both workers, scraped.
    let start = Instant::now();
    while prometheus.up() < 3 {
        assert!(start.elapsed() < Duration::from_secs(60), "Prometheus did not scrape 3 targets in 60 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    let began = now() - 5.0;
    let mut c = start_consumer(&d.0.address, &["--step-ms", "60"]);
    // While the workers serve: once the epochs are complete the pool releases them.
    c.collect(4, Duration::from_secs(60));
    lint_every_target(&metrics);
    assert!(c.finish(Duration::from_secs(120)), "the consumer did not finish");
    assert_exactly_once(&c.seen, &data.keys, 3);
    // The last heartbeats and a few scrapes after them.
    std::thread::sleep(Duration::from_secs(4));
    let ended = now();

    let mut problems = Vec::new();
    let mut checked = 0;
    let mut empty = Vec::new();
    for (place, expr) in dashboard_exprs().into_iter().chain(alert_signals()) {
        let query = substitute(&expr);
        let allowed = ALLOWED_EMPTY.iter().find(|(marker, _)| query.contains(marker));
        match prometheus.query_range(&query, began, ended) {
            Err(e) => problems.push(format!("{place}: Prometheus refused `{query}`: {e}")),
            Ok(0) if let Some((_, why)) = allowed => empty.push(format!("{place}: {why}")),
            Ok(0) => problems.push(format!("{place}: no data for `{query}`")),
            Ok(_) => checked += 1,
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    assert!(checked >= 60, "only {checked} expressions returned data");
    eprintln!(
        "{checked} dashboard and alert expressions returned data; {} allowed to be empty:\n{}",
        empty.len(),
        empty.join("\n")
    );
}

/// promtool's lint on every process Prometheus scrapes now: the dispatcher and both workers.
fn lint_every_target(metrics: &str) {
    let targets: Value = serde_json::from_str(&get(metrics, "/targets")).expect("http_sd JSON");
    let targets: Vec<String> = targets[0]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect();
    assert_eq!(targets.len(), 3, "the dispatcher and two workers: {targets:?}");
    for target in targets {
        let body = scrape(&target);
        let mut promtool = Command::new(tool("GRANARY_PROMTOOL", "promtool"))
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool starts");
        promtool.stdin.take().expect("stdin").write_all(body.as_bytes()).expect("metrics to promtool");
        let out = promtool.wait_with_output().expect("promtool ends");
        assert!(
            out.status.success(),
            "promtool check metrics on {target}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
