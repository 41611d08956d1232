//! `spec.workers` and `spec.scaling`'s scale-to-zero fields: every pod field parses from YAML,
//! and each mistake the schema cannot catch is reported at its field with a fix.

use granary_crds::{InputPipelineSpec, ScalingSpec, WorkersSpec, validate};
use serde_json::{Value, json};

fn spec_with(workers: Value, scaling: Value) -> InputPipelineSpec {
    serde_json::from_value(json!({
        "source": {"url": "s3://bucket/train/", "format": "files"},
        "stages": [{"op": "image.decode"}],
        "batch": {"size": 8},
        "workers": workers,
        "scaling": scaling,
    }))
    .unwrap()
}

fn problems(workers: Value) -> Vec<String> {
    validate(&spec_with(workers, Value::Null)).iter().map(ToString::to_string).collect()
}

fn everything() -> Value {
    json!({
        "image": "registry.example.com/team/granary:1.2",
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": 4, "memory": "8Gi"}},
        "nodeSelector": {"node.kubernetes.io/instance-type": "c6i.4xlarge"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "input", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        ],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "granary-worker"}}
            }
        }]}},
        "serviceAccountName": "s3-reader",
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": "batch-low",
        "env": [
            {"name": "AWS_REGION", "value": "eu-west-1"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "token"}}}
        ],
        "envFrom": [{"configMapRef": {"name": "s3-settings"}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": true}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
        "podLabels": {"team": "vision"},
        "podAnnotations": {"cost.example.com/center": "ml-4711"}
    })
}

#[test]
fn every_field_parses_and_validates() {
    let spec = spec_with(everything(), Value::Null);
    let workers = spec.workers.clone().unwrap();
    assert_eq!(workers.tolerations.len(), 2);
    assert_eq!(workers.volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name, "imagenet");
    let limits = workers.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "4", "an integer quantity reads as its text");
    assert_eq!(validate(&spec), Vec::new());
    let back: WorkersSpec = serde_json::from_value(serde_json::to_value(&workers).unwrap()).unwrap();
    assert_eq!(back, workers, "round trip");
}

#[test]
fn each_mistake_names_its_field() {
    let cases: &[(Value, &str, &str)] = &[
        (json!({"image": "a b"}), "spec.workers.image", "image reference"),
        (json!({"resources": {"limits": {"cpu": "two"}}}), "spec.workers.resources.limits.cpu", "500m"),
        (json!({"nodeSelector": {"bad key!": "x"}}), "spec.workers.nodeSelector.bad key!", "valid key"),
        (json!({"nodeSelector": {"pool": "-x"}}), "spec.workers.nodeSelector.pool", "label value"),
        (
            json!({"tolerations": [{"operator": "Maybe", "key": "a"}]}),
            "spec.workers.tolerations[0].operator",
            "Exists",
        ),
        (json!({"tolerations": [{"value": "x"}]}), "spec.workers.tolerations[0].key", "Exists"),
        (
            json!({"tolerations": [{"operator": "Exists", "value": "x"}]}),
            "spec.workers.tolerations[0].value",
            "must be empty",
        ),
        (
            json!({"tolerations": [{"key": "a", "effect": "Never"}]}),
            "spec.workers.tolerations[0].effect",
            "NoExecute",
        ),
        (
            json!({"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]}),
            "spec.workers.tolerations[0].tolerationSeconds",
            "NoExecute",
        ),
        (json!({"serviceAccountName": "S3_Reader"}), "spec.workers.serviceAccountName", "lowercase"),
        (json!({"priorityClassName": "Low"}), "spec.workers.priorityClassName", "lowercase"),
        (
            json!({"imagePullSecrets": [{"name": "Reg"}]}),
            "spec.workers.imagePullSecrets[0].name",
            "lowercase",
        ),
        (json!({"env": [{"name": "1X", "value": "a"}]}), "spec.workers.env[0].name", "not a variable name"),
        (
            json!({"env": [{"name": "GRANARY_DISPATCHER", "value": "a"}]}),
            "spec.workers.env[0].name",
            "set by Granary",
        ),
        (
            json!({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
            "spec.workers.env[1].name",
            "twice",
        ),
        (
            json!({"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}),
            "spec.workers.env[0]",
            "both",
        ),
        (json!({"envFrom": [{"prefix": "X_"}]}), "spec.workers.envFrom[0]", "exactly one"),
        (
            json!({"volumes": [{"name": "Data", "emptyDir": {}}]}),
            "spec.workers.volumes[0].name",
            "volume name",
        ),
        (
            json!({"volumes": [{"name": "tmp", "emptyDir": {}}]}),
            "spec.workers.volumes[0].name",
            "Granary adds",
        ),
        (json!({"volumes": [{"name": "data"}]}), "spec.workers.volumes[0]", "none"),
        (
            json!({"volumes": [{"name": "data", "emptyDir": {}, "secret": {"secretName": "s"}}]}),
            "spec.workers.volumes[0]",
            "exactly one source",
        ),
        (
            json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]}),
            "spec.workers.volumeMounts[0].name",
            "names no volume",
        ),
        (
            json!({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "data"}]}),
            "spec.workers.volumeMounts[0].mountPath",
            "absolute",
        ),
        (
            json!({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/tmp/x"}]}),
            "spec.workers.volumeMounts[0].mountPath",
            "its own volume",
        ),
        (
            json!({"podLabels": {"granary.dev/pipeline": "other"}}),
            "spec.workers.podLabels.granary.dev/pipeline",
            "selects the worker pods",
        ),
        (json!({"podAnnotations": {"a/b/c": "x"}}), "spec.workers.podAnnotations.a/b/c", "valid key"),
    ];
    for (workers, path, words) in cases {
        let found = problems(workers.clone());
        assert!(
            found.iter().any(|p| p.starts_with(&format!("{path}: ")) && p.contains(words)),
            "{workers}: expected `{path}: …{words}…`, got {found:?}"
        );
    }
}

#[test]
fn scale_to_zero_takes_min_workers_zero_and_an_idle_time() {
    let ok = spec_with(Value::Null, json!({"minWorkers": 0, "idleAfter": "90s"}));
    assert_eq!(validate(&ok), Vec::new());
    assert_eq!(ok.scaling.as_ref().unwrap().idle_after_s(), Some(90.0));
    let default: ScalingSpec = serde_json::from_value(json!({"minWorkers": 0})).unwrap();
    assert_eq!(default.idle_after_s(), Some(300.0), "5 minutes by default");
    let kept: ScalingSpec = serde_json::from_value(json!({"minWorkers": 1})).unwrap();
    assert_eq!(kept.idle_after_s(), None, "a pool with a floor never goes to zero");
    for (scaling, path, words) in [
        (json!({"minWorkers": 1, "idleAfter": "5m"}), "spec.scaling.idleAfter", "minWorkers: 0"),
        (json!({"minWorkers": 0, "idleAfter": "soon"}), "spec.scaling.idleAfter", ""),
        (json!({"minWorkers": 0, "idleAfter": "0s"}), "spec.scaling.idleAfter", "longer than 0"),
        (json!({"policy": "fixed", "replicas": 0}), "spec.scaling.replicas", "minWorkers: 0"),
    ] {
        let found: Vec<String> =
            validate(&spec_with(Value::Null, scaling.clone())).iter().map(ToString::to_string).collect();
        assert!(
            found.iter().any(|p| p.starts_with(&format!("{path}: ")) && p.contains(words)),
            "{scaling}: expected `{path}: …{words}…`, got {found:?}"
        );
    }
}
