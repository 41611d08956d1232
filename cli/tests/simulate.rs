//! Runs `granary simulate`: the JSON report's shape and the Granary policy's bars on every
//! scenario, the PNG plots, the text table and decisions, and the errors for unknown names.
//!
//! The plot test needs DejaVu Sans (`apt-get install fonts-dejavu-core`) or `GRANARY_PLOT_FONT`;
//! without a font it fails rather than skips.

mod support;

use std::collections::BTreeSet;
use std::process::{Command, Output};
use support::text;

use serde_json::Value;

/// Scenarios the report must cover at least.
const SCENARIOS: &[&str] = &[
    "steady",
    "demand-double",
    "demand-half",
    "noisy",
    "slow-start",
    "two-jobs",
    "compute-bound",
    "above-max",
];

const POLICIES: &[&str] = &["granary", "cachew", "hpa"];

const KEYS: &[&str] = &[
    "decisions_to_converge",
    "mean_wait_fraction",
    "policy",
    "scenario",
    "training_time_vs_oracle",
    "worker_seconds_vs_oracle",
];

fn granary(args: &[&str]) -> Output {
    support::granary("simulate", args)
}

fn succeed(args: &[&str]) -> String {
    support::succeed("simulate", args)
}

/// The `--json` report, one object per line.
fn report() -> Vec<serde_json::Map<String, Value>> {
    succeed(&["--json"])
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(o)) => o,
            other => panic!("not a JSON object: {line}: {other:?}"),
        })
        .collect()
}

fn scenario_names(rows: &[serde_json::Map<String, Value>]) -> BTreeSet<String> {
    rows.iter().filter_map(|r| r["scenario"].as_str().map(str::to_string)).collect()
}

#[test]
fn json_has_one_line_per_scenario_and_policy_with_the_six_keys() {
    let rows = report();
    let mut seen = BTreeSet::new();
    for row in &rows {
        let mut keys: Vec<&str> = row.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, KEYS, "keys of {row:?}");
        let scenario = row["scenario"].as_str().expect("scenario is a string");
        let policy = row["policy"].as_str().expect("policy is a string");
        assert!(POLICIES.contains(&policy), "policy {policy}");
        assert!(row["decisions_to_converge"].is_null() || row["decisions_to_converge"].is_u64());
        for key in ["training_time_vs_oracle", "worker_seconds_vs_oracle", "mean_wait_fraction"] {
            assert!(row[key].is_number(), "{key} of {row:?}");
        }
        assert!(seen.insert((scenario.to_string(), policy.to_string())), "duplicate {scenario}/{policy}");
    }
    let scenarios = scenario_names(&rows);
    for s in SCENARIOS {
        assert!(scenarios.contains(*s), "scenario {s} missing from {scenarios:?}");
    }
    assert_eq!(rows.len(), scenarios.len() * POLICIES.len());
}

#[test]
fn granary_meets_the_bars_in_every_scenario() {
    let rows = report();
    let granary: Vec<_> = rows.iter().filter(|r| r["policy"] == "granary").collect();
    assert_eq!(granary.len(), scenario_names(&rows).len());
    let mut failures = Vec::new();
    for row in granary {
        let decisions = row["decisions_to_converge"].as_u64();
        let time = row["training_time_vs_oracle"].as_f64().unwrap_or(f64::NAN);
        let workers = row["worker_seconds_vs_oracle"].as_f64().unwrap_or(f64::NAN);
        if !(decisions.is_some_and(|d| d <= 2) && time <= 1.05 && workers <= 1.10) {
            failures.push(format!("{row:?}"));
        }
    }
    assert!(failures.is_empty(), "granary misses a bar:\n{}", failures.join("\n"));
}

#[test]
fn one_policy_and_one_scenario_select_one_line() {
    let out = succeed(&["--json", "--scenario", "steady", "--policy", "hpa"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].contains(r#""scenario":"steady","policy":"hpa""#), "{out}");
}

#[test]
fn text_table_and_decisions() {
    let out = succeed(&["--scenario", "demand-double", "--decisions"]);
    let table: Vec<&str> = out.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(table.len(), 1 + POLICIES.len(), "{out}");
    assert!(table[0].starts_with("scenario"), "{out}");
    for p in POLICIES {
        assert!(out.contains(&format!("demand-double / {p}: ")), "no decisions of {p}:\n{out}");
    }
    assert!(out.lines().any(|l| l.trim_start().starts_with("t=") && l.contains('→')), "{out}");
}

#[test]
fn plot_writes_a_png_per_scenario() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plots = dir.path().join("plots");
    let plots_arg = plots.to_str().expect("utf-8 temp path");
    succeed(&["--json", "--plot", plots_arg]);
    let scenarios = scenario_names(&report());
    assert!(scenarios.len() >= SCENARIOS.len());
    for s in &scenarios {
        let path = plots.join(format!("{s}.png"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.len() > 1000, "{} has only {} bytes", path.display(), bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    }
    let written = std::fs::read_dir(&plots).expect("plots folder").count();
    assert_eq!(written, scenarios.len());
}

#[test]
fn a_bad_font_override_fails_naming_the_variable_and_package() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["simulate", "--scenario", "steady", "--plot"])
        .arg(dir.path())
        .env("GRANARY_PLOT_FONT", dir.path().join("missing.ttf"))
        .output()
        .expect("running granary");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("GRANARY_PLOT_FONT") && stderr.contains("fonts-dejavu-core"), "{stderr}");
}

#[test]
fn unknown_names_exit_2_listing_the_valid_ones() {
    let out = granary(&["--scenario", "nope"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    for name in std::iter::once("all").chain(SCENARIOS.iter().copied()) {
        assert!(stderr.contains(name), "`{name}` missing from: {stderr}");
    }
    let out = granary(&["--policy", "nope"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("all, granary, cachew, hpa"), "{stderr}");
}
