//! Reconcile against the mocked API server: every request in order, what it carries, and that
//! the RBAC table grants it.

use super::apiserver::{ApiServer, Seen};
use crate::config::{FINALIZER, OperatorConfig};
use crate::context::Context;
use crate::events::Notifier;
use crate::fixtures::{pipeline, settings};
use crate::pool::KubernetesPool;
use crate::reconcile::{error_policy, reconcile};
use granary_crds::InputPipeline;
use granary_crds::Manifest;
use granary_dispatcher::host::Autoscalers;
use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const PIPELINES: &str = "/apis/granary.dev/v1alpha1/namespaces/ns/inputpipelines";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/ns/deployments/p-workers";
const SERVICE: &str = "/api/v1/namespaces/ns/services/p-workers";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

/// Sources of four splits of 100 elements, or none reachable.
struct Splits(bool);

impl Catalog for Splits {
    fn describe(&self, _: &Manifest) -> Result<granary_dispatcher::Listing, String> {
        if self.0 {
            Ok(granary_dispatcher::Listing::single(vec![100; 4]))
        } else {
            Err("connection refused".into())
        }
    }
}

async fn context(client: kube::Client, reachable: bool) -> Arc<Context> {
    let dispatcher = Dispatcher::new(DispatcherConfig::default(), Arc::new(Splits(reachable))).await.unwrap();
    let config = OperatorConfig {
        workers: settings(),
        policy_period: Duration::from_secs(3600),
        status_period: Duration::from_secs(10),
    };
    let exposition = Arc::new(granary_dispatcher::exposition::Exposition::new().unwrap());
    let autoscalers = Autoscalers::new(dispatcher.clone(), Some(exposition));
    Arc::new(Context::new(
        client.clone(),
        dispatcher,
        autoscalers,
        config,
        Notifier::new(client, "operator-0"),
    ))
}

/// The operator's metrics as scraped now.
fn scrape(ctx: &Context) -> String {
    let exposition = ctx.autoscalers.exposition().unwrap();
    exposition.refresh(&ctx.dispatcher);
    granary_telemetry::render(&exposition.registry())
}

/// Pipeline `ns/p` with the finalizer, at `generation`, with `spec` merged into the fixture's.
fn p(generation: i64, spec: Value) -> InputPipeline {
    let mut value = serde_json::to_value(pipeline("ns", "p", "uid-p")).unwrap();
    value["metadata"]["finalizers"] = json!([FINALIZER]);
    value["metadata"]["generation"] = json!(generation);
    if let Value::Object(fields) = spec {
        for (k, v) in fields {
            value["spec"][k] = v;
        }
    }
    serde_json::from_value(value).unwrap()
}

/// The applied Deployment as the server returns it: `replicas` as the server has it.
fn deployment_reply(seen: &Seen, replicas: i64, ready: i64) -> Value {
    let mut d = seen.body.clone();
    d["spec"]["replicas"] = json!(replicas);
    d["status"] = json!({"replicas": replicas, "readyReplicas": ready});
    d
}

fn scale_reply(replicas: i64) -> Value {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "p-workers", "namespace": "ns"},
           "spec": {"replicas": replicas}, "status": {"replicas": replicas}})
}

fn event_reply(seen: &Seen) -> Value {
    seen.body.clone()
}

fn condition<'a>(status: &'a Value, kind: &str) -> &'a Value {
    status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == kind).unwrap()
}

/// The applies a valid pipeline's reconcile starts with: Service, then Deployment.
async fn expect_applies(server: &mut ApiServer, replicas: i64, ready: i64) -> (Seen, Seen) {
    let service = server.expect("PATCH", SERVICE, |s| s.body.clone()).await;
    let deployment = server.expect("PATCH", DEPLOYMENT, |s| deployment_reply(s, replicas, ready)).await;
    for seen in [&service, &deployment] {
        assert_eq!(seen.content_type, "application/apply-patch+yaml");
        assert_eq!(
            (seen.param("fieldManager"), seen.param("force")),
            (Some("granary-operator"), Some("true"))
        );
    }
    (service, deployment)
}

async fn expect_event(server: &mut ApiServer, reason: &str) -> Value {
    let seen = server.expect("POST", EVENTS, event_reply).await;
    assert_eq!(seen.body["reason"], reason, "{:?}", seen.body);
    assert_eq!(seen.body["reportingController"], "granary-operator");
    assert_eq!(seen.body["regarding"]["kind"], "InputPipeline");
    assert_eq!(seen.body["regarding"]["name"], "p");
    seen.body
}

fn status_reply(object: &InputPipeline) -> impl FnOnce(&Seen) -> Value {
    let object = serde_json::to_value(object).unwrap();
    move |seen| {
        let mut o = object;
        o["status"] = seen.body["status"].clone();
        o
    }
}

#[tokio::test]
async fn create_adds_the_finalizer_then_applies_registers_scales_and_reports() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, true).await;

    // A new pipeline first gets the finalizer, and nothing else.
    let fresh = Arc::new(pipeline("ns", "p", "uid-p"));
    let task = tokio::spawn(reconcile(fresh.clone(), ctx.clone()));
    let patch = server
        .expect("PATCH", &format!("{PIPELINES}/p"), |s| {
            let mut o = serde_json::to_value(&*fresh).unwrap();
            o["metadata"]["finalizers"] = s.body[1]["value"].clone();
            o
        })
        .await;
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(patch.body[1], json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}));
    task.await.unwrap().unwrap();

    // With it, the workers are applied, the pipeline registered and scaled, status written.
    let object = p(1, json!({"scaling": {"policy": "fixed", "replicas": 2}}));
    let task = tokio::spawn(reconcile(Arc::new(object.clone()), ctx.clone()));
    let (service, deployment) = expect_applies(&mut server, 1, 0).await;
    assert_eq!(service.body["spec"]["clusterIP"], "None");
    assert_eq!(deployment.body["metadata"]["ownerReferences"][0]["uid"], "uid-p");
    assert!(
        deployment.body["spec"].get("replicas").is_none(),
        "the apply leaves replicas to the scale subresource"
    );
    let registered = expect_event(&mut server, "Registered").await;
    assert!(
        registered["note"].as_str().unwrap().contains("as `ns/p`: 4 splits, 400 elements"),
        "{registered}"
    );
    let scale = server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(2)).await;
    assert_eq!(scale.body, json!({"spec": {"replicas": 2}}));
    assert_eq!(scale.param("fieldManager"), Some("granary-autoscaler"));
    let scaled = expect_event(&mut server, "Scaled").await;
    assert_eq!(scaled["note"], "scaled from 1 to 2 workers: spec.scaling.replicas is 2 (policy fixed)");
    let status = server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    assert_eq!(status.content_type, "application/merge-patch+json");
    let s = &status.body["status"];
    assert_eq!((s["phase"].as_str(), s["workers"].as_str()), (Some("Pending"), Some("0/2")));
    assert_eq!(s["observedGeneration"], 1);
    assert_eq!(condition(s, "Ready")["reason"], "WorkersStarting");
    assert_eq!(condition(s, "Caching")["reason"], "Off");
    assert_eq!(ctx.dispatcher.pipelines(), ["ns/p"]);
    task.await.unwrap().unwrap();

    // Reconciling the same generation again changes nothing: the applies are no-ops on the
    // server, and nothing is registered, scaled or published again.
    let mut again = object.clone();
    again.status = serde_json::from_value(s.clone()).unwrap();
    let task = tokio::spawn(reconcile(Arc::new(again), ctx.clone()));
    expect_applies(&mut server, 2, 2).await;
    let status = server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    assert_eq!(status.body["status"]["phase"], "Running", "the workers became ready");
    task.await.unwrap().unwrap();
    server.expect_nothing(Duration::from_millis(200)).await;
    server.check_rbac();
}

#[tokio::test]
async fn a_spec_change_registers_the_new_generation_and_rescales() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, true).await;
    let v1 = p(1, json!({"scaling": {"policy": "fixed", "replicas": 2}}));
    let task = tokio::spawn(reconcile(Arc::new(v1.clone()), ctx.clone()));
    expect_applies(&mut server, 1, 0).await;
    expect_event(&mut server, "Registered").await;
    server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(2)).await;
    expect_event(&mut server, "Scaled").await;
    server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&v1)).await;
    task.await.unwrap().unwrap();

    let v2 = p(2, json!({"batch": {"size": 16}, "scaling": {"policy": "fixed", "replicas": 3}}));
    let task = tokio::spawn(reconcile(Arc::new(v2.clone()), ctx.clone()));
    let (_, deployment) = expect_applies(&mut server, 2, 2).await;
    assert!(deployment.body["spec"].get("replicas").is_none());
    let registered = expect_event(&mut server, "Registered").await;
    assert!(registered["note"].as_str().unwrap().starts_with("registered generation 2"), "{registered}");
    let scale = server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(3)).await;
    assert_eq!(scale.body["spec"]["replicas"], 3);
    expect_event(&mut server, "Scaled").await;
    let status = server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&v2)).await;
    assert_eq!(status.body["status"]["observedGeneration"], 2);
    assert_eq!(status.body["status"]["workers"], "2/3");
    assert_eq!(condition(&status.body["status"], "Scaling")["reason"], "ScalingUp");
    task.await.unwrap().unwrap();
    server.check_rbac();
}

#[tokio::test]
async fn an_invalid_spec_applies_nothing_and_names_the_field() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, true).await;
    let bad = p(1, json!({"cache": {"policy": "at", "at": "no-such-stage", "store": "file:///tmp/c/"}}));
    let task = tokio::spawn(reconcile(Arc::new(bad.clone()), ctx.clone()));
    let event = server.expect("POST", EVENTS, event_reply).await;
    assert_eq!(
        (event.body["reason"].as_str(), event.body["type"].as_str()),
        (Some("InvalidSpec"), Some("Warning"))
    );
    let note = event.body["note"].as_str().unwrap();
    assert!(note.starts_with("spec.cache.at:"), "{note}");
    let status = server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&bad)).await;
    let s = &status.body["status"];
    assert_eq!(s["phase"], "Failed");
    let ready = condition(s, "Ready");
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("InvalidSpec")));
    assert!(ready["message"].as_str().unwrap().starts_with("spec.cache.at:"));
    task.await.unwrap().unwrap();
    server.expect_nothing(Duration::from_millis(200)).await;
    assert!(ctx.dispatcher.pipelines().is_empty(), "an invalid spec is never registered");
    server.check_rbac();
}

#[tokio::test]
async fn an_unreachable_source_is_reported_and_retried() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, false).await;
    let object = p(1, json!({"scaling": {"policy": "fixed", "replicas": 1}}));
    let task = tokio::spawn(reconcile(Arc::new(object.clone()), ctx.clone()));
    expect_applies(&mut server, 1, 0).await;
    let event = server.expect("POST", EVENTS, event_reply).await;
    assert_eq!(event.body["reason"], "SourceUnavailable");
    assert!(
        event.body["note"].as_str().unwrap().starts_with("spec.source.url: cannot list `s3://bucket/train/`")
    );
    let status = server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    assert_eq!(condition(&status.body["status"], "Ready")["reason"], "SourceUnavailable");
    let action = task.await.unwrap().unwrap();
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(30)));
    server.check_rbac();
}

#[tokio::test]
async fn deletion_stops_autoscaling_forgets_the_pipeline_and_removes_the_finalizer() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, true).await;
    let cache = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}/", cache.path().display());
    let store = granary_store::cache::CacheStore::open(&store_url).unwrap();
    for (n, creator) in [(1u64, "ns/p"), (2, "ns/q")] {
        let info = granary_store::cache::EntryInfo {
            format_version: granary_store::cache::FORMAT_VERSION,
            fingerprint: format!("{n:064x}"),
            pipeline: creator.into(),
            source_url: "s3://bucket/train/".into(),
            boundary: 1,
            stage: "a".into(),
            stages: vec!["a".into()],
            splits_total: 1,
            created_unix_s: 1,
            last_used_unix_s: 1,
        };
        store.put_entry_info(&info).await.unwrap();
    }
    let object = p(
        1,
        json!({"scaling": {"minWorkers": 1, "maxWorkers": 3}, "cache": {"policy": "never", "store": store_url}}),
    );
    let task = tokio::spawn(reconcile(Arc::new(object.clone()), ctx.clone()));
    expect_applies(&mut server, 1, 1).await;
    expect_event(&mut server, "Registered").await;
    server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    task.await.unwrap().unwrap();
    assert!(ctx.tracked().get("ns/p").is_some() && ctx.autoscalers.is_running("ns/p"));
    let metrics = scrape(&ctx);
    assert!(metrics.contains("granary_workers_desired{namespace=\"ns\",pipeline=\"p\"} 1"), "{metrics}");

    let mut deleting = serde_json::to_value(&object).unwrap();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-21T10:00:00Z");
    let deleting: InputPipeline = serde_json::from_value(deleting).unwrap();
    let task = tokio::spawn(reconcile(Arc::new(deleting.clone()), ctx.clone()));
    let cleanup = expect_event(&mut server, "Cleanup").await;
    assert!(cleanup["note"].as_str().unwrap().contains("removed `ns/p` from the dispatcher"));
    let removed = expect_event(&mut server, "CacheRemoved").await;
    assert!(removed["note"].as_str().unwrap().starts_with("removed 1 cache entries"), "{removed}");
    let left: Vec<String> = store.list_entries().await.unwrap().into_iter().map(|e| e.fingerprint).collect();
    assert_eq!(left, [format!("{:064x}", 2)], "another pipeline's entry stays");
    let patch =
        server.expect("PATCH", &format!("{PIPELINES}/p"), |_| serde_json::to_value(&deleting).unwrap()).await;
    assert_eq!(patch.body[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
    task.await.unwrap().unwrap();
    assert!(ctx.dispatcher.pipelines().is_empty());
    assert!(ctx.tracked().get("ns/p").is_none(), "the autoscaler stopped with it");
    assert!(!ctx.autoscalers.is_running("ns/p"), "the autoscaler stopped with it");
    assert!(
        !scrape(&ctx).contains("granary_workers_desired{namespace=\"ns\",pipeline=\"p\"}"),
        "its series went too"
    );
    server.check_rbac();
}

#[tokio::test]
async fn the_autoscaler_scales_through_the_scale_subresource() {
    let (client, mut server) = ApiServer::start();
    let deployments = kube::Api::namespaced(client, "ns");
    let pool = KubernetesPool::new(deployments, "p-workers");
    let shared: granary_dispatcher::autoscaler::SharedPool = Arc::new(tokio::sync::Mutex::new(pool));
    let task = tokio::spawn({
        let shared = shared.clone();
        async move {
            let mut pool = shared.lock().await;
            pool.scale_to(4).await.unwrap();
            pool.current().await.unwrap()
        }
    });
    let scale = server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(4)).await;
    assert_eq!(scale.body, json!({"spec": {"replicas": 4}}));
    assert_eq!(scale.content_type, "application/merge-patch+json");
    server.expect("GET", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(4)).await;
    assert_eq!(task.await.unwrap(), 4);

    // A refused scale is an error naming the Deployment, not a panic.
    let task = tokio::spawn(async move { shared.lock().await.scale_to(2).await });
    server
        .expect_status("PATCH", &format!("{DEPLOYMENT}/scale"), http::StatusCode::FORBIDDEN, |_| {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                   "message": "deployments.apps \"p-workers\" is forbidden"})
        })
        .await;
    let e = task.await.unwrap().unwrap_err().to_string();
    assert!(e.contains("cannot scale Deployment `p-workers` to 2"), "{e}");
    server.check_rbac();
}

#[tokio::test]
async fn an_autoscaler_decision_becomes_a_scale_patch_and_a_scaled_event() {
    use granary_dispatcher::autoscaler::Autoscaler;
    use granary_policies::{GranaryConfig, GranaryPolicy, PoolConfig};
    let (client, mut server) = ApiServer::start();
    let ctx = context(client.clone(), true).await;
    let object = p(1, json!({"scaling": {"minWorkers": 3, "maxWorkers": 6}}));
    ctx.dispatcher.register("ns/p", &crate::reconcile::manifest_of(&object).unwrap()).await.unwrap();
    let pool = KubernetesPool::new(kube::Api::namespaced(client, "ns"), "p-workers");
    let bounds = PoolConfig { min_workers: 3, max_workers: 6, ..PoolConfig::default() };
    let policy = GranaryPolicy::new(GranaryConfig::for_period(1.0));
    let mut autoscaler = Autoscaler::new(
        ctx.dispatcher.clone(),
        "ns/p",
        Box::new(policy),
        Arc::new(tokio::sync::Mutex::new(pool)),
        bounds,
        Duration::from_secs(1),
        1,
    );
    let scaling = autoscaler.scaling();
    let task = tokio::spawn(async move { autoscaler.evaluate().await });
    server.expect("GET", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(1)).await;
    let scale = server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(3)).await;
    assert_eq!(scale.body, json!({"spec": {"replicas": 3}}));
    let decision = task.await.unwrap();
    assert_eq!(decision.target, 3);

    // The decision reaches the pipeline as an Event with the policy's reason.
    let (notes, _) = crate::events::new_scalings(&scaling.report(), 0);
    assert_eq!(notes.len(), 1);
    let regarding = kube::Resource::object_ref(&object, &());
    let publish = tokio::spawn({
        let notifier = ctx.notifier.clone();
        let note = notes[0].clone();
        async move { notifier.publish(&regarding, note).await }
    });
    let event = expect_event(&mut server, "Scaled").await;
    assert_eq!(event["note"], notes[0].text);
    assert!(event["note"].as_str().unwrap().starts_with("scaled from 1 to 3 workers: "), "{event}");
    publish.await.unwrap();
    server.check_rbac();
}

#[tokio::test]
async fn failed_reconciles_count_up_the_backoff_until_one_succeeds() {
    let (client, mut server) = ApiServer::start();
    let ctx = context(client, true).await;
    let object = p(1, json!({"scaling": {"policy": "fixed", "replicas": 2}}));
    let failures = || ctx.with("ns/p", "uid-p", |t| t.failures);

    // The API server is unavailable: the reconcile fails and says so.
    let task = tokio::spawn(reconcile(Arc::new(object.clone()), ctx.clone()));
    let unavailable = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "ServiceUnavailable",
        "message": "the server is currently unable to handle the request", "code": 503,
    });
    server.expect_status("PATCH", SERVICE, http::StatusCode::SERVICE_UNAVAILABLE, |_| unavailable).await;
    expect_event(&mut server, "ReconcileFailed").await;
    server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    let error = task.await.unwrap().unwrap_err();
    assert_eq!(failures(), 0, "the reconcile itself does not count");

    // Each failure handed to the error policy counts, and each requeues (never waits for a change).
    for n in 1..=3 {
        let action = error_policy(Arc::new(object.clone()), &error, ctx.clone());
        assert_eq!(failures(), n);
        assert_ne!(action, kube::runtime::controller::Action::await_change());
    }

    // The next reconcile succeeds: the count starts again.
    let task = tokio::spawn(reconcile(Arc::new(object.clone()), ctx.clone()));
    expect_applies(&mut server, 1, 0).await;
    expect_event(&mut server, "Registered").await;
    server.expect("PATCH", &format!("{DEPLOYMENT}/scale"), |_| scale_reply(2)).await;
    expect_event(&mut server, "Scaled").await;
    server.expect("PATCH", &format!("{PIPELINES}/p/status"), status_reply(&object)).await;
    task.await.unwrap().unwrap();
    assert_eq!(failures(), 0, "a success resets the backoff");
    server.check_rbac();
}
