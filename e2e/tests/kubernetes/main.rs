//! `granary operator` against a real Kubernetes API server.
//!
//! Set `GRANARY_E2E_KUBECONFIG` to the path of a kubeconfig with cluster-admin rights to run these;
//! without it every test prints one `skipped: ...` line and passes. scripts/test runs them against
//! the control plane of e2e/cluster (kube-apiserver, kube-controller-manager and kube-scheduler
//! 1.20 built from Debian's source package, and the test node agent `granary-e2e-node`, which runs
//! the pods bound to its Node as local processes).
//!
//! Each test creates a fresh namespace, installs the `InputPipeline` CRD, applies the Helm chart's
//! ServiceAccount and RBAC for a release in that namespace (see `identity.rs`), and starts
//! `granary operator` as a child process of the test, outside the cluster, authenticated as that
//! ServiceAccount (never as admin), watching only that namespace. At the end it deletes the
//! pipelines (while the operator still runs, so that it removes its finalizer), stops the operator
//! and deletes the namespace and any cluster-scoped object it applied, also when the test failed.
//!
//! The API server may be as old as Kubernetes 1.20 and may run alone, without
//! kube-controller-manager, scheduler or nodes:
//! - servers before 1.25 drop the CRD's CEL rules (`x-kubernetes-validations`), so a spec only CEL
//!   rejects may be admitted and then reported as `Ready=False` with reason `InvalidSpec`;
//! - without kube-controller-manager there is no garbage collector, so owned objects outlive their
//!   owner: the deletion test then checks the ownerReferences only, and says so;
//! - without a Ready node no worker pod runs: the tests that need one skip, and say so.
//!
//! Settings: `GRANARY_E2E_IMAGE` (worker image, default `ghcr.io/granary-dev/granary:0.1.0`; the
//! node agent ignores it), `GRANARY_BIN` (the `granary` binary, default the one built next to the
//! tests), `GRANARY_HELM` (Helm 3, default the one scripts/test installs), and for clusters whose
//! pods run elsewhere, `GRANARY_E2E_DISPATCHER_LISTEN` (default `127.0.0.1:<a free port>`) and
//! `GRANARY_E2E_DISPATCHER_ADVERTISE` (what workers dial; default the listen address, right for
//! workers on this host). Operator logs go to the test's stderr.

mod helm;
mod identity;
mod idle;
mod outage;
mod python;
mod running;
mod secured;

use anyhow::{Context, Result, bail, ensure};
use granary_crds::InputPipeline;
use granary_e2e::Proc;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, CustomResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The variable that enables these tests: the path of a kubeconfig.
const KUBECONFIG_VAR: &str = "GRANARY_E2E_KUBECONFIG";
/// The worker image when `GRANARY_E2E_IMAGE` is unset.
const DEFAULT_IMAGE: &str = "ghcr.io/granary-dev/granary:0.1.0";
/// The operator's field manager, Event reportingController and `managed-by` label value.
const OPERATOR: &str = "granary-operator";
/// The field manager of the operator's writes through the scale subresource.
const SCALE_MANAGER: &str = "granary-autoscaler";
/// The operator's finalizer on every InputPipeline.
const FINALIZER: &str = "granary.dev/cleanup";
/// The field manager of what the tests themselves apply.
const TEST_MANAGER: &str = "granary-e2e";
/// How long the operator gets for each step.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long a worker pod gets to become Ready (image pull included).
const WORKER_DEADLINE: Duration = Duration::from_secs(120);
/// How long a Deployment may go without `status.observedGeneration` before we conclude that no
/// deployment controller (so no kube-controller-manager, so no garbage collector) runs.
const CONTROLLER_PROBE: Duration = Duration::from_secs(10);
/// The phases of the contract.
const PHASES: &[&str] = &["Pending", "Running", "Degraded", "Failed", "Completed"];

// ------------------------------------------------------------------------------------------------
// Tests

/// The operator takes the Lease, and its `/healthz` and `/readyz` answer 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_leads_and_reports_ready() {
    run_test("ready", leads_and_reports_ready).await;
}

/// Every `examples/*.yaml` becomes a worker Deployment and Service, a status and an Event; the
/// manifests of `examples/python-stage/` are admitted as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_reconcile_into_workers_status_and_events() {
    run_test("examples", examples_reconcile).await;
}

/// `spec.scaling` reaches the Deployment through its scale subresource only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_goes_through_the_scale_subresource() {
    run_test("scaling", scaling_through_scale_subresource).await;
}

/// Invalid specs are rejected at admission or reported as `InvalidSpec`, and get no workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_rejected_or_reported() {
    run_test("invalid", invalid_specs).await;
}

/// A spec change is observed and keeps the same Deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_change_is_observed_in_place() {
    run_test("update", spec_change_observed).await;
}

/// A deleted pipeline goes (finalizer removed), and so do its workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pipeline_is_cleaned_up() {
    run_test("delete", clean_deletion).await;
}

/// With a Ready node, one worker pod runs and the status counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_run_and_are_counted() {
    run_test("running", workers_running).await;
}

/// The whole loop: pipeline → workers → a trainer's epochs exactly once → the autoscaler scales and
/// pods follow → status and Events explain → deletion stops the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_runs_scales_and_stops_on_a_node() {
    run_test("loop", running::whole_loop).await;
}

/// `minWorkers: 0`: no worker until a trainer connects, none again `idleAfter` after it left,
/// workers again for a trainer that resumes, none once the epoch is complete; exactly once
/// across it all, and standard conditions throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pipeline_scales_to_zero_and_back() {
    run_test("idle", idle::scale_to_zero).await;
}

/// A `python.map` stage whose code is a ConfigMap (`spec.python.configMap`) runs in the worker
/// pod: a trainer receives every element as the function returned it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_stage_from_a_config_map_runs_on_a_node() {
    run_test("python", python::config_map_stage).await;
}

/// With security on: the CA and key Secrets, each pipeline's worker and trainer Secrets; a
/// trainer holding its pipeline's Secret consumes every element once, and one without it (or
/// with another pipeline's) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_holding_the_pipelines_secret_consumes_and_others_are_refused() {
    run_test("secured", secured::secured).await;
}

/// kube-apiserver stopped for 30 s under a running pipeline: the trainer keeps receiving batches,
/// and afterwards the operator converges (status, exactly one of each child object, a spec change
/// reconciled). Runs alone (`.config/nextest.toml`): the outage would stall every other test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_keeps_trainers_fed_and_the_operator_converges() {
    run_test("outage", outage::api_server_outage).await;
}

/// Without `patch` on `deployments/scale`, the failure is reported in status and an Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_reported() {
    run_test_with(
        "forbidden",
        |rbac| identity::without_permission(rbac, "deployments/scale", "patch"),
        running::missing_permission,
    )
    .await;
}

/// The pipelines these tests create are valid or invalid for granary's own validation as the
/// tests expect (runs without a cluster).
#[test]
fn test_specs_pass_or_fail_granary_validation_as_intended() {
    let valid = [
        base_spec(),
        with_scaling(json!({"policy": "fixed", "replicas": 3})),
        with_scaling(json!({"policy": "auto", "minWorkers": 2, "maxWorkers": 4})),
        with_scaling(json!({"policy": "auto", "minWorkers": 3, "maxWorkers": 4})),
        with_scaling(json!({"policy": "fixed", "replicas": 1})),
    ];
    for spec in valid {
        let problems = problems_of(&spec);
        assert!(problems.is_empty(), "{spec}: {problems:?}");
    }
    let problems = problems_of(&with_scaling(json!({"policy": "fixed"})));
    assert!(problems.iter().any(|p| p.starts_with("spec.scaling")), "{problems:?}");
    let problems = problems_of(&unknown_cache_stage_spec());
    assert!(problems.iter().any(|p| p.starts_with("spec.cache.at")), "{problems:?}");
}

// ------------------------------------------------------------------------------------------------
// Scenarios: each runs inside `run_test`, against a fresh namespace and operator.

/// The ready line, `/healthz` and `/readyz` 200, and the Lease held by this operator.
async fn leads_and_reports_ready(c: Cluster) -> Result<()> {
    ensure!(!c.dispatcher.is_empty(), "the operator printed an empty dispatcher address");
    wait_http_ok(&c.metrics, "/healthz", Duration::from_secs(10)).await?;
    wait_http_ok(&c.metrics, "/readyz", Duration::from_secs(30)).await?;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    wait_for(DEADLINE, format!("Lease {OPERATOR} to be held by {}", c.identity), async || {
        let lease = leases.get_opt(OPERATOR).await?.context("no Lease yet")?;
        let holder = lease.spec.and_then(|s| s.holder_identity);
        ensure!(holder.as_deref() == Some(c.identity.as_str()), "holderIdentity is {holder:?}");
        Ok(())
    })
    .await
}

/// Applies every example as it is (its relative `file:` URLs resolve from `/` in the operator, where
/// nothing exists, hence `SourceUnavailable`).
async fn examples_reconcile(c: Cluster) -> Result<()> {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)
        .with_context(|| format!("listing {}", examples.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no examples in {}", examples.display());
    let mut names = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        serde_norway::from_str::<InputPipeline>(&text)
            .with_context(|| format!("{} is not an InputPipeline", file.display()))?;
        let mut object: Value =
            serde_norway::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        object["metadata"]["namespace"] = json!(c.ns);
        let name = object["metadata"]["name"]
            .as_str()
            .with_context(|| format!("{} has no metadata.name", file.display()))?
            .to_string();
        let object: DynamicObject = serde_json::from_value(object)?;
        c.pipelines()
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating {} from {}", name, file.display()))?;
        names.push(name);
    }
    for name in &names {
        wait_for(DEADLINE, format!("InputPipeline {name}'s workers, status and Event"), async || {
            let p = c.pipeline(name).await?;
            check_workers(&c, &p).await?;
            check_reconciled(&p)?;
            let ready = condition(&p, "Ready").context("no Ready condition")?;
            ensure!(
                ready["reason"] != "InvalidSpec",
                "the example is reported invalid: {ready}; note that the Deployment exists regardless"
            );
            ensure!(has_finalizer(&p), "no finalizer {FINALIZER}: {}", summary(&p));
            let uid = uid_of(&p)?;
            let events = c.operator_events(uid).await?;
            ensure!(!events.is_empty(), "no Event from {OPERATOR} regarding uid {uid}");
            eprintln!(
                "{name}: phase {}, Ready {} {}: {}; events {:?}",
                p.data.pointer("/status/phase").unwrap_or(&Value::Null),
                ready["status"],
                ready["reason"],
                ready["message"],
                events.iter().filter_map(|e| e.reason.as_deref()).collect::<Vec<_>>()
            );
            Ok(())
        })
        .await?;
    }
    // examples/python-stage (a ConfigMap and pipelines whose source is an object store this
    // cluster cannot reach): admitted as they are, by a server-side dry run.
    python::python_stage_examples_are_admitted(&c).await
}

/// Fixed 3, fixed 2, then auto 3..4 on one pipeline, and a new auto 2..4 one, read through the
/// scale subresource; the operator's applied manifest never owns `spec.replicas`.
async fn scaling_through_scale_subresource(c: Cluster) -> Result<()> {
    let name = "scaled";
    c.create_pipeline(name, with_scaling(json!({"policy": "fixed", "replicas": 3}))).await?;
    c.wait_scale(name, 3..=3).await?;

    c.patch_spec(name, json!({"scaling": {"replicas": 2}})).await?;
    c.wait_scale(name, 2..=2).await?;
    let deployment = c.deployments().get(&workers(name)).await?;
    let applied = applied_fields(&deployment.metadata, OPERATOR).with_context(|| {
        format!("no Apply entry of {OPERATOR} in managedFields: {:?}", deployment.metadata.managed_fields)
    })?;
    ensure!(
        applied.pointer("/f:spec/f:replicas").is_none(),
        "the Deployment manifest {OPERATOR} applies owns spec.replicas (it must go through the scale \
         subresource only): {applied}"
    );
    if c.version >= (1, 21) {
        let owners: Vec<&str> = deployment
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.fields_v1.as_ref().is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some()))
            .filter_map(|m| m.manager.as_deref())
            .collect();
        ensure!(owners.contains(&SCALE_MANAGER), "spec.replicas is owned by {owners:?}, not {SCALE_MANAGER}");
    } else {
        eprintln!(
            "skipped the check that {SCALE_MANAGER} owns spec.replicas: API server {}.{} predates 1.21, \
             where writes through the scale subresource record no field manager",
            c.version.0, c.version.1
        );
    }

    // From fixed 2 to auto 3..4: the autoscaler keeps the pool within its bounds.
    c.patch_spec(
        name,
        json!({"scaling": {"policy": "auto", "replicas": null, "minWorkers": 3, "maxWorkers": 4}}),
    )
    .await?;
    c.wait_scale(name, 3..=4).await?;

    // A new auto pipeline starts at minWorkers.
    let name = "autoscaled";
    c.create_pipeline(name, with_scaling(json!({"policy": "auto", "minWorkers": 2, "maxWorkers": 4})))
        .await?;
    c.wait_scale(name, 2..=4).await?;
    Ok(())
}

/// A schema rule, a CEL rule and a rule only granary's validation knows.
async fn invalid_specs(c: Cluster) -> Result<()> {
    // (a) A schema rule: every server rejects it at admission.
    let mut spec = base_spec();
    spec["batch"]["size"] = json!(0);
    match c.create_pipeline("zero-batch", spec).await {
        Err(kube::Error::Api(status)) => ensure!(
            status.message.contains("spec.batch.size"),
            "the rejection of batch.size 0 does not name spec.batch.size: {status:?}"
        ),
        Err(e) => return Err(e).context("creating a pipeline with batch.size 0"),
        Ok(_) => bail!("a pipeline with batch.size 0 was admitted"),
    }

    // (b) A CEL rule: rejected at admission where the server runs CEL, else reported in status.
    let name = "fixed-without-replicas";
    match c.create_pipeline(name, with_scaling(json!({"policy": "fixed"}))).await {
        Err(kube::Error::Api(status)) => ensure!(
            status.message.contains("policy `fixed` needs `replicas`"),
            "the rejection of `policy: fixed` without replicas does not give the rule's message: {status:?}"
        ),
        Err(e) => return Err(e).context("creating a pipeline with `policy: fixed` and no replicas"),
        Ok(_) => {
            eprintln!(
                "{name}: admitted (this server does not run the CRD's CEL rules); expecting InvalidSpec"
            );
            expect_invalid(&c, name, "spec.scaling").await?;
        }
    }

    // (c) Only granary's validation knows the stage names.
    let name = "unknown-cache-stage";
    c.create_pipeline(name, unknown_cache_stage_spec()).await?;
    expect_invalid(&c, name, "spec.cache.at").await?;
    let uid = uid_of(&c.pipeline(name).await?)?.to_string();
    wait_for(DEADLINE, format!("a Warning Event InvalidSpec regarding {name}"), async || {
        let events = c.operator_events(&uid).await?;
        let found = events
            .iter()
            .any(|e| e.reason.as_deref() == Some("InvalidSpec") && e.type_.as_deref() == Some("Warning"));
        ensure!(
            found,
            "events: {:?}",
            events.iter().map(|e| (&e.type_, &e.reason, &e.note)).collect::<Vec<_>>()
        );
        Ok(())
    })
    .await
}

/// A batch size change raises the generation, which the status catches up with, in place.
async fn spec_change_observed(c: Cluster) -> Result<()> {
    let name = "updated";
    c.create_pipeline(name, base_spec()).await?;
    let (deployment, _) = c.wait_workers(name).await?;
    let before = c.wait_reconciled(name).await?;
    let uid = deployment.metadata.uid.context("the Deployment has no uid")?;

    let patched = c.patch_spec(name, json!({"batch": {"size": 16}})).await?;
    ensure!(
        patched.metadata.generation > before.metadata.generation,
        "the spec change did not raise the generation: {:?} → {:?}",
        before.metadata.generation,
        patched.metadata.generation
    );
    let after = c.wait_reconciled(name).await?;
    ensure!(
        after.metadata.generation == patched.metadata.generation,
        "the generation moved again: {}",
        summary(&after)
    );
    let (deployment, _) = c.wait_workers(name).await?;
    ensure!(
        deployment.metadata.uid.as_deref() == Some(uid.as_str()),
        "the Deployment was replaced: uid {uid} → {:?}",
        deployment.metadata.uid
    );
    Ok(())
}

/// Deleting a pipeline: it goes, and its Deployment and Service are garbage-collected (or, with no
/// garbage collector, point at it as their controller).
async fn clean_deletion(c: Cluster) -> Result<()> {
    let name = "doomed";
    c.create_pipeline(name, base_spec()).await?;
    c.wait_workers(name).await?;
    let p = c.wait_reconciled(name).await?;
    ensure!(has_finalizer(&p), "no finalizer {FINALIZER}: {}", summary(&p));
    let uid = uid_of(&p)?.to_string();
    let gc = c.deployment_controller_runs(&workers(name)).await?;

    c.pipelines().delete(name, &DeleteParams::default()).await.context("deleting the pipeline")?;
    wait_for(DEADLINE, format!("InputPipeline {name} to be gone"), async || {
        match c.pipelines().get_opt(name).await? {
            Some(p) => bail!("still there: {}", summary(&p)),
            None => Ok(()),
        }
    })
    .await?;

    if gc {
        wait_for(
            DEADLINE,
            format!("Deployment and Service {} to be garbage-collected", workers(name)),
            async || {
                let deployment = c.deployments().get_opt(&workers(name)).await?;
                let service = c.services().get_opt(&workers(name)).await?;
                ensure!(deployment.is_none(), "the Deployment is still there");
                ensure!(service.is_none(), "the Service is still there");
                Ok(())
            },
        )
        .await
    } else {
        eprintln!(
            "GC check skipped: Deployment {}/{} got no status.observedGeneration within {CONTROLLER_PROBE:?}, so \
             no kube-controller-manager runs and nothing garbage-collects owned objects; checked their \
             controller ownerReferences instead",
            c.ns,
            workers(name)
        );
        // The operator may have deleted them itself; what remains must name the deleted pipeline.
        if let Some(d) = c.deployments().get_opt(&workers(name)).await? {
            check_controller_owner("the Deployment", &d.metadata, &uid)?;
        }
        if let Some(s) = c.services().get_opt(&workers(name)).await? {
            check_controller_owner("the Service", &s.metadata, &uid)?;
        }
        Ok(())
    }
}

/// With a Ready node and kube-controller-manager: one worker pod becomes Ready and the status
/// reads `1/1`.
async fn workers_running(c: Cluster) -> Result<()> {
    let Some(node) = c.ready_node().await? else {
        eprintln!(
            "skipped workers_run_and_are_counted: the cluster has no Ready node, so no worker pod can run"
        );
        return Ok(());
    };
    eprintln!("node {node} is Ready");
    let name = "running";
    c.create_pipeline(name, with_scaling(json!({"policy": "fixed", "replicas": 1}))).await?;
    c.wait_workers(name).await?;
    if !c.deployment_controller_runs(&workers(name)).await? {
        eprintln!(
            "skipped workers_run_and_are_counted: Deployment {}/{} got no status.observedGeneration within \
             {CONTROLLER_PROBE:?}, so no kube-controller-manager runs and no pod is created",
            c.ns,
            workers(name)
        );
        return Ok(());
    }
    wait_for(
        WORKER_DEADLINE,
        format!("Deployment {} to report readyReplicas 1", workers(name)),
        async || {
            let d = c.deployments().get(&workers(name)).await?;
            let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
            if ready != 1 {
                bail!("readyReplicas {ready}; pods: {}", c.describe_pods(name).await);
            }
            Ok(())
        },
    )
    .await?;
    wait_for(DEADLINE, format!("InputPipeline {name} to report workers 1/1"), async || {
        let p = c.pipeline(name).await?;
        let workers = p.data.pointer("/status/workers").and_then(Value::as_str);
        ensure!(workers == Some("1/1"), "{}", summary(&p));
        Ok(())
    })
    .await
}

// ------------------------------------------------------------------------------------------------
// Test specs

/// A valid spec whose source does not exist (absolute `file:` URL: valid, but nothing to list).
fn base_spec() -> Value {
    json!({
        "source": {"url": "file:///granary-e2e/no-such-data/", "format": "files"},
        "stages": [
            {"op": "image.decode", "name": "decode"},
            {"op": "image.random_resized_crop", "size": 32},
        ],
        "batch": {"size": 8},
    })
}

/// [`base_spec`] with `scaling`.
fn with_scaling(scaling: Value) -> Value {
    let mut spec = base_spec();
    spec["scaling"] = scaling;
    spec
}

/// Passes the CRD's schema and CEL rules, but caches at a stage that does not exist.
fn unknown_cache_stage_spec() -> Value {
    let mut spec = base_spec();
    spec["cache"] = json!({"policy": "at", "at": "no-such-stage", "store": "file:///tmp/c/"});
    spec
}

/// granary's validation of `spec`, as `path: message` lines.
fn problems_of(spec: &Value) -> Vec<String> {
    let spec: granary_crds::InputPipelineSpec = serde_json::from_value(spec.clone()).expect("a spec");
    granary_crds::validate(&spec).iter().map(|p| p.to_string()).collect()
}

// ------------------------------------------------------------------------------------------------
// Harness

/// Runs `body` against a fresh namespace watched by a fresh operator, then cleans up whatever
/// happened (a panic in `body` included) and fails the test with `body`'s error. Without
/// `GRANARY_E2E_KUBECONFIG` prints why it skips and returns.
async fn run_test<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Cluster) -> Fut,
    Fut: Future<Output = Result<()>> + 'static,
{
    run_test_with(test, |_| Ok(()), body).await;
}

/// [`run_test`] with the chart's RBAC objects changed by `edit` before they are applied.
async fn run_test_with<F, Fut>(test: &str, edit: impl FnOnce(&mut Vec<Value>) -> Result<()>, body: F)
where
    F: FnOnce(Cluster) -> Fut,
    Fut: Future<Output = Result<()>> + 'static,
{
    let Some(kubeconfig) = kubeconfig_or_skip(test) else { return };
    let binary = granary_e2e::granary_bin();
    let client = connect(&kubeconfig).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    install_crd(&client).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    let mut ns = TestNamespace::create(&client, test).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    let identity = format!("e2e-{}", ns.suffix);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{test}: a temporary directory: {e}"));
    let operator_kubeconfig = dir.path().join("operator.kubeconfig");
    let started = async {
        let mut rbac = identity::chart_rbac(&ns.name)?;
        edit(&mut rbac)?;
        ns.cluster_scoped = identity::apply(&client, &ns.name, TEST_MANAGER, &rbac).await?;
        let account = identity::service_account(&rbac)?;
        identity::service_account_kubeconfig(&client, &kubeconfig, &ns.name, &account, &operator_kubeconfig)
            .await?;
        eprintln!("the operator runs as ServiceAccount {}/{account} under the chart's RBAC", ns.name);
        let journal = dir.path().join("journal");
        std::fs::create_dir_all(&journal).context("the journal folder")?;
        Operator::start(&binary, &operator_kubeconfig, &journal, &ns.name, &identity, None).await
    };
    let outcome = match started.await {
        Ok(operator) => {
            let launch = Launch {
                binary: binary.clone(),
                kubeconfig: operator_kubeconfig.clone(),
                journal: dir.path().join("journal"),
                ns: ns.name.clone(),
                identity: identity.clone(),
                listen: operator.listen.clone(),
            };
            let handle = OperatorHandle {
                slot: std::sync::Arc::new(std::sync::Mutex::new(Some(operator))),
                launch: std::sync::Arc::new(launch),
            };
            let operator =
                handle.slot.lock().map(|o| o.as_ref().map(|o| (o.dispatcher.clone(), o.metrics.clone())));
            let Ok(Some((dispatcher, metrics))) = operator else { panic!("{test}: the operator slot") };
            let cluster = Cluster {
                client: client.clone(),
                ns: ns.name.clone(),
                identity,
                dispatcher,
                metrics,
                version: operator_version(&client).await,
                operator: handle.clone(),
            };
            let local = tokio::task::LocalSet::new();
            let task = local.spawn_local(body(cluster));
            let outcome = local.run_until(task).await;
            // While the operator still runs, so that it removes its finalizer.
            ns.release_pipelines().await;
            drop(handle.slot.lock().map(|mut o| o.take()));
            outcome
        }
        Err(e) => Ok(Err(e)),
    };
    ns.delete().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{test} (namespace {}): {e:#}", ns.name),
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => panic!("{test}: {join}"),
    }
}

/// The kubeconfig path from `GRANARY_E2E_KUBECONFIG`, or `None` after printing the skip line.
fn kubeconfig_or_skip(test: &str) -> Option<PathBuf> {
    match std::env::var_os(KUBECONFIG_VAR) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            Some(std::path::absolute(&path).unwrap_or(path))
        }
        _ => {
            eprintln!(
                "skipped: {KUBECONFIG_VAR} is not set (the path of a kubeconfig for the Kubernetes API \
                 server to run the `{test}` scenario against)"
            );
            None
        }
    }
}

/// The API server's `(major, minor)` version; `(1, 0)` when unreadable.
async fn operator_version(client: &Client) -> (u32, u32) {
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
    match client.apiserver_version().await {
        Ok(info) => (number(&info.major), number(&info.minor)),
        Err(_) => (1, 0),
    }
}

/// A client for the current context of `kubeconfig`, once the API server answered.
async fn connect(kubeconfig: &Path) -> Result<Client> {
    let file =
        Kubeconfig::read_from(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))?;
    let client = Client::try_from(config).context("building a Kubernetes client")?;
    let version = client.apiserver_version().await.context("asking the API server for its version")?;
    eprintln!("API server {}", version.git_version);
    Ok(client)
}

/// Installs (or updates) the InputPipeline CRD by server-side apply and waits until it is
/// Established. Servers whose apply rejects fields they do not know (before 1.23 the CRD schema has
/// no `x-kubernetes-validations`) get a create or replace instead, which drops such fields.
async fn install_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = InputPipeline::crd();
    let name = crd.metadata.name.clone().context("the generated CRD has no name")?;
    let apply = crds.patch(&name, &PatchParams::apply(TEST_MANAGER).force(), &Patch::Apply(&crd)).await;
    match apply {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.message.contains("not declared in schema") => {
            eprintln!(
                "server-side apply of the CRD failed ({}); creating or replacing it instead",
                status.message
            );
            create_or_replace(&crds, crd).await?;
        }
        Err(e) => return Err(e).context("server-side apply of the InputPipeline CRD"),
    }
    wait_for(DEADLINE, format!("CRD {name} to be Established"), async || {
        let crd = crds.get(&name).await?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        let established = conditions.iter().any(|c| c.type_ == "Established" && c.status == "True");
        ensure!(established, "conditions: {conditions:?}");
        Ok(())
    })
    .await
}

/// Creates `crd`, or replaces the one there; retries when another test raced it.
async fn create_or_replace(
    crds: &Api<CustomResourceDefinition>,
    mut crd: CustomResourceDefinition,
) -> Result<()> {
    let name = crd.metadata.name.clone().context("the generated CRD has no name")?;
    let mut last = None;
    for _ in 0..5 {
        let result = match crds.get_opt(&name).await? {
            None => crds.create(&PostParams::default(), &crd).await,
            Some(current) => {
                crd.metadata.resource_version = current.metadata.resource_version;
                crds.replace(&name, &PostParams::default(), &crd).await
            }
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => last = Some(status),
            Err(e) => return Err(e).context("creating or replacing the InputPipeline CRD"),
        }
    }
    bail!("the InputPipeline CRD kept changing under us: {last:?}")
}

/// Polls `check` every half second until it succeeds, and fails after `timeout` with `what` and
/// the last error, which should describe the state last observed.
async fn wait_for<T>(
    timeout: Duration,
    what: impl Display,
    mut check: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        let attempt = match tokio::time::timeout(Duration::from_secs(20), check()).await {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!("a check took more than 20 s")),
        };
        match attempt {
            Ok(value) => return Ok(value),
            Err(e) if start.elapsed() >= timeout => {
                return Err(e.context(format!("timed out after {timeout:?} waiting for {what}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The value of the environment variable `name`, when set and not empty.
fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A namespace of one test, with a unique name.
struct TestNamespace {
    client: Client,
    /// `granary-e2e-<test>-<suffix>`.
    name: String,
    /// The unique part of the name.
    suffix: String,
    /// Cluster-scoped objects made for the test, `(kind, name)`: deleted with the namespace.
    cluster_scoped: Vec<(String, String)>,
}

impl TestNamespace {
    /// Creates `granary-e2e-<test>-<unique suffix>`.
    async fn create(client: &Client, test: &str) -> Result<Self> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        let suffix = format!("{:x}{:x}", nanos % 0x1_0000_0000, std::process::id());
        let name = format!("granary-e2e-{test}-{suffix}");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/part-of".to_string(),
                    "granary-e2e".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        eprintln!("namespace {name}");
        Ok(Self { client: client.clone(), name, suffix, cluster_scoped: Vec::new() })
    }

    fn pipelines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.name, &ApiResource::erase::<InputPipeline>(&()))
    }

    /// Deletes every InputPipeline and waits up to 30 s for the operator to remove its finalizers.
    async fn release_pipelines(&self) {
        let pipelines = self.pipelines();
        if let Err(e) = pipelines.delete_collection(&DeleteParams::default(), &ListParams::default()).await {
            eprintln!("cleanup: deleting the pipelines of {}: {e}", self.name);
            return;
        }
        let released =
            wait_for(Duration::from_secs(30), "the operator to release the pipelines", async || {
                let left = pipelines.list(&ListParams::default()).await?.items;
                ensure!(left.is_empty(), "{} left", left.len());
                Ok(())
            })
            .await;
        if let Err(e) = released {
            eprintln!("cleanup: {e:#}");
        }
    }

    /// Removes finalizers left on pipelines (the operator has stopped) and deletes the namespace,
    /// without waiting: without kube-controller-manager a namespace never finishes terminating.
    async fn delete(&self) {
        let pipelines = self.pipelines();
        if let Ok(left) = pipelines.list(&ListParams::default()).await {
            for p in left.items {
                let Some(name) = p.metadata.name else { continue };
                let patch = json!({"metadata": {"finalizers": null}});
                if let Err(e) = pipelines.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    eprintln!("cleanup: removing the finalizers of {name}: {e}");
                }
            }
        }
        identity::delete_cluster_scoped(&self.client, &self.cluster_scoped).await;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = namespaces.delete(&self.name, &DeleteParams::default()).await {
            eprintln!("cleanup: deleting namespace {}: {e}", self.name);
        }
    }
}

/// `granary operator` running as a child process of the test; killed on drop.
struct Operator {
    proc: Proc,
    /// The address given to `--dispatcher-listen`.
    listen: String,
    /// Where its dispatcher listens.
    dispatcher: String,
    /// Where it serves `/metrics`, `/healthz` and `/readyz`.
    metrics: String,
}

impl Operator {
    /// Starts the operator on namespace `ns`, journaling in folder `journal`, and waits (up to 60 s) for the line
    /// `{"dispatcher": "...", "metrics": "..."}` it prints on stdout once it serves. Its other
    /// stdout lines are copied to stderr; its stderr is the test's. Its dispatcher listens on
    /// `listen` when given (an operator started again keeps its address).
    async fn start(
        binary: &Path,
        kubeconfig: &Path,
        journal: &Path,
        ns: &str,
        identity: &str,
        listen: Option<&str>,
    ) -> Result<Self> {
        let image = env_nonempty("GRANARY_E2E_IMAGE").unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        // Workers run on this host (the test node agent runs pods as local processes), where the
        // in-cluster default address does not resolve: they dial the address the dispatcher
        // listens on.
        let listen = listen
            .map(str::to_string)
            .or_else(|| env_nonempty("GRANARY_E2E_DISPATCHER_LISTEN"))
            .unwrap_or_else(|| format!("127.0.0.1:{}", granary_e2e::free_port()));
        let advertise = env_nonempty("GRANARY_E2E_DISPATCHER_ADVERTISE").unwrap_or_else(|| listen.clone());
        let mut command = Command::new(binary);
        command
            .args(["operator", "--namespace", ns, "--lease-namespace", ns, "--identity", identity])
            .args(["--dispatcher-listen", &listen, "--dispatcher-advertise", &advertise])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .arg("--journal")
            .arg(journal)
            .args(["--worker-image", &image, "--policy-period", "2"])
            // The whole suite runs with TLS and authentication on, as the chart installs it.
            .arg("--security");
        let mut child = command
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} operator", binary.display()))?;
        let stdout = child.stdout.take().context("the operator's stdout")?;
        let mut proc = Proc { child };
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                eprintln!("[operator stdout] {line}");
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, lines.recv()).await {
                Ok(Some(line)) => {
                    if let Some((dispatcher, metrics)) = parse_ready_line(&line) {
                        eprintln!("operator {identity}: dispatcher {dispatcher}, metrics {metrics}");
                        return Ok(Self { proc, listen, dispatcher, metrics });
                    }
                }
                Ok(None) => {
                    let status = proc.child.wait().context("waiting for the operator")?;
                    bail!("granary operator exited ({status}) before printing its addresses");
                }
                Err(_) => bail!(
                    "granary operator printed no {{\"dispatcher\", \"metrics\"}} line within {DEADLINE:?}"
                ),
            }
        }
    }
}

/// What starting the operator again takes.
struct Launch {
    binary: PathBuf,
    kubeconfig: PathBuf,
    journal: PathBuf,
    ns: String,
    identity: String,
    /// Its dispatcher's address, kept by a restart.
    listen: String,
}

/// The test's operator process, which a scenario may find exited and start again, as Kubernetes
/// restarts a pod whose process ended.
#[derive(Clone)]
struct OperatorHandle {
    slot: std::sync::Arc<std::sync::Mutex<Option<Operator>>>,
    launch: std::sync::Arc<Launch>,
}

impl OperatorHandle {
    /// How the operator process ended, if it did.
    fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut slot = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.as_mut().and_then(|o| o.proc.child.try_wait().ok().flatten())
    }

    /// Kills the operator process (SIGKILL, as a node failure would) and waits for it to end.
    fn kill(&self) -> Result<()> {
        let mut slot = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let operator = slot.as_mut().context("no operator process")?;
        operator.proc.signal(libc::SIGKILL);
        ensure!(operator.proc.wait_for(Duration::from_secs(10)), "the operator outlived SIGKILL");
        Ok(())
    }

    /// Starts the operator again with the same settings and dispatcher address, replacing the
    /// ended process; returns its metrics address.
    async fn restart(&self) -> Result<String> {
        let l = &self.launch;
        let fresh =
            Operator::start(&l.binary, &l.kubeconfig, &l.journal, &l.ns, &l.identity, Some(&l.listen))
                .await?;
        let metrics = fresh.metrics.clone();
        let mut slot = self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(fresh);
        Ok(metrics)
    }
}

/// The dispatcher and metrics addresses of the operator's ready line, if `line` is that line.
fn parse_ready_line(line: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(line.trim()).ok()?;
    Some((v.get("dispatcher")?.as_str()?.to_string(), v.get("metrics")?.as_str()?.to_string()))
}

/// Waits up to `timeout` for `GET http://ADDR/PATH` to answer 200.
async fn wait_http_ok(addr: &str, path: &str, timeout: Duration) -> Result<()> {
    wait_for(timeout, format!("GET http://{addr}{path} to answer 200"), async || {
        let status = http_status(addr, path).await?;
        ensure!(status == 200, "it answered {status}");
        Ok(())
    })
    .await
}

/// The status code of `GET http://ADDR/PATH`.
async fn http_status(addr: &str, path: &str) -> Result<u16> {
    let (addr, path) = (addr.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || blocking_http_status(&addr, &path)).await.context("the HTTP probe")?
}

fn blocking_http_status(addr: &str, path: &str) -> Result<u16> {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};
    let timeout = Duration::from_secs(5);
    let socket = addr.to_socket_addrs()?.next().with_context(|| format!("{addr} resolves to nothing"))?;
    let mut stream =
        TcpStream::connect_timeout(&socket, timeout).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    head.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP response from {addr}{path}: {head:?}"))
}

/// What a scenario works with: a client, its namespace and the operator watching it.
#[derive(Clone)]
struct Cluster {
    client: Client,
    /// The test's namespace, which the operator watches and holds its Lease in.
    ns: String,
    /// The operator's `--identity`.
    identity: String,
    /// Where the operator's dispatcher listens.
    dispatcher: String,
    /// Where the operator serves `/metrics`, `/healthz` and `/readyz`.
    metrics: String,
    /// The API server's `(major, minor)` version.
    version: (u32, u32),
    /// The operator process.
    operator: OperatorHandle,
}

impl Cluster {
    /// InputPipelines in the namespace, as JSON (not tied to the Rust status type).
    fn pipelines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, &ApiResource::erase::<InputPipeline>(&()))
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates InputPipeline `name` with `spec`; the API error is returned as is.
    async fn create_pipeline(&self, name: &str, spec: Value) -> kube::Result<DynamicObject> {
        let object = DynamicObject::new(name, &ApiResource::erase::<InputPipeline>(&()))
            .within(&self.ns)
            .data(json!({ "spec": spec }));
        self.pipelines().create(&PostParams::default(), &object).await
    }

    /// InputPipeline `name`.
    async fn pipeline(&self, name: &str) -> Result<DynamicObject> {
        self.pipelines().get(name).await.with_context(|| format!("getting InputPipeline {name}"))
    }

    /// Merge-patches InputPipeline `name`'s spec with `spec`.
    async fn patch_spec(&self, name: &str, spec: Value) -> Result<DynamicObject> {
        let patch = json!({ "spec": spec });
        self.pipelines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching InputPipeline {name} with {patch}"))
    }

    /// Waits until the workers of `name` exist as the contract says ([`check_workers`]).
    async fn wait_workers(&self, name: &str) -> Result<(Deployment, Service)> {
        wait_for(DEADLINE, format!("the workers of InputPipeline {name}"), async || {
            check_workers(self, &self.pipeline(name).await?).await
        })
        .await
    }

    /// Waits until the status of `name` describes its current generation ([`check_reconciled`]).
    async fn wait_reconciled(&self, name: &str) -> Result<DynamicObject> {
        wait_for(DEADLINE, format!("InputPipeline {name}'s status to catch up"), async || {
            let p = self.pipeline(name).await?;
            check_reconciled(&p)?;
            Ok(p)
        })
        .await
    }

    /// Waits until the scale subresource of `name`'s Deployment reads a count in `range`.
    async fn wait_scale(&self, name: &str, range: RangeInclusive<i32>) -> Result<()> {
        let deployment = workers(name);
        wait_for(DEADLINE, format!("the scale of Deployment {deployment} to be in {range:?}"), async || {
            let scale = self.deployments().get_scale(&deployment).await?;
            let replicas = scale.spec.and_then(|s| s.replicas);
            ensure!(replicas.is_some_and(|r| range.contains(&r)), "spec.replicas is {replicas:?}");
            Ok(())
        })
        .await
    }

    /// Whether a deployment controller (so kube-controller-manager, so the garbage collector) runs:
    /// it sets `status.observedGeneration` of Deployment `name` within [`CONTROLLER_PROBE`].
    async fn deployment_controller_runs(&self, name: &str) -> Result<bool> {
        let observed = wait_for(CONTROLLER_PROBE, format!("Deployment {name} to be observed"), async || {
            let d = self.deployments().get(name).await?;
            d.status.and_then(|s| s.observed_generation).context("no status.observedGeneration")
        })
        .await;
        Ok(observed.is_ok())
    }

    /// The events.k8s.io/v1 Events the operator reported about the object with `uid`.
    async fn operator_events(&self, uid: &str) -> Result<Vec<Event>> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let all = events.list(&ListParams::default()).await.context("listing Events")?;
        Ok(all
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid))
            .filter(|e| e.reporting_controller.as_deref() == Some(OPERATOR))
            .collect())
    }

    /// The name of a Ready node, if any.
    async fn ready_node(&self) -> Result<Option<String>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let nodes = nodes.list(&ListParams::default()).await.context("listing nodes")?;
        Ok(nodes.items.into_iter().find_map(|n| {
            let conditions = n.status.as_ref()?.conditions.as_ref()?;
            conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(n.metadata.name?)
        }))
    }

    /// The worker pods of `name` in a line, for failure messages.
    async fn describe_pods(&self, name: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let selector = format!("granary.dev/pipeline={name}");
        match pods.list(&ListParams::default().labels(&selector)).await {
            Err(e) => format!("(listing pods: {e})"),
            Ok(list) if list.items.is_empty() => "none".to_string(),
            Ok(list) => list
                .items
                .iter()
                .map(|p| {
                    let status = p.status.as_ref();
                    let containers = status
                        .and_then(|s| s.container_statuses.as_ref())
                        .map(|cs| cs.iter().map(|c| format!("{:?}", c.state)).collect::<Vec<_>>().join(", "))
                        .unwrap_or_default();
                    format!(
                        "{} {} [{}]",
                        p.metadata.name.as_deref().unwrap_or("?"),
                        status.and_then(|s| s.phase.as_deref()).unwrap_or("?"),
                        containers
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Checks of the contract

/// The name of the Deployment and Service of pipeline `name`.
fn workers(name: &str) -> String {
    format!("{name}-workers")
}

/// The labels the contract puts on the Deployment, the Service and the pod template.
fn expected_labels(name: &str) -> [(&'static str, String); 4] {
    [
        ("app.kubernetes.io/name", "granary-worker".to_string()),
        ("app.kubernetes.io/instance", name.to_string()),
        ("app.kubernetes.io/managed-by", OPERATOR.to_string()),
        ("granary.dev/pipeline", name.to_string()),
    ]
}

/// Checks that `labels` hold the contract's labels for pipeline `name`.
fn check_labels(what: &str, labels: Option<&BTreeMap<String, String>>, name: &str) -> Result<()> {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    for (key, value) in expected_labels(name) {
        ensure!(labels.get(key) == Some(&value), "{what} lacks label {key}={value}: {labels:?}");
    }
    Ok(())
}

/// Checks that `meta` has a controller ownerReference to the InputPipeline with `uid`.
fn check_controller_owner(what: &str, meta: &ObjectMeta, uid: &str) -> Result<()> {
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let controller = owners.iter().find(|o| o.controller == Some(true));
    let Some(owner) = controller else { bail!("{what} has no controller ownerReference: {owners:?}") };
    ensure!(
        owner.uid == uid && owner.kind == "InputPipeline" && owner.api_version == "granary.dev/v1alpha1",
        "{what}'s controller ownerReference is not InputPipeline uid {uid}: {owner:?}"
    );
    Ok(())
}

/// The fields `manager` applied (server-side apply) to the object, from its managedFields.
fn applied_fields<'a>(meta: &'a ObjectMeta, manager: &str) -> Option<&'a Value> {
    meta.managed_fields
        .as_deref()?
        .iter()
        .find(|m| m.manager.as_deref() == Some(manager) && m.operation.as_deref() == Some("Apply"))
        .and_then(|m| m.fields_v1.as_ref())
        .map(|f| &f.0)
}

/// Checks the Deployment and headless Service of pipeline `p` against the contract: owner,
/// labels, selector, the worker container's args and env, the field manager, the ports.
async fn check_workers(c: &Cluster, p: &DynamicObject) -> Result<(Deployment, Service)> {
    let name = p.metadata.name.as_deref().context("a pipeline without a name")?;
    let uid = uid_of(p)?;
    let deployment_name = workers(name);
    let Some(deployment) = c.deployments().get_opt(&deployment_name).await? else {
        bail!("no Deployment {deployment_name} yet; the pipeline is {}", summary(p));
    };
    let what = format!("Deployment {deployment_name}");
    check_controller_owner(&what, &deployment.metadata, uid)?;
    check_labels(&what, deployment.metadata.labels.as_ref(), name)?;
    ensure!(
        applied_fields(&deployment.metadata, OPERATOR).is_some(),
        "{what} was not applied by field manager {OPERATOR}: {:?}",
        deployment.metadata.managed_fields
    );
    let spec = deployment.spec.as_ref().with_context(|| format!("{what} has no spec"))?;
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    let expected_selector = BTreeMap::from([
        ("granary.dev/pipeline".to_string(), name.to_string()),
        ("app.kubernetes.io/name".to_string(), "granary-worker".to_string()),
    ]);
    ensure!(selector == expected_selector, "{what} selects {selector:?}, not {expected_selector:?}");
    let template_labels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
    check_labels(&format!("{what}'s pod template"), template_labels, name)?;
    let pod = spec.template.spec.as_ref().with_context(|| format!("{what} has no pod spec"))?;
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == "worker")
        .with_context(|| format!("{what} has no container `worker`"))?;
    let args = container.args.clone().unwrap_or_default();
    let pipeline_arg = format!("{}/{name}", c.ns);
    let names_pipeline = args.windows(2).any(|w| w[0] == "--pipeline" && w[1] == pipeline_arg)
        || args.contains(&format!("--pipeline={pipeline_arg}"));
    ensure!(names_pipeline, "the worker's args lack `--pipeline {pipeline_arg}`: {args:?}");
    let env = container.env.as_deref().unwrap_or_default();
    ensure!(
        env.iter().any(|e| e.name == "GRANARY_DISPATCHER"),
        "the worker's env lacks GRANARY_DISPATCHER: {:?}",
        env.iter().map(|e| &e.name).collect::<Vec<_>>()
    );

    let Some(service) = c.services().get_opt(&deployment_name).await? else {
        bail!("no Service {deployment_name} yet");
    };
    let what = format!("Service {deployment_name}");
    check_controller_owner(&what, &service.metadata, uid)?;
    check_labels(&what, service.metadata.labels.as_ref(), name)?;
    let service_spec = service.spec.as_ref().with_context(|| format!("{what} has no spec"))?;
    ensure!(
        service_spec.cluster_ip.as_deref() == Some("None"),
        "{what} is not headless: clusterIP {:?}",
        service_spec.cluster_ip
    );
    let ports: BTreeMap<&str, i32> =
        service_spec.ports.iter().flatten().filter_map(|p| Some((p.name.as_deref()?, p.port))).collect();
    ensure!(
        ports.get("data") == Some(&7071) && ports.get("metrics") == Some(&9090),
        "{what} ports are {ports:?}, not data 7071 and metrics 9090"
    );
    let service_selector = service_spec.selector.clone().unwrap_or_default();
    let template_labels = template_labels.cloned().unwrap_or_default();
    ensure!(
        !service_selector.is_empty()
            && service_selector.iter().all(|(k, v)| template_labels.get(k) == Some(v)),
        "{what} selector {service_selector:?} does not select the worker pods {template_labels:?}"
    );
    Ok((deployment, service))
}

/// Checks that `p`'s status describes its current generation, has a contract phase, and a
/// `Ready` condition with a reason, a message, a transition time and its generation.
fn check_reconciled(p: &DynamicObject) -> Result<()> {
    let generation = p.metadata.generation;
    let observed = p.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
    ensure!(
        generation.is_some() && observed == generation,
        "observedGeneration {observed:?} is not generation {generation:?}: {}",
        summary(p)
    );
    let phase = p.data.pointer("/status/phase").and_then(Value::as_str);
    ensure!(phase.is_some_and(|ph| PHASES.contains(&ph)), "phase {phase:?} is not one of {PHASES:?}");
    let ready = condition(p, "Ready").with_context(|| format!("no Ready condition: {}", summary(p)))?;
    for field in ["status", "reason", "message", "lastTransitionTime"] {
        ensure!(
            ready[field].as_str().is_some_and(|s| !s.is_empty()),
            "the Ready condition has no {field}: {ready}"
        );
    }
    ensure!(
        ready["observedGeneration"].as_i64() == generation,
        "the Ready condition describes generation {} (metav1.Condition's observedGeneration), not {generation:?}",
        ready["observedGeneration"]
    );
    Ok(())
}

/// Waits until `name` reports `Ready=False` with reason InvalidSpec and a message naming `field`,
/// then checks that it has no workers.
async fn expect_invalid(c: &Cluster, name: &str, field: &str) -> Result<()> {
    wait_for(
        DEADLINE,
        format!("InputPipeline {name} to be reported InvalidSpec naming {field}"),
        async || {
            let p = c.pipeline(name).await?;
            let ready =
                condition(&p, "Ready").with_context(|| format!("no Ready condition: {}", summary(&p)))?;
            ensure!(
                ready["status"] == "False"
                    && ready["reason"] == "InvalidSpec"
                    && ready["message"].as_str().is_some_and(|m| m.contains(field)),
                "Ready is {ready}"
            );
            check_reconciled(&p)
        },
    )
    .await?;
    // The operator has judged this generation; give it a moment in case it creates workers anyway.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deployment = c.deployments().get_opt(&workers(name)).await?;
    ensure!(deployment.is_none(), "invalid pipeline {name} got a Deployment");
    let service = c.services().get_opt(&workers(name)).await?;
    ensure!(service.is_none(), "invalid pipeline {name} got a Service");
    Ok(())
}

/// The condition of `type_` in `p`'s status.
fn condition<'a>(p: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    p.data.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

/// Whether the operator's finalizer is on `p`.
fn has_finalizer(p: &DynamicObject) -> bool {
    p.metadata.finalizers.as_deref().unwrap_or_default().iter().any(|f| f == FINALIZER)
}

/// The uid of `p`.
fn uid_of(p: &DynamicObject) -> Result<&str> {
    p.metadata.uid.as_deref().context("an object without a uid")
}

/// A pipeline's generation, finalizers, deletion and status in a line, for failure messages.
fn summary(p: &DynamicObject) -> String {
    format!(
        "InputPipeline {} (generation {:?}, finalizers {:?}, deleting {}): status {}",
        p.metadata.name.as_deref().unwrap_or("?"),
        p.metadata.generation,
        p.metadata.finalizers.as_deref().unwrap_or_default(),
        p.metadata.deletion_timestamp.is_some(),
        p.data.get("status").unwrap_or(&Value::Null)
    )
}
