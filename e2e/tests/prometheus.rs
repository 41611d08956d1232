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

use granary_e2e::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Expressions that may return nothing on this machine, with the reason.
const ALLOWED_EMPTY: [(&str, &str); 1] = [(
    "granary_operator_",
    "the operator's own series exist only under `granary operator`, which needs a Kubernetes API \
     server; the control-plane suite checks them there",
)];

/// What Grafana would put for its variables: every namespace, pipeline and worker, and a rate
/// window of a few scrapes (Prometheus scrapes every second here).
const SUBSTITUTIONS: [(&str, &str); 4] =
    [("$__rate_interval", "5s"), ("$namespace", ".*"), ("$pipeline", ".*"), ("$worker", ".*")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/bin").join(name);
    if debian.is_file() {
        return debian;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is missing: run scripts/test, which installs Debian's `prometheus`, or set {env}")
        })
}

/// A Prometheus server on 127.0.0.1, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes every second what `targets` (an http_sd endpoint) lists.
    fn start(targets: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: granary
    honor_labels: true
    http_sd_configs:
      - url: http://{targets}/targets
        refresh_interval: 1s
"
            ),
        )
        .expect("prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(tool("GRANARY_PROMETHEUS", "prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let prometheus = Prometheus { child, addr, _dir: dir };
        // It listens before its storage is open, and answers 503 until then: wait for /-/ready.
        let start = Instant::now();
        while !prometheus.ready() {
            assert!(start.elapsed() < Duration::from_secs(30), "Prometheus was not ready within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        prometheus
    }

    /// Whether `GET /-/ready` answers 200.
    fn ready(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(&self.addr) else { return false };
        let request = format!("GET /-/ready HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr);
        let mut response = String::new();
        stream.set_read_timeout(Some(Duration::from_secs(5))).is_ok()
            && stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut response).is_ok()
            && response.starts_with("HTTP/1.1 200")
    }

    fn api(&self, path: &str, params: &[(&str, String)]) -> Value {
        let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
        let body = get(&self.addr, &format!("{path}?{}", query.join("&")));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// The series `expr` returns at any point from `start` to `end` (unix seconds), or why not.
    fn query_range(&self, expr: &str, start: f64, end: f64) -> Result<usize, String> {
        let v = self.api(
            "/api/v1/query_range",
            &[
                ("query", expr.to_string()),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("step", "1".into()),
            ],
        );
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().map_or(0, Vec::len))
    }

    /// The scrape targets that are up.
    fn up(&self) -> usize {
        let v = self.api("/api/v1/query", &[("query", "up == 1".into())]);
        v["data"]["result"].as_array().map_or(0, Vec::len)
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("the clock is after 1970").as_secs_f64()
}

/// The PromQL of a Grafana variable query (`label_values(selector, label)` asks for `selector`).
fn variable_expr(query: &str) -> Option<String> {
    let inner = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, _) = inner.rsplit_once(',')?;
    Some(selector.trim().to_string())
}

/// Every expression of the dashboards: `(where, expr)`.
fn dashboard_exprs() -> Vec<(String, String)> {
    fn panels(list: &[Value], file: &str, out: &mut Vec<(String, String)>) {
        for panel in list {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("{file}: panel `{title}` {}", target["refId"]), expr.to_string()));
                }
            }
            panels(panel["panels"].as_array().map_or(&[], Vec::as_slice), file, out);
        }
    }
    let mut out = Vec::new();
    let dir = repo().join("charts/granary/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("charts/granary/dashboards")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "four dashboards in {}", dir.display());
    for path in files {
        let file = path.file_name().expect("a name").to_string_lossy().to_string();
        let d: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
        panels(d["panels"].as_array().map_or(&[], Vec::as_slice), &file, &mut out);
        for a in d["annotations"]["list"].as_array().into_iter().flatten() {
            if let Some(expr) = a["expr"].as_str() {
                out.push((format!("{file}: annotation `{}`", a["name"]), expr.to_string()));
            }
        }
        for v in d["templating"]["list"].as_array().into_iter().flatten() {
            let query = v["query"].as_str().or_else(|| v["query"]["query"].as_str());
            if v["type"] == "query"
                && let Some(expr) = query.and_then(variable_expr)
            {
                out.push((format!("{file}: variable `{}`", v["name"]), expr));
            }
        }
    }
    out
}

/// The signal of every alert: its `expr` without the final `<op> <number>`.
fn alert_signals() -> Vec<(String, String)> {
    let path = repo().join("charts/granary/rules/granary.rules.yaml");
    let rules: Value =
        serde_norway::from_str(&std::fs::read_to_string(&path).expect("the rules file")).expect("YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let (Some(alert), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str()) else { continue };
            let expr = expr.trim();
            let cut = expr.rfind(')').expect("an alert expr is `(signal) op threshold`");
            let (signal, threshold) = expr.split_at(cut + 1);
            assert!(
                threshold.split_whitespace().count() == 2,
                "alert {alert}: `{threshold}` after the signal is not `op number`"
            );
            out.push((format!("alert {alert}"), signal.to_string()));
        }
    }
    assert!(out.len() >= 4, "the alerts: {out:?}");
    out
}

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

fn substitute(expr: &str) -> String {
    SUBSTITUTIONS.iter().fold(expr.to_string(), |e, (from, to)| e.replace(from, to))
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

    // promtool's lint on every process Prometheus scraped.
    let targets: Value = serde_json::from_str(&get(&metrics, "/targets")).expect("http_sd JSON");
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
