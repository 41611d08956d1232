//! The Prometheus alerting rules of the chart (charts/granary/rules/granary.rules.yaml): promtool
//! accepts them (`promtool check rules`), their unit tests in granary.rules.test.yaml pass
//! (`promtool test rules`), and they follow the metrics contract:
//! - every alert has `for`, a `severity` label, a `summary` and a `description`;
//! - every `expr` is `(<signal>) <op> <number>`: one top-level comparison with a number, so that
//!   `<signal>` alone can be graphed (and the end-to-end test checks it returns data);
//! - the signal uses only Granary's metrics (the list below), only labels those metrics have (and
//!   their documented values), never Prometheus' scrape label `job`, and aggregates `by (...)`
//!   explicit labels, which the annotations name;
//! - every alert has a firing and a non-firing unit test, whose input series are metrics of the
//!   list with their labels.
//!
//! promtool comes from the Debian package `prometheus` (scripts/test installs it):
//! `$GRANARY_PROMTOOL`, else /usr/bin/promtool, else `promtool` on PATH.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The rules file, relative to the repository root.
const RULES: &str = "charts/granary/rules/granary.rules.yaml";
/// Its `promtool test rules` unit tests, relative to the repository root.
const RULE_TESTS: &str = "charts/granary/rules/granary.rules.test.yaml";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the operator crate sits in the workspace").into()
}

// -----------------------------------------------------------------------------------------------
// The metrics contract

/// A metric Granary exports: its name, whether it is a histogram (`_bucket`, `_sum`, `_count`),
/// and its labels, each `name` or `name=value|value|...` when its values are fixed.
struct Metric {
    name: &'static str,
    histogram: bool,
    labels: &'static [&'static str],
}

const fn metric(name: &'static str, labels: &'static [&'static str]) -> Metric {
    Metric { name, histogram: false, labels }
}

const fn histogram(name: &'static str, labels: &'static [&'static str]) -> Metric {
    Metric { name, histogram: true, labels }
}

const PIPELINE: &[&str] = &["namespace", "pipeline"];
const TRAINER: &[&str] = &["namespace", "pipeline", "trainer_job"];
const WORKER: &[&str] = &["namespace", "pipeline", "worker"];
const STAGE: &[&str] = &["namespace", "pipeline", "worker", "stage"];

/// Every metric Granary exports (the metrics contract): dispatcher, worker, operator, process.
const METRICS: &[Metric] = &[
    // Dispatcher.
    metric("granary_workers_ready", PIPELINE),
    metric("granary_workers_desired", PIPELINE),
    metric("granary_autoscaler_decisions_total", &["namespace", "pipeline", "direction=up|down"]),
    metric("granary_dispatcher_workers_lost_total", PIPELINE),
    metric("granary_dispatcher_worker_registrations_total", PIPELINE),
    metric("granary_dispatcher_consumers", TRAINER),
    metric("granary_dispatcher_job_epoch", TRAINER),
    metric("granary_dispatcher_splits_total", &["namespace", "pipeline", "event=leased|completed|requeued"]),
    metric("granary_dispatcher_journal_writes_total", &["result=ok|error"]),
    metric("granary_trainer_batches_total", TRAINER),
    metric("granary_trainer_demand_batches_per_second", TRAINER),
    histogram("granary_trainer_step_seconds", TRAINER),
    histogram("granary_trainer_wait_seconds", TRAINER),
    metric("granary_trainer_buffered_batches", TRAINER),
    metric("granary_cache_bytes_total", &["namespace", "pipeline", "direction=read|written"]),
    metric(
        "granary_cache_splits_total",
        &["namespace", "pipeline", "outcome=read|written|computed|fallback"],
    ),
    metric("granary_cache_recomputed_elements_total", PIPELINE),
    metric("granary_cache_state", &["namespace", "pipeline", "state=off|profiling|compute|writing|reading"]),
    // Worker.
    metric("granary_worker_elements_produced_total", WORKER),
    metric("granary_worker_parts_sent_total", WORKER),
    metric("granary_worker_sent_bytes_total", WORKER),
    metric("granary_worker_stage_seconds_total", STAGE),
    metric("granary_worker_stage_elements_total", STAGE),
    histogram("granary_worker_split_seconds", WORKER),
    metric("granary_worker_buffered_parts", WORKER),
    metric("granary_worker_buffer_capacity_parts", WORKER),
    metric("granary_worker_active_leases", WORKER),
    metric("granary_worker_cores", WORKER),
    metric("granary_worker_cpu_seconds_total", WORKER),
    metric("granary_worker_cache_read_bytes_total", WORKER),
    metric("granary_worker_cache_written_bytes_total", WORKER),
    metric("granary_worker_cache_fallback_splits_total", WORKER),
    metric("granary_worker_cache_recomputed_elements_total", WORKER),
    // Operator.
    metric("granary_operator_reconciles_total", &["result=ok|error"]),
    histogram("granary_operator_reconcile_duration_seconds", &[]),
    metric("granary_operator_leader", &[]),
    // Every process.
    metric("process_cpu_seconds_total", &[]),
    metric("process_resident_memory_bytes", &[]),
    metric("process_start_time_seconds", &[]),
    metric("process_open_fds", &[]),
];

/// Labels Prometheus adds to every scraped series. The rules may keep `instance`; never `job`
/// (Granary's trainer-job label is `trainer_job`).
const SCRAPE_LABELS: &[&str] = &["job", "instance"];

/// The metric a series name belongs to, and the labels that series has (name -> fixed values).
/// Each label of a metric, with its allowed values when they are fixed.
type KnownLabels = BTreeMap<&'static str, Option<BTreeSet<&'static str>>>;

fn lookup(series: &str) -> Option<(&'static Metric, KnownLabels)> {
    let (metric, suffix) = METRICS.iter().find_map(|m| {
        if m.name == series {
            return Some((m, ""));
        }
        let suffix = series.strip_prefix(m.name)?;
        (m.histogram && ["_bucket", "_sum", "_count"].contains(&suffix)).then_some((m, suffix))
    })?;
    let mut labels: BTreeMap<&'static str, Option<BTreeSet<&'static str>>> = metric
        .labels
        .iter()
        .map(|spec| match spec.split_once('=') {
            Some((name, values)) => (name, Some(values.split('|').collect())),
            None => (*spec, None),
        })
        .collect();
    if suffix == "_bucket" {
        labels.insert("le", None);
    }
    Some((metric, labels))
}

/// The alerts the contract asks for: name, comparison, threshold, the allowed `for` (seconds),
/// and the metrics the signal uses. Every alert of the rules file must be here.
struct Expected {
    alert: &'static str,
    op: &'static str,
    threshold: f64,
    for_seconds: &'static [u64],
    metrics: &'static [&'static str],
    required: bool,
}

const EXPECTED: &[Expected] = &[
    Expected {
        alert: "GranaryTrainerStarved",
        op: ">",
        threshold: 0.5,
        for_seconds: &[600],
        metrics: &["granary_trainer_wait_seconds_sum", "granary_trainer_step_seconds_sum"],
        required: true,
    },
    Expected {
        alert: "GranaryWorkerCrashLooping",
        op: ">=",
        threshold: 3.0,
        for_seconds: &[0, 60],
        metrics: &["granary_dispatcher_workers_lost_total"],
        required: true,
    },
    Expected {
        alert: "GranaryCacheFallbackRateHigh",
        op: ">",
        threshold: 0.1,
        for_seconds: &[600],
        metrics: &["granary_cache_splits_total"],
        required: true,
    },
    Expected {
        alert: "GranaryJournalFailing",
        op: ">",
        threshold: 0.0,
        for_seconds: &[60],
        metrics: &["granary_dispatcher_journal_writes_total"],
        required: true,
    },
    Expected {
        alert: "GranaryWorkersBelowDesired",
        op: ">",
        threshold: 0.0,
        for_seconds: &[900],
        metrics: &["granary_workers_desired", "granary_workers_ready"],
        required: false,
    },
];

// -----------------------------------------------------------------------------------------------
// promtool

/// promtool: `$GRANARY_PROMTOOL`, else /usr/bin/promtool, else `promtool` on PATH.
fn promtool() -> PathBuf {
    let env = "GRANARY_PROMTOOL";
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{env}={} does not exist; run scripts/test, which installs promtool",
            path.display()
        );
        return path;
    }
    let system = PathBuf::from("/usr/bin/promtool");
    if system.is_file() {
        return system;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool is missing: the alert-rule tests need it. Run scripts/test, which installs it \
                 (apt-get install prometheus); or set {env} to its path."
            )
        })
}

/// Runs promtool with `args` in the repository root; fails the test, with its whole output,
/// unless it succeeds.
fn run_promtool(args: &[&str]) -> String {
    let mut command = Command::new(promtool());
    command.args(args).current_dir(root());
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed: {text}");
    text
}

#[test]
fn promtool_checks_the_rules() {
    let out = run_promtool(&["check", "rules", RULES]);
    assert!(out.contains("SUCCESS"), "promtool check rules:\n{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    let out = run_promtool(&["test", "rules", RULE_TESTS]);
    assert!(out.contains("SUCCESS"), "promtool test rules:\n{out}");
}

/// The operator's own metrics, beside the dispatcher's on its `/metrics` (the dispatcher's are
/// linted on a real run by e2e/tests/prometheus.rs), pass `promtool check metrics`.
#[test]
fn promtool_lints_the_operator_metrics() {
    let exposition = granary_dispatcher::exposition::Exposition::new().expect("the dispatcher's metrics");
    let registry = exposition.registry();
    let operator =
        granary_operator::metrics::OperatorMetrics::register(&registry).expect("the operator's metrics");
    operator.reconciled(true);
    operator.reconciled(false);
    operator.timed(std::time::Duration::from_millis(30));
    operator.leading(true);
    let text = granary_telemetry::render(&registry);
    assert!(text.contains("granary_operator_reconcile_duration_seconds_bucket"), "{text}");
    assert!(text.contains("process_resident_memory_bytes"), "{text}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, &text).expect("the metrics file");
    let out = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).expect("the metrics file"))
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n--- the metrics\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// -----------------------------------------------------------------------------------------------
// The rules file

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn rules() -> Vec<Rule> {
    let file: RulesFile = serde_norway::from_str(&read(RULES)).unwrap_or_else(|e| panic!("{RULES}: {e}"));
    assert_eq!(file.groups.len(), 1, "{RULES}: one group");
    let group = file.groups.into_iter().next().expect("a group");
    assert_eq!(group.name, "granary", "{RULES}: the group is named granary");
    group.rules
}

/// Seconds of a Prometheus duration (`10m`, `1h30m`, `0`), or None if it is none.
fn duration_seconds(text: &str) -> Option<u64> {
    if text == "0" {
        return Some(0);
    }
    let mut seconds = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let factor = match &rest[..unit] {
            "y" => 365 * 86400,
            "w" => 7 * 86400,
            "d" => 86400,
            "h" => 3600,
            "m" => 60,
            "s" => 1,
            "ms" => 0,
            _ => return None,
        };
        seconds += number * factor;
        rest = &rest[unit..];
    }
    (!text.is_empty()).then_some(seconds)
}

const COMPARISONS: &[&str] = &[">=", "<=", "==", "!=", ">", "<"];

/// Splits `(<signal>) <op> <number>` into the signal (without its parentheses), the operator
/// and the number: the first parenthesis must close just before ` <op> <number>`, the end.
fn split_comparison(expr: &str) -> Result<(&str, &'static str, f64), String> {
    let expr = expr.trim();
    if !expr.starts_with('(') {
        return Err("does not start with `(`".into());
    }
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut close = None;
    for (i, c) in expr.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' if q != '`' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close.ok_or("the first `(` is never closed")?;
    let signal = &expr[1..close];
    let rest = &expr[close + 1..];
    let tail = rest.strip_prefix(' ').ok_or("no ` <op> <number>` right after the signal's `)`")?;
    let op = COMPARISONS
        .iter()
        .find(|op| tail.starts_with(&format!("{op} ")))
        .ok_or_else(|| format!("`{rest}` after the signal is not ` <op> <number>`"))?;
    let number = &tail[op.len() + 1..];
    let value = number
        .parse::<f64>()
        .ok()
        .filter(|_| number.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{number}` after `{op}` is not a plain number"))?;
    Ok((signal, op, value))
}

// -----------------------------------------------------------------------------------------------
// A small PromQL lexer, enough to find metric names, label matchers and `by` lists

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Number(String),
    Punct(&'static str),
}

const PUNCTUATION: &[&str] = &[
    "==", "!=", ">=", "<=", "=~", "!~", "(", ")", "{", "}", "[", "]", ",", "+", "-", "*", "/", "%", "^", ">",
    "<", "=", "@", ":",
];

fn lex(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
            tokens.push(Token::Number(chars[start..i].iter().collect()));
        } else if c == '"' || c == '\'' || c == '`' {
            let mut value = String::new();
            i += 1;
            loop {
                let Some(&d) = chars.get(i) else { return Err(format!("unterminated string in {text}")) };
                i += 1;
                if d == c {
                    break;
                }
                if d == '\\' && c != '`' {
                    value.push(*chars.get(i).ok_or("a trailing backslash")?);
                    i += 1;
                } else {
                    value.push(d);
                }
            }
            tokens.push(Token::Str(value));
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let punct = PUNCTUATION
                .iter()
                .find(|p| p.len() == 2 && **p == two)
                .or_else(|| PUNCTUATION.iter().find(|p| p.len() == 1 && p.starts_with(c)))
                .ok_or_else(|| format!("unexpected `{c}` in {text}"))?;
            i += punct.len();
            tokens.push(Token::Punct(punct));
        }
    }
    Ok(tokens)
}

/// PromQL keywords that stand without parentheses.
const KEYWORDS: &[&str] =
    &["and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"];

/// PromQL aggregation operators, which may stand before `by (...)` rather than `(`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// What a signal uses: metric names, and the labels of its `by (...)` lists.
#[derive(Debug, Default)]
struct Uses {
    metrics: BTreeSet<String>,
    /// The labels each metric of the signal has (for checking `by` lists).
    metric_labels: BTreeSet<String>,
    by_lists: Vec<BTreeSet<String>>,
    problems: Vec<String>,
}

/// The label list in parentheses starting at `tokens[i]`, and the index after it.
fn label_list(tokens: &[Token], mut i: usize) -> Result<(Vec<String>, usize), String> {
    if tokens.get(i) != Some(&Token::Punct("(")) {
        return Err("a label list without `(`".into());
    }
    i += 1;
    let mut labels = Vec::new();
    loop {
        match tokens.get(i) {
            Some(Token::Punct(")")) => return Ok((labels, i + 1)),
            Some(Token::Punct(",")) => i += 1,
            Some(Token::Ident(label)) => {
                labels.push(label.clone());
                i += 1;
            }
            other => return Err(format!("unexpected {other:?} in a label list")),
        }
    }
}

/// The matchers `{label op "value", ...}` starting at `tokens[i]`, and the index after them.
/// Label matchers as (label, operator, value).
type Matchers = Vec<(String, &'static str, String)>;

fn matchers(tokens: &[Token], mut i: usize) -> Result<(Matchers, usize), String> {
    i += 1; // `{`
    let mut out = Vec::new();
    loop {
        match (tokens.get(i), tokens.get(i + 1), tokens.get(i + 2)) {
            (Some(Token::Punct("}")), ..) => return Ok((out, i + 1)),
            (Some(Token::Punct(",")), ..) => i += 1,
            (Some(Token::Ident(label)), Some(Token::Punct(op)), Some(Token::Str(value)))
                if ["=", "!=", "=~", "!~"].contains(op) =>
            {
                out.push((label.clone(), *op, value.clone()));
                i += 3;
            }
            other => return Err(format!("unexpected {other:?} in label matchers")),
        }
    }
}

/// Checks a PromQL expression against the metrics contract; `what` names it in messages.
fn uses(what: &str, expr: &str) -> Uses {
    let mut uses = Uses::default();
    let tokens = match lex(expr) {
        Ok(tokens) => tokens,
        Err(e) => {
            uses.problems.push(format!("{what}: {e}"));
            return uses;
        }
    };
    let mut i = 0;
    while i < tokens.len() {
        let Token::Ident(ident) = &tokens[i] else {
            i += 1;
            continue;
        };
        let next = tokens.get(i + 1);
        if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&ident.as_str())
            && next == Some(&Token::Punct("("))
        {
            match label_list(&tokens, i + 1) {
                Ok((labels, after)) => {
                    if labels.iter().any(|l| l == "job") {
                        uses.problems.push(format!(
                            "{what}: `{ident} ({})` uses Prometheus' scrape label `job` (ours is trainer_job)",
                            labels.join(", ")
                        ));
                    }
                    match ident.as_str() {
                        "by" => uses.by_lists.push(labels.into_iter().collect()),
                        "without" => uses.problems.push(format!(
                            "{what}: aggregates `without`; aggregate `by (...)` the labels the alert keeps"
                        )),
                        _ => {}
                    }
                    i = after;
                }
                Err(e) => {
                    uses.problems.push(format!("{what}: {e}"));
                    i += 1;
                }
            }
            continue;
        }
        if next == Some(&Token::Punct("("))
            || KEYWORDS.contains(&ident.as_str())
            || AGGREGATIONS.contains(&ident.as_str())
        {
            i += 1; // a function, an aggregation or a keyword
            continue;
        }
        // A metric name.
        let Some((_, labels)) = lookup(ident) else {
            uses.problems.push(format!("{what}: `{ident}` is not a metric of the contract"));
            i += 1;
            continue;
        };
        uses.metrics.insert(ident.clone());
        uses.metric_labels.extend(labels.keys().map(|l| l.to_string()));
        i += 1;
        if tokens.get(i) == Some(&Token::Punct("{")) {
            match matchers(&tokens, i) {
                Ok((found, after)) => {
                    for (label, op, value) in found {
                        match labels.get(label.as_str()) {
                            None => uses.problems.push(format!(
                                "{what}: {ident} has no label `{label}` (its labels: {:?})",
                                labels.keys().collect::<Vec<_>>()
                            )),
                            Some(Some(values)) => {
                                let wanted: Vec<&str> =
                                    if op.ends_with('~') { value.split('|').collect() } else { vec![&value] };
                                for v in wanted.into_iter().filter(|v| !values.contains(v)) {
                                    uses.problems.push(format!(
                                        "{what}: {ident}{{{label}}} is never `{v}` (its values: {values:?})"
                                    ));
                                }
                            }
                            Some(None) => {}
                        }
                    }
                    i = after;
                }
                Err(e) => uses.problems.push(format!("{what}: {e}")),
            }
        }
    }
    uses
}

/// The labels `{{ $labels.x }}` (or `$labels.x` in any template action) of a text refers to.
fn template_labels(text: &str) -> BTreeSet<String> {
    text.match_indices("$labels.")
        .map(|(i, m)| {
            text[i + m.len()..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
        })
        .collect()
}

#[test]
fn every_alert_follows_the_contract() {
    let rules = rules();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for rule in &rules {
        let Some(alert) = rule.alert.as_deref() else {
            problems
                .push(format!("a rule without `alert` (recording rules are not expected): {}", rule.expr));
            continue;
        };
        let mut problem = |p: String| problems.push(format!("{alert}: {p}"));
        if !seen.insert(alert.to_string()) {
            problem("defined twice".into());
        }
        let Some(expected) = EXPECTED.iter().find(|e| e.alert == alert) else {
            problem("not an alert of the contract; add it to EXPECTED in this test".into());
            continue;
        };

        // `for`, severity, summary, description.
        match rule.for_.as_deref().map(|f| (f, duration_seconds(f))) {
            None => problem("no `for`".into()),
            Some((f, None)) => problem(format!("`for: {f}` is no duration")),
            Some((f, Some(s))) if !expected.for_seconds.contains(&s) => {
                problem(format!("`for: {f}`; the contract says {:?} seconds", expected.for_seconds))
            }
            Some(_) => {}
        }
        match rule.labels.get("severity").map(String::as_str) {
            Some("info" | "warning" | "critical") => {}
            other => problem(format!("severity {other:?}, not info, warning or critical")),
        }
        for key in rule.labels.keys().filter(|k| *k != "severity") {
            problem(format!("label `{key}`: only `severity` is expected"));
        }
        for key in ["summary", "description"] {
            if rule.annotations.get(key).is_none_or(|t| t.trim().is_empty()) {
                problem(format!("no `{key}` annotation"));
            }
        }
        let summary = rule.annotations.get("summary").cloned().unwrap_or_default();
        let description = rule.annotations.get("description").cloned().unwrap_or_default();
        if !description.contains("{{ $value") {
            problem("the description does not show `{{ $value }}`".into());
        }

        // `(<signal>) <op> <number>`.
        let (signal, op, threshold) = match split_comparison(&rule.expr) {
            Ok(split) => split,
            Err(e) => {
                problem(format!("expr is not `(<signal>) <op> <number>`: {e}:\n{}", rule.expr));
                continue;
            }
        };
        if (op, threshold) != (expected.op, expected.threshold) {
            problem(format!(
                "`{op} {threshold}`; the contract says `{} {}`",
                expected.op, expected.threshold
            ));
        }

        // The signal: the contract's metrics and labels, explicit `by` lists.
        let used = uses(alert, signal);
        problems.extend(used.problems.iter().cloned());
        let wanted: BTreeSet<String> = expected.metrics.iter().map(|m| m.to_string()).collect();
        if used.metrics != wanted {
            problems.push(format!("{alert}: uses the metrics {:?}; expected {wanted:?}", used.metrics));
        }
        let mut problem = |p: String| problems.push(format!("{alert}: {p}"));
        if used.by_lists.is_empty() {
            problem(
                "no `by (...)`: aggregate by the labels the alert keeps, so scrape labels do not leak".into(),
            );
            continue;
        }
        let kept: BTreeSet<String> = used
            .by_lists
            .iter()
            .skip(1)
            .fold(used.by_lists[0].clone(), |kept, list| kept.intersection(list).cloned().collect());
        if used.by_lists.iter().any(|list| *list != kept) {
            problem(format!("aggregates by different labels: {:?}", used.by_lists));
        }
        for label in
            kept.iter().filter(|l| !used.metric_labels.contains(*l) && !SCRAPE_LABELS.contains(&l.as_str()))
        {
            problem(format!("aggregates by `{label}`, which none of its metrics has"));
        }

        // The annotations name what the alert keeps, and only that.
        for (key, text) in [("summary", &summary), ("description", &description)] {
            for label in template_labels(text).difference(&kept) {
                problem(format!(
                    "the {key} uses `$labels.{label}`, which the signal does not keep ({kept:?})"
                ));
            }
        }
        for label in kept.iter().filter(|l| !template_labels(&summary).contains(*l)) {
            problem(format!("the summary does not name `{{{{ $labels.{label} }}}}`"));
        }
        if kept.contains("namespace") && kept.contains("pipeline") {
            for (key, text) in [("summary", &summary), ("description", &description)] {
                if !text.contains("{{ $labels.namespace }}/{{ $labels.pipeline }}") {
                    problem(format!(
                        "the {key} does not name the pipeline as `{{{{ $labels.namespace }}}}/{{{{ $labels.pipeline }}}}`"
                    ));
                }
            }
        }
    }
    for expected in EXPECTED.iter().filter(|e| e.required && !seen.contains(e.alert)) {
        problems.push(format!("{}: missing from {RULES}", expected.alert));
    }
    assert!(problems.is_empty(), "{RULES} breaks the contract:\n{}", problems.join("\n"));
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let tests: Value =
        serde_norway::from_str(&read(RULE_TESTS)).unwrap_or_else(|e| panic!("{RULE_TESTS}: {e}"));
    // promtool resolves rule_files relative to the test file.
    let rules_name = Path::new(RULES).file_name().and_then(|n| n.to_str()).expect("a file name");
    assert_eq!(tests["rule_files"], serde_json::json!([rules_name]), "{RULE_TESTS}: rule_files");

    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let mut problems = Vec::new();
    for (n, group) in tests["tests"].as_array().expect("tests").iter().enumerate() {
        // Input series: metrics of the contract, with their labels (and the scrape's).
        for input in group["input_series"].as_array().into_iter().flatten() {
            let series = input["series"].as_str().expect("series");
            let tokens = lex(series).unwrap_or_else(|e| panic!("test {n}: {e}"));
            let Some(Token::Ident(name)) = tokens.first() else {
                panic!("test {n}: no metric name in {series}")
            };
            let Some((_, known)) = lookup(name) else {
                problems.push(format!("test {n}: `{name}` is not a metric of the contract"));
                continue;
            };
            let given = if tokens.len() > 1 {
                matchers(&tokens, 1).unwrap_or_else(|e| panic!("test {n}: {e} in {series}")).0
            } else {
                Vec::new()
            };
            let names: BTreeSet<&str> =
                given.iter().map(|(l, _, _)| l.as_str()).filter(|l| !SCRAPE_LABELS.contains(l)).collect();
            let all: BTreeSet<&str> = known.keys().copied().collect();
            if names != all {
                problems.push(format!("test {n}: {series} has the labels {names:?}; {name} has {all:?}"));
            }
            for (label, _, value) in &given {
                if let Some(Some(values)) = known.get(label.as_str())
                    && !values.contains(value.as_str())
                {
                    problems.push(format!("test {n}: {series}: {label} is never `{value}` ({values:?})"));
                }
            }
        }
        for case in group["alert_rule_test"].as_array().into_iter().flatten() {
            let alert = case["alertname"].as_str().expect("alertname").to_string();
            let expected = case["exp_alerts"].as_array().map(Vec::len).unwrap_or(0);
            if expected == 0 {
                quiet.insert(alert)
            } else {
                firing.insert(alert)
            };
        }
    }
    for rule in rules() {
        let alert = rule.alert.expect("an alert");
        if !firing.contains(&alert) {
            problems.push(format!("{alert}: no unit test where it fires"));
        }
        if !quiet.contains(&alert) {
            problems.push(format!("{alert}: no unit test where it stays quiet (`exp_alerts: []`)"));
        }
    }
    assert!(problems.is_empty(), "{RULE_TESTS}:\n{}", problems.join("\n"));
}

// -----------------------------------------------------------------------------------------------
// The checks themselves

#[test]
fn the_checks_catch_broken_expressions() {
    assert_eq!(split_comparison("(sum by (a) (x)) > 0.5"), Ok(("sum by (a) (x)", ">", 0.5)));
    assert_eq!(split_comparison("(x{a=~\"(b\"}) >= 3"), Ok(("x{a=~\"(b\"}", ">=", 3.0)));
    for bad in ["x > 0.5", "(x) > 0.5 and y", "(x) > y", "(x) + (y) > 1", "(x)>1", "(x) > bool 1", "(x)"] {
        assert!(split_comparison(bad).is_err(), "accepted {bad}");
    }

    let good = uses(
        "good",
        r#"sum by (namespace, pipeline) (increase(granary_cache_splits_total{outcome=~"read|fallback"}[10m]))"#,
    );
    assert!(good.problems.is_empty(), "{:?}", good.problems);
    assert_eq!(good.by_lists, vec![BTreeSet::from(["namespace".to_string(), "pipeline".to_string()])]);
    for bad in [
        r#"sum by (job) (granary_workers_ready)"#,
        r#"sum without (instance) (granary_workers_ready)"#,
        r#"granary_workers_ready{job="granary"}"#,
        r#"granary_cache_splits_total{outcome="hit"}"#,
        r#"granary_cache_splits_total{outcome=~"read|miss"}"#,
        r#"granary_workers_readyy"#,
        r#"rate(granary_trainer_batches_total_sum[5m])"#,
        r#"up"#,
    ] {
        assert!(!uses("bad", bad).problems.is_empty(), "accepted {bad}");
    }
    assert!(lookup("granary_trainer_wait_seconds_bucket").is_some_and(|(_, l)| l.contains_key("le")));
    assert_eq!(duration_seconds("1h30m"), Some(5400));
    assert_eq!(duration_seconds("10 minutes"), None);
}
