//! Debian's Prometheus on 127.0.0.1 for the observability tests, and the PromQL they check: every
//! expression of the chart's dashboards and the signal of every alert rule.
//!
//! The Prometheus binary is `GRANARY_PROMETHEUS`, else `/usr/bin/prometheus`, else on `PATH`
//! (scripts/test installs Debian's package); promtool likewise with `GRANARY_PROMTOOL`.

use crate::{free_port, get};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What Grafana would put for its variables: every namespace, pipeline and worker, and a rate
/// window of a few scrapes (Prometheus scrapes every second here).
pub const SUBSTITUTIONS: [(&str, &str); 4] =
    [("$__rate_interval", "5s"), ("$namespace", ".*"), ("$pipeline", ".*"), ("$worker", ".*")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// A tool: the path in the variable `env`, else Debian's `/usr/bin/NAME`, else `NAME` on `PATH`.
pub fn tool(env: &str, name: &str) -> PathBuf {
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
pub struct Prometheus {
    child: Child,
    /// Where it serves its API.
    pub addr: String,
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
    pub fn start(targets: &str) -> Prometheus {
        Self::with_scrape_config(&format!(
            "  - job_name: granary
    honor_labels: true
    http_sd_configs:
      - url: http://{targets}/targets
        refresh_interval: 1s
"
        ))
    }

    /// Scrapes every second the `/metrics` of each address in `targets`, as job `job`.
    pub fn start_static(job: &str, targets: &[&str]) -> Prometheus {
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        Self::with_scrape_config(&format!(
            "  - job_name: {job}
    honor_labels: true
    static_configs:
      - targets: [{}]
",
            targets.join(", ")
        ))
    }

    /// Starts with `scrape_configs` (YAML list items, indented by two) and waits until ready.
    fn with_scrape_config(scrape_configs: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{scrape_configs}"
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
    pub fn query_range(&self, expr: &str, start: f64, end: f64) -> Result<usize, String> {
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
    pub fn up(&self) -> usize {
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

/// Now, in unix seconds.
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("the clock is after 1970").as_secs_f64()
}

/// The PromQL of a Grafana variable query (`label_values(selector, label)` asks for `selector`).
fn variable_expr(query: &str) -> Option<String> {
    let inner = query.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, _) = inner.rsplit_once(',')?;
    Some(selector.trim().to_string())
}

/// Every expression of the dashboards: `(where, expr)`.
pub fn dashboard_exprs() -> Vec<(String, String)> {
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
pub fn alert_signals() -> Vec<(String, String)> {
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

/// `expr` with the dashboards' variables replaced as Grafana would ([`SUBSTITUTIONS`]).
pub fn substitute(expr: &str) -> String {
    SUBSTITUTIONS.iter().fold(expr.to_string(), |e, (from, to)| e.replace(from, to))
}
