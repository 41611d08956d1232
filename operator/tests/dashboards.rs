//! The Grafana dashboards the chart ships (charts/granary/dashboards/*.json): their structure
//! (uids, variables, panel ids and grid positions), that every query goes to the Prometheus
//! datasource input `${DS_PROMETHEUS}` and nothing else, and that the queries use only Granary's
//! metrics (the list below, from the metrics contract) and the dashboards' own variables.
//!
//! Each failure names the file and the panel; every problem is reported at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The dashboards, relative to the repository root.
const DASHBOARDS: &str = "charts/granary/dashboards";
/// The dashboard files' stems.
const FILES: [&str; 4] = ["operator", "overview", "pipeline", "workers"];

/// Granary's metrics: every `granary_*` name a query may use. Histograms are in [`HISTOGRAMS`].
const METRICS: &[&str] = &[
    // Dispatcher.
    "granary_workers_ready",
    "granary_workers_desired",
    "granary_autoscaler_decisions_total",
    "granary_dispatcher_workers_lost_total",
    "granary_dispatcher_worker_registrations_total",
    "granary_dispatcher_consumers",
    "granary_dispatcher_job_epoch",
    "granary_dispatcher_splits_total",
    "granary_dispatcher_journal_writes_total",
    "granary_trainer_batches_total",
    "granary_trainer_demand_batches_per_second",
    "granary_trainer_buffered_batches",
    "granary_cache_bytes_total",
    "granary_cache_splits_total",
    "granary_cache_recomputed_elements_total",
    "granary_cache_state",
    // Workers.
    "granary_worker_elements_produced_total",
    "granary_worker_parts_sent_total",
    "granary_worker_sent_bytes_total",
    "granary_worker_stage_seconds_total",
    "granary_worker_stage_elements_total",
    "granary_worker_buffered_parts",
    "granary_worker_buffer_capacity_parts",
    "granary_worker_active_leases",
    "granary_worker_cores",
    "granary_worker_compute_threads",
    "granary_worker_read_depth",
    "granary_worker_cpu_seconds_total",
    "granary_worker_cache_read_bytes_total",
    "granary_worker_cache_written_bytes_total",
    "granary_worker_cache_fallback_splits_total",
    "granary_worker_cache_recomputed_elements_total",
    // Operator.
    "granary_operator_reconciles_total",
    "granary_operator_leader",
];

/// Granary's histograms: queries use their `_bucket`, `_sum` and `_count` series.
const HISTOGRAMS: &[&str] = &[
    "granary_trainer_step_seconds",
    "granary_trainer_wait_seconds",
    "granary_worker_split_seconds",
    "granary_operator_reconcile_duration_seconds",
];

/// The standard process metrics every Granary process exports (without Granary's labels).
const PROCESS_METRICS: &[&str] = &[
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
];

/// The variables a query may use: the filters (only as `label=~"$variable"`) and the rate range.
const FILTERS: &[&str] = &["namespace", "pipeline", "worker"];
const RATE_INTERVAL: &str = "__rate_interval";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the operator crate sits in the workspace").into()
}

/// The datasource of every panel, target, variable and annotation.
fn prometheus_input() -> Value {
    json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"})
}

/// The dashboards: (file name, document). Panics on a missing or invalid file.
fn dashboards() -> Vec<(String, Value)> {
    let dir = root().join(DASHBOARDS);
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    found.sort();
    let expected: Vec<String> = FILES.iter().map(|stem| format!("{stem}.json")).collect();
    assert_eq!(found, expected, "the dashboards in {DASHBOARDS}");
    found
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let doc: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{DASHBOARDS}/{name} is not valid JSON: {e}"));
            assert!(doc.is_object(), "{name}: not a JSON object");
            (name, doc)
        })
        .collect()
}

/// Every panel of a dashboard, those nested in (collapsed) rows included.
fn panels(doc: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&doc["panels"], &mut out);
    out
}

/// How a failure names a panel.
fn name(panel: &Value) -> String {
    format!("panel {:?} (id {})", panel["title"].as_str().unwrap_or("<no title>"), panel["id"])
}

fn variables(doc: &Value) -> &[Value] {
    doc["templating"]["list"].as_array().map(Vec::as_slice).unwrap_or_default()
}

fn variable<'a>(doc: &'a Value, var: &str) -> Option<&'a Value> {
    variables(doc).iter().find(|v| v["name"] == var)
}

/// A query variable's query: a string, or the object form `{"query": ...}`.
fn variable_query(var: &Value) -> &str {
    var["query"].as_str().or_else(|| var["query"]["query"].as_str()).unwrap_or_default()
}

/// Fails with every problem, one per line.
fn report(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}: {} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn dashboards_have_unique_uids_titles_and_schema_versions() {
    let mut problems = Vec::new();
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    for (file, doc) in dashboards() {
        match doc["uid"].as_str() {
            Some(uid) if !uid.is_empty() && uid.len() <= 40 => {
                if let Some(other) = uids.insert(uid.to_string(), file.clone()) {
                    problems.push(format!("{file}: uid {uid:?} is also the uid of {other}"));
                }
            }
            _ => problems.push(format!("{file}: uid {} is not a string of 1 to 40 characters", doc["uid"])),
        }
        if doc["schemaVersion"].as_u64().is_none_or(|version| version < 36) {
            problems.push(format!("{file}: schemaVersion {} (36 or newer expected)", doc["schemaVersion"]));
        }
        if !doc["title"].as_str().is_some_and(|title| title.starts_with("Granary / ")) {
            problems.push(format!("{file}: title {} does not start with \"Granary / \"", doc["title"]));
        }
        if !doc["tags"].as_array().is_some_and(|tags| tags.contains(&json!("granary"))) {
            problems.push(format!("{file}: no tag \"granary\""));
        }
        let input =
            doc["__inputs"].as_array().into_iter().flatten().find(|input| input["name"] == "DS_PROMETHEUS");
        if !input.is_some_and(|i| i["type"] == "datasource" && i["pluginId"] == "prometheus") {
            problems.push(format!(
                "{file}: no __inputs entry DS_PROMETHEUS (type datasource, pluginId prometheus)"
            ));
        }
    }
    report("dashboard metadata", problems);
}

#[test]
fn dashboards_have_the_datasource_and_filter_variables() {
    let mut problems = Vec::new();
    for (file, doc) in dashboards() {
        match variable(&doc, "DS_PROMETHEUS") {
            Some(var) if var["type"] == "datasource" && var["query"] == "prometheus" => {}
            _ => problems
                .push(format!("{file}: no datasource variable DS_PROMETHEUS with query \"prometheus\"")),
        }
        let mut filters = vec![
            ("namespace", "label_values(granary_workers_ready, namespace)"),
            ("pipeline", "label_values(granary_workers_ready{namespace=~\"$namespace\"}, pipeline)"),
        ];
        if file == "workers.json" {
            filters.push((
                "worker",
                "label_values(granary_worker_elements_produced_total{namespace=~\"$namespace\",pipeline=~\"$pipeline\"}, worker)",
            ));
        }
        for (var_name, query) in filters {
            let Some(var) = variable(&doc, var_name) else {
                problems.push(format!("{file}: no variable {var_name}"));
                continue;
            };
            let checks = [
                (var["type"] == "query", "type query"),
                (var["datasource"] == prometheus_input(), "the ${DS_PROMETHEUS} datasource"),
                (variable_query(var) == query, "the query in the contract"),
                (var["multi"] == true && var["includeAll"] == true, "multi and includeAll"),
                (var["allValue"] == ".*", "allValue \".*\""),
            ];
            for (ok, what) in checks {
                if !ok {
                    problems.push(format!("{file}: variable {var_name} lacks {what}: {var}"));
                }
            }
        }
    }
    report("dashboard variables", problems);
}

#[test]
fn panels_have_unique_ids_and_fit_the_grid() {
    let mut problems = Vec::new();
    for (file, doc) in dashboards() {
        let mut ids = BTreeSet::new();
        let mut placed: Vec<(String, [u64; 4])> = Vec::new();
        for panel in panels(&doc) {
            let name = name(panel);
            match panel["id"].as_u64() {
                Some(id) if ids.insert(id) => {}
                Some(id) => problems.push(format!("{file}: {name}: id {id} is used twice")),
                None => problems.push(format!("{file}: {name}: no numeric id")),
            }
            if panel["title"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{file}: {name}: no title"));
            }
            if panel["type"] != "row" && panel["description"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{file}: {name}: no description"));
            }
            let grid = &panel["gridPos"];
            let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| grid[k].as_u64());
            match (x, y, w, h) {
                (Some(x), Some(y), Some(w), Some(h)) if w >= 1 && h >= 1 && x + w <= 24 => {
                    // Panels nested in a collapsed row are laid out when it opens: skip them.
                    if panel["type"] == "row" || !is_nested(&doc, panel) {
                        for (other, [ox, oy, ow, oh]) in &placed {
                            if x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h {
                                problems.push(format!("{file}: {name} overlaps {other}"));
                            }
                        }
                        placed.push((name.clone(), [x, y, w, h]));
                    }
                }
                _ => problems.push(format!("{file}: {name}: gridPos {grid} is not within 24 columns")),
            }
        }
    }
    report("dashboard panels", problems);
}

/// Whether `panel` sits inside a (collapsed) row rather than at the top level.
fn is_nested(doc: &Value, panel: &Value) -> bool {
    !doc["panels"].as_array().is_some_and(|top| top.iter().any(|p| std::ptr::eq(p, panel)))
}

#[test]
fn every_query_goes_to_the_prometheus_input_and_nowhere_else() {
    let mut problems = Vec::new();
    for (file, doc) in dashboards() {
        for panel in panels(&doc) {
            let name = name(panel);
            let targets = panel["targets"].as_array();
            let needs_targets = !matches!(panel["type"].as_str(), Some("row" | "text"));
            if needs_targets && targets.is_none_or(Vec::is_empty) {
                problems.push(format!("{file}: {name}: no targets"));
            }
            let Some(targets) = targets else { continue };
            if panel["datasource"] != prometheus_input() {
                problems.push(format!(
                    "{file}: {name}: datasource {} (not ${{DS_PROMETHEUS}})",
                    panel["datasource"]
                ));
            }
            let mut ref_ids = BTreeSet::new();
            for target in targets {
                let ref_id = target["refId"].as_str().unwrap_or_default();
                if ref_id.is_empty() || !ref_ids.insert(ref_id) {
                    problems.push(format!(
                        "{file}: {name}: a target's refId {} is missing or repeated",
                        target["refId"]
                    ));
                }
                if target["datasource"] != prometheus_input() {
                    problems.push(format!(
                        "{file}: {name}: target {ref_id}: datasource {} (not ${{DS_PROMETHEUS}})",
                        target["datasource"]
                    ));
                }
                if target["expr"].as_str().is_none_or(|expr| expr.trim().is_empty()) {
                    problems.push(format!("{file}: {name}: target {ref_id}: no expr"));
                }
            }
        }
        // Every datasource anywhere in the document (panels, targets, variables, annotations).
        let mut datasources = Vec::new();
        collect_datasources(&doc, "", &mut datasources);
        for (path, datasource) in datasources {
            if datasource != &prometheus_input() {
                problems.push(format!(
                    "{file}: {path}: datasource {datasource} (only ${{DS_PROMETHEUS}} is allowed)"
                ));
            }
        }
    }
    report("dashboard datasources", problems);
}

/// Every `datasource` value in `value`, with its JSON path.
fn collect_datasources<'a>(value: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let child_path = format!("{path}/{key}");
                if key == "datasource" {
                    out.push((child_path.clone(), child));
                }
                collect_datasources(child, &child_path, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                collect_datasources(child, &format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Every PromQL expression of a dashboard, with where it is: targets, annotations, variables.
fn expressions(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(doc) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            out.push((format!("{}, target {}", name(panel), target["refId"]), expr.to_string()));
        }
    }
    for annotation in doc["annotations"]["list"].as_array().into_iter().flatten() {
        let expr = annotation["expr"].as_str().unwrap_or_default();
        out.push((format!("annotation {}", annotation["name"]), expr.to_string()));
    }
    for var in variables(doc).iter().filter(|v| v["type"] == "query") {
        out.push((format!("variable {}", var["name"]), variable_query(var).to_string()));
    }
    out
}

fn is_identifier(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The metric-like identifiers of `expr` starting with one of `prefixes`, outside string literals.
fn metric_names(expr: &str, prefixes: &[&str]) -> Vec<String> {
    let bytes = expr.as_bytes();
    let mut names = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if matches!(c, b'"' | b'\'' | b'`') {
            // Skip the string literal (label values, regexes).
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if is_identifier(c) && (i == 0 || !is_identifier(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_identifier(bytes[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            if prefixes.iter().any(|p| word.starts_with(p)) {
                names.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Problems with the variables of `expr`: only the filters, as `label=~"$filter"`, and
/// `[$__rate_interval]`.
fn variable_problems(expr: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (at, _) in expr.match_indices('$') {
        let rest = &expr[at + 1..];
        let (var, len) = match rest.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').unwrap_or(braced.len());
                (&braced[..end], end + 2)
            }
            None => {
                let end = rest
                    .bytes()
                    .position(|c| !(c.is_ascii_alphanumeric() || c == b'_'))
                    .unwrap_or(rest.len());
                (&rest[..end], end)
            }
        };
        let (before, after) = (&expr[..at], &expr[at + 1 + len..]);
        if FILTERS.contains(&var) {
            if !(before.ends_with("=~\"") && after.starts_with('"')) {
                problems.push(format!("${var} outside a =~\"${var}\" matcher"));
            }
        } else if var == RATE_INTERVAL {
            if !(before.ends_with('[') && after.starts_with(']')) {
                problems.push(format!("${var} outside a [${var}] range"));
            }
        } else {
            problems.push(format!(
                "the variable ${var} (only $namespace, $pipeline, $worker and $__rate_interval)"
            ));
        }
    }
    problems
}

#[test]
fn queries_use_only_granary_metrics_and_the_dashboard_variables() {
    let mut allowed: BTreeSet<String> = METRICS.iter().map(|m| m.to_string()).collect();
    for histogram in HISTOGRAMS {
        for suffix in ["_bucket", "_sum", "_count"] {
            allowed.insert(format!("{histogram}{suffix}"));
        }
    }
    allowed.extend(PROCESS_METRICS.iter().map(|m| m.to_string()));
    let mut problems = Vec::new();
    for (file, doc) in dashboards() {
        let mut used = BTreeSet::new();
        for (place, expr) in expressions(&doc) {
            for metric in metric_names(&expr, &["granary_", "process_"]) {
                if !allowed.contains(&metric) {
                    problems.push(format!("{file}: {place}: {metric} is not a Granary metric: {expr}"));
                }
                if metric.ends_with("_bucket") && !expr.contains("by (le") {
                    problems.push(format!("{file}: {place}: {metric} without `sum by (le, ...)`: {expr}"));
                }
                used.insert(metric);
            }
            if !place.starts_with("variable") && metric_names(&expr, &["granary_"]).is_empty() {
                problems.push(format!("{file}: {place}: no Granary metric in {expr:?}"));
            }
            for problem in variable_problems(&expr) {
                problems.push(format!("{file}: {place}: {problem}: {expr}"));
            }
        }
        if used.is_empty() {
            problems.push(format!("{file}: no queries"));
        }
    }
    report("dashboard queries", problems);
}

#[test]
fn the_query_checks_catch_what_they_should() {
    let names = metric_names(
        r#"sum by (le) (rate(granary_worker_split_seconds_bucket{worker=~"granary_not_a_metric"}[5m])) / process_open_fds"#,
        &["granary_", "process_"],
    );
    assert_eq!(names, ["granary_worker_split_seconds_bucket", "process_open_fds"]);
    assert!(
        variable_problems(r#"rate(x{namespace=~"$namespace",worker=~"$worker"}[$__rate_interval])"#)
            .is_empty()
    );
    assert_eq!(variable_problems(r#"rate(x{namespace="$namespace"}[$__interval])"#).len(), 2);
    assert_eq!(variable_problems(r#"x{pipeline=~"${pipeline}"} / ${DS_PROMETHEUS}"#).len(), 1);
}
