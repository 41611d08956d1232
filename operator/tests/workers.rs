//! `spec.workers` rendered into the worker pod: one table row per field, each merged over the
//! chart's defaults (`WorkerSettings::pod_defaults`), and every rendered Deployment valid for
//! Kubernetes 1.20 and 1.28 (kubernetes-validate --strict).

mod tools;

use granary_crds::{InputPipeline, WorkersSpec};
use granary_operator::WorkerSettings;
use granary_operator::objects::deployment;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const PYTHON_IMAGE: &str = "ghcr.io/granary-dev/granary-python:0.1.0";

fn pipeline(name: &str, workers: Value) -> InputPipeline {
    serde_json::from_value(json!({
        "apiVersion": "granary.dev/v1alpha1",
        "kind": "InputPipeline",
        "metadata": {"name": name, "namespace": "ml-team", "uid": format!("uid-{name}"), "generation": 1},
        "spec": {
            "source": {"url": "s3://bucket/train/", "format": "files"},
            "stages": [{"op": "image.decode"}],
            "batch": {"size": 8},
            "workers": workers
        }
    }))
    .expect("an InputPipeline")
}

/// The chart's defaults for every pipeline: a node pool, its taint, a registry secret, a region,
/// a label, the volume every team reads datasets from.
fn settings() -> WorkerSettings {
    WorkerSettings {
        image: "ghcr.io/granary-dev/granary:0.1.0".into(),
        image_pull_policy: None,
        resources: serde_json::from_value(json!({"requests": {"cpu": "1"}})).ok(),
        env_secret: Some("s3-credentials".into()),
        dispatcher: "granary-dispatcher.granary.svc:7070".into(),
        python_image: None,
        pod_defaults: serde_json::from_value(json!({
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "dedicated", "value": "cpu", "effect": "NoSchedule"}],
            "imagePullSecrets": [{"name": "registry"}],
            "env": [{"name": "AWS_REGION", "value": "us-east-1"}],
            "podLabels": {"team": "platform"},
            "volumes": [{"name": "datasets", "nfs": {"server": "nfs.example.com", "path": "/datasets"}}],
            "volumeMounts": [{"name": "datasets", "mountPath": "/datasets", "readOnly": true}]
        }))
        .expect("defaults"),
    }
}

fn pod(d: &Deployment) -> (&PodSpec, &Container) {
    let pod = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod");
    (pod, &pod.containers[0])
}

fn template_map(d: &Deployment, annotations: bool) -> BTreeMap<String, String> {
    let meta = d.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).expect("template metadata");
    let map = if annotations { &meta.annotations } else { &meta.labels };
    map.clone().unwrap_or_default()
}

type Check = fn(&Deployment);

/// One row per `spec.workers` field: the field as a user writes it, and what the pod must show.
fn table() -> Vec<(&'static str, Value, Check)> {
    vec![
        ("image", json!({"image": "registry.example.com/team/granary:1.2"}), |d| {
            assert_eq!(pod(d).1.image.as_deref(), Some("registry.example.com/team/granary:1.2"));
        }),
        ("resources", json!({"resources": {"limits": {"cpu": 4, "memory": "8Gi"}}}), |d| {
            let resources = pod(d).1.resources.clone().unwrap_or_default();
            assert_eq!(resources.limits.unwrap_or_default()["cpu"].0, "4");
            assert!(resources.requests.is_none(), "the pipeline's resources replace the chart's whole");
        }),
        ("node-selector", json!({"nodeSelector": {"pool": "gpu-adjacent", "zone": "a"}}), |d| {
            let selector = pod(d).0.node_selector.clone().unwrap_or_default();
            assert_eq!(selector["pool"], "gpu-adjacent", "the pipeline wins on the same key");
            assert_eq!(selector["zone"], "a");
        }),
        ("tolerations", json!({"tolerations": [{"key": "spot", "operator": "Exists"}]}), |d| {
            let keys: Vec<_> = pod(d).0.tolerations.iter().flatten().filter_map(|t| t.key.clone()).collect();
            assert_eq!(keys, ["dedicated", "spot"], "added to the chart's");
        }),
        (
            "affinity",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                ]}]
            }}}}),
            |d| {
                assert!(pod(d).0.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()).is_some());
            },
        ),
        ("service-account", json!({"serviceAccountName": "s3-reader"}), |d| {
            let pod = pod(d).0;
            assert_eq!(pod.service_account_name.as_deref(), Some("s3-reader"));
            assert_eq!(pod.automount_service_account_token, Some(false), "still no API token");
        }),
        (
            "pull-secrets",
            json!({"imagePullSecrets": [{"name": "team-registry"}, {"name": "registry"}]}),
            |d| {
                let names: Vec<_> =
                    pod(d).0.image_pull_secrets.iter().flatten().map(|s| s.name.clone()).collect();
                assert_eq!(names, ["registry", "team-registry"], "one entry per name");
            },
        ),
        ("priority", json!({"priorityClassName": "batch-low"}), |d| {
            assert_eq!(pod(d).0.priority_class_name.as_deref(), Some("batch-low"));
        }),
        (
            "env",
            json!({"env": [
                {"name": "AWS_REGION", "value": "eu-west-1"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "token"}}}
            ]}),
            |d| {
                let env = pod(d).1.env.clone().unwrap_or_default();
                let value = |n: &str| env.iter().find(|e| e.name == n).and_then(|e| e.value.clone());
                assert_eq!(value("AWS_REGION").as_deref(), Some("eu-west-1"), "the pipeline wins");
                assert_eq!(env.iter().filter(|e| e.name == "AWS_REGION").count(), 1);
                assert!(env.iter().any(|e| e.name == "TOKEN" && e.value_from.is_some()));
                assert!(value("GRANARY_DISPATCHER").is_some(), "Granary's own variables stay");
            },
        ),
        ("env-from", json!({"envFrom": [{"configMapRef": {"name": "s3-settings"}, "prefix": "S3_"}]}), |d| {
            let from = pod(d).1.env_from.clone().unwrap_or_default();
            assert_eq!(from[0].secret_ref.as_ref().map(|s| s.name.as_str()), Some("s3-credentials"));
            assert_eq!(from[1].config_map_ref.as_ref().map(|c| c.name.as_str()), Some("s3-settings"));
        }),
        (
            "volumes",
            json!({
                "volumes": [{"name": "imagenet", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": true}}],
                "volumeMounts": [{"name": "imagenet", "mountPath": "/data/imagenet", "readOnly": true}]
            }),
            |d| {
                let (pod, container) = pod(d);
                let volumes: Vec<_> = pod.volumes.iter().flatten().map(|v| v.name.clone()).collect();
                assert_eq!(volumes, ["tmp", "datasets", "imagenet"]);
                let mounts: Vec<_> =
                    container.volume_mounts.iter().flatten().map(|m| m.mount_path.clone()).collect();
                assert_eq!(mounts, ["/tmp", "/datasets", "/data/imagenet"]);
            },
        ),
        ("pod-labels", json!({"podLabels": {"team": "vision", "cost-center": "4711"}}), |d| {
            let labels = template_map(d, false);
            assert_eq!((labels["team"].as_str(), labels["cost-center"].as_str()), ("vision", "4711"));
            assert_eq!(labels["granary.dev/pipeline"], "pod-labels", "the selector labels stay");
            let selector = d.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
            assert!(
                selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
                "the Deployment still selects its pods"
            );
        }),
        ("pod-annotations", json!({"podAnnotations": {"sidecar.istio.io/inject": "false"}}), |d| {
            assert_eq!(template_map(d, true)["sidecar.istio.io/inject"], "false");
        }),
    ]
}

#[test]
fn every_field_renders_into_the_worker_pod_over_the_chart_defaults() {
    let fields: Vec<String> = serde_json::to_value(WorkersSpec::default())
        .ok()
        .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
        .unwrap_or_default();
    assert!(fields.is_empty(), "an empty spec.workers serializes to nothing: {fields:?}");
    let mut covered = std::collections::BTreeSet::new();
    for (name, workers, check) in table() {
        let p = pipeline(name, workers.clone());
        let problems = granary_crds::validate(&p.spec);
        assert!(problems.is_empty(), "{name}: {problems:?}");
        check(&deployment(&p, &settings(), PYTHON_IMAGE));
        covered.extend(workers.as_object().into_iter().flatten().map(|(k, _)| k.clone()));
    }
    // Every field of WorkersSpec has a row: compare with the CRD's properties.
    let crd = serde_json::to_value(<InputPipeline as kube::CustomResourceExt>::crd()).expect("the CRD");
    let workers = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/workers/properties")
        .and_then(Value::as_object)
        .expect("spec.workers in the CRD");
    let properties: std::collections::BTreeSet<String> = workers.keys().cloned().collect();
    assert_eq!(covered, properties, "a row per spec.workers field");
}

#[test]
fn rendered_worker_deployments_are_valid_for_kubernetes_1_20_and_1_28() {
    let mut docs: Vec<Value> = table()
        .into_iter()
        .map(|(name, workers, _)| {
            serde_json::to_value(deployment(&pipeline(name, workers), &settings(), PYTHON_IMAGE))
        })
        .collect::<Result<_, _>>()
        .expect("JSON");
    let plain = WorkerSettings { pod_defaults: WorkersSpec::default(), ..settings() };
    docs.push(
        serde_json::to_value(deployment(&pipeline("plain", Value::Null), &plain, PYTHON_IMAGE))
            .expect("JSON"),
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("workers.yaml");
    tools::write_documents(&file, &docs);
    for version in ["1.20.0", "1.28.0"] {
        tools::kubernetes_validate(&file, docs.len(), version);
    }
}
