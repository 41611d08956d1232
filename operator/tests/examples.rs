//! examples/kubernetes as a user applies them: the InputPipeline is valid and renders worker
//! pods Kubernetes accepts, the Secret and the trainer Job are valid objects for Kubernetes 1.20
//! and 1.28, and they agree with each other and with the chart's defaults (namespace, Secret
//! name, the trainer label the NetworkPolicies admit, the pipeline key the trainer asks for).

mod tools;

use granary_crds::InputPipeline;
use granary_operator::WorkerSettings;
use serde_json::Value;

fn example(name: &str) -> Value {
    let path = tools::root().join("examples/kubernetes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn env(job: &Value, name: &str) -> String {
    job.pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("the trainer Job sets {name}"))
        .to_string()
}

#[test]
fn the_kubernetes_examples_are_valid_and_agree() {
    let pipeline_doc = example("pipeline.yaml");
    let secret = example("s3-credentials.yaml");
    let job = example("trainer-job.yaml");
    let pipeline: InputPipeline = serde_json::from_value(pipeline_doc.clone()).expect("an InputPipeline");
    let problems = granary_crds::validate(&pipeline.spec);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(pipeline.spec.first_source().is_some_and(|s| s.url.starts_with("s3://")), "backed by S3");

    let namespace = pipeline.metadata.namespace.clone().expect("a namespace");
    for doc in [&secret, &job] {
        assert_eq!(doc["metadata"]["namespace"], namespace.as_str(), "one namespace for the example");
    }
    let chart_values: Value = serde_norway::from_str(
        &std::fs::read_to_string(tools::root().join("charts/granary/values.yaml")).expect("values.yaml"),
    )
    .expect("YAML");
    let trainer_label = &chart_values["networkPolicy"]["trainers"];
    let key = trainer_label["labelKey"].as_str().expect("labelKey");
    assert_eq!(
        job.pointer("/spec/template/metadata/labels").and_then(|l| l.get(key)),
        Some(&trainer_label["labelValue"]),
        "the trainer pods carry the label the chart's NetworkPolicies admit"
    );
    let name = pipeline.metadata.name.clone().unwrap_or_default();
    assert_eq!(env(&job, "GRANARY_PIPELINE"), granary_operator::objects::pipeline_key(&namespace, &name));
    assert_eq!(
        env(&job, "GRANARY_DISPATCHER"),
        "granary-dispatcher.granary.svc:7070",
        "the dispatcher Service of release `granary` in namespace `granary`"
    );
    let keys: Vec<&str> =
        secret["stringData"].as_object().expect("stringData").keys().map(String::as_str).collect();
    for needed in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
        assert!(keys.contains(&needed), "the Secret gives {needed}: {keys:?}");
    }

    let settings = WorkerSettings {
        image: "ghcr.io/granary-dev/granary:0.1.0".into(),
        image_pull_policy: None,
        resources: None,
        env_secret: secret["metadata"]["name"].as_str().map(String::from),
        dispatcher: env(&job, "GRANARY_DISPATCHER"),
        python_image: None,
        pod_defaults: Default::default(),
    };
    let deployment = granary_operator::objects::deployment(&pipeline, &settings, "unused");
    let docs = vec![secret, job, serde_json::to_value(&deployment).expect("JSON")];
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("examples.yaml");
    tools::write_documents(&file, &docs);
    for version in ["1.20.0", "1.28.0"] {
        tools::kubernetes_validate(&file, docs.len(), version);
    }
}
