//! Objects in named states for the tests.

use crate::config::WorkerSettings;
use granary_crds::InputPipeline;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// A valid pipeline `namespace/name` with uid `uid`, generation 1.
pub fn pipeline(namespace: &str, name: &str, uid: &str) -> InputPipeline {
    pipeline_with(namespace, name, uid, serde_json::json!({}))
}

/// [`pipeline`] with the top-level fields of `spec` set in its spec (replacing the fixture's).
pub fn pipeline_with(namespace: &str, name: &str, uid: &str, spec: serde_json::Value) -> InputPipeline {
    let mut json = serde_json::json!({
        "apiVersion": "granary.dev/v1alpha1",
        "kind": "InputPipeline",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1, "resourceVersion": "1"},
        "spec": {
            "source": {"url": "s3://bucket/train/", "format": "jsonl"},
            "stages": [{"op": "test.sleep", "ms": 0}],
            "batch": {"size": 8}
        }
    });
    if let serde_json::Value::Object(fields) = spec {
        for (key, value) in fields {
            json["spec"][key] = value;
        }
    }
    serde_json::from_value(json).expect("a valid fixture")
}

/// The worker settings the tests use.
pub fn settings() -> WorkerSettings {
    WorkerSettings {
        image: "ghcr.io/granary-dev/granary:0.1.0".into(),
        image_pull_policy: Some("IfNotPresent".into()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), Quantity("1".into()))])),
            ..Default::default()
        }),
        env_secret: Some("s3-credentials".into()),
        dispatcher: "granary-dispatcher.granary.svc:7070".into(),
        python_image: None,
        pod_defaults: Default::default(),
    }
}
