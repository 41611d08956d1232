//! What `python.map` stages need of a pipeline's worker pods, as pure functions: the image (the
//! pipeline's own `spec.workers.image`, else a Python-capable image when the pipeline has
//! `python.map` stages, else the chart's), and the ConfigMap of `spec.python.configMap` mounted
//! read-only at [`PYTHON_MOUNT`], which `PYTHONPATH` names.

use crate::config::WorkerSettings;
use granary_crds::InputPipeline;
use granary_crds::ops::{Family, op_info};
use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, EnvVar, Volume, VolumeMount};

pub use granary_crds::workers::{PYTHON_MOUNT, PYTHON_VOLUME};
/// What the repository of the Python-capable variant of an image ends with.
const PYTHON_SUFFIX: &str = "-python";

/// The Python-capable variant of worker image `image`: `-python` appended to its repository, the
/// tag kept (`ghcr.io/granary-dev/granary:0.1.0` → `ghcr.io/granary-dev/granary-python:0.1.0`).
/// A digest (`@sha256:…`) names the other image's content, so it is dropped: pin a Python image
/// by digest with `--worker-python-image` (chart value `workers.pythonImage`) instead. An image that already is a variant stays as it is.
pub fn python_variant(image: &str) -> String {
    let named = image.split_once('@').map_or(image, |(named, _digest)| named);
    // A tag follows the last `:` after the last `/` (a registry's `host:port/` has a `/` after).
    let last_slash = named.rfind('/').map_or(0, |i| i + 1);
    let (repository, tag) = match named[last_slash..].find(':') {
        Some(i) => named.split_at(last_slash + i),
        None => (named, ""),
    };
    if repository.ends_with(PYTHON_SUFFIX) {
        return format!("{repository}{tag}");
    }
    format!("{repository}{PYTHON_SUFFIX}{tag}")
}

/// The Python-capable worker image: `configured` (`--worker-python-image`, chart value `workers.pythonImage`) when given
/// and not blank, else the [`python_variant`] of `worker_image`.
pub fn python_image(configured: Option<&str>, worker_image: &str) -> String {
    match configured.map(str::trim).filter(|image| !image.is_empty()) {
        Some(image) => image.to_string(),
        None => python_variant(worker_image),
    }
}

/// Whether `pipeline` has a Python stage (`python.map`, `python.filter`): the registry's
/// family says which operators run user code.
pub fn has_python_stages(pipeline: &InputPipeline) -> bool {
    pipeline
        .spec
        .stages
        .iter()
        .any(|stage| op_info(&stage.op).is_some_and(|info| info.family == Family::Python))
}

/// The image of `pipeline`'s workers: `spec.workers.image`; else, for a pipeline with
/// `python.map` stages, `python_image`; else the operator's worker image.
pub fn worker_image(pipeline: &InputPipeline, settings: &WorkerSettings, python_image: &str) -> String {
    let own = pipeline.spec.workers.as_ref().and_then(|w| w.image.as_deref()).map(str::trim);
    match own.filter(|image| !image.is_empty()) {
        Some(image) => image.to_string(),
        None if has_python_stages(pipeline) => python_image.to_string(),
        None => settings.image.clone(),
    }
}

/// The ConfigMap of `spec.python.configMap`, when set: the pod volume, the container's read-only
/// mount of it at [`PYTHON_MOUNT`], and `PYTHONPATH` naming that folder.
///
/// `PYTHONPATH` is the folder alone: a container's `env` replaces the image's variable of that
/// name (Kubernetes cannot refer to an image's environment), so images should install packages
/// into site-packages (`pip install`), which stays on the path after `PYTHONPATH`; a module of
/// the ConfigMap thus shadows an installed one of the same name.
pub fn code_volume(pipeline: &InputPipeline) -> Option<(Volume, VolumeMount, EnvVar)> {
    let name = pipeline.spec.python.as_ref()?.config_map.clone()?;
    let volume = Volume {
        name: PYTHON_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource { name, ..Default::default() }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: PYTHON_VOLUME.into(),
        mount_path: PYTHON_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    };
    let env = EnvVar { name: "PYTHONPATH".into(), value: Some(PYTHON_MOUNT.into()), ..Default::default() };
    Some((volume, mount, env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{pipeline_with, settings};
    use crate::objects::deployment;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    const PYTHON_IMAGE: &str = "ghcr.io/granary-dev/granary-python:0.1.0";

    fn pod(spec: serde_json::Value) -> PodSpec {
        let d = deployment(&pipeline_with("ns", "p", "uid-1", spec), &settings(), PYTHON_IMAGE);
        d.spec.and_then(|s| s.template.spec).expect("a pod spec")
    }

    fn python_stage() -> serde_json::Value {
        json!({"stages": [{"op": "python.map", "function": "augment:jitter"}]})
    }

    #[test]
    fn the_python_variant_appends_to_the_repository_and_keeps_the_tag() {
        let table = [
            ("ghcr.io/granary-dev/granary:0.1.0", "ghcr.io/granary-dev/granary-python:0.1.0"),
            ("granary", "granary-python"),
            ("registry:5000/team/granary", "registry:5000/team/granary-python"),
            ("registry:5000/team/granary:1.2", "registry:5000/team/granary-python:1.2"),
            ("ghcr.io/g/granary:0.1@sha256:abc", "ghcr.io/g/granary-python:0.1"),
            ("ghcr.io/g/granary@sha256:abc", "ghcr.io/g/granary-python"),
            ("ghcr.io/g/granary-python:0.1.0", "ghcr.io/g/granary-python:0.1.0"),
        ];
        for (image, expected) in table {
            assert_eq!(python_variant(image), expected, "{image}");
        }
    }

    #[test]
    fn the_configured_python_image_wins_over_the_variant() {
        let worker = "ghcr.io/granary-dev/granary:0.1.0";
        let table = [
            (None, "ghcr.io/granary-dev/granary-python:0.1.0"),
            (Some(""), "ghcr.io/granary-dev/granary-python:0.1.0"),
            (Some("  "), "ghcr.io/granary-dev/granary-python:0.1.0"),
            (Some(" reg.example.com/py:2 "), "reg.example.com/py:2"),
        ];
        for (configured, expected) in table {
            assert_eq!(python_image(configured, worker), expected, "{configured:?}");
        }
    }

    /// `spec.workers.image`: the pipeline's own image wins, Python stages or not.
    #[test]
    fn spec_workers_image_replaces_the_worker_image() {
        let chart = settings().image;
        let table = [
            (json!({}), chart.as_str()),
            (json!({"workers": {}}), chart.as_str()),
            (
                json!({"workers": {"image": "registry.example.com/team/aug:1"}}),
                "registry.example.com/team/aug:1",
            ),
            (
                json!({"workers": {"image": " registry.example.com/team/aug:1 "}}),
                "registry.example.com/team/aug:1",
            ),
            (
                json!({"workers": {"image": "registry.example.com/team/aug:2"},
                       "stages": [{"op": "python.map", "function": "augment:jitter"}]}),
                "registry.example.com/team/aug:2",
            ),
        ];
        for (spec, image) in table {
            let pod = pod(spec.clone());
            assert_eq!(pod.containers[0].image.as_deref(), Some(image), "{spec}");
        }
    }

    /// The Python-capable image: only for pipelines with Python stages (`python.map`,
    /// `python.filter`) and no image of their own.
    #[test]
    fn pipelines_with_python_stages_get_the_python_image() {
        let chart = settings().image;
        let mixed = json!({"stages": [{"op": "test.sleep", "ms": 0},
                                      {"op": "python.map", "function": "m:f", "batched": true}]});
        let table = [
            (json!({}), chart.as_str()),
            (json!({"stages": [{"op": "test.sleep", "ms": 1}]}), chart.as_str()),
            (python_stage(), PYTHON_IMAGE),
            (mixed, PYTHON_IMAGE),
            (json!({"python": {"configMap": "code"}}), chart.as_str()),
            (json!({"stages": [{"op": "python.filter", "function": "m:keep"}]}), PYTHON_IMAGE),
        ];
        for (spec, image) in table {
            let pod = pod(spec.clone());
            assert_eq!(pod.containers[0].image.as_deref(), Some(image), "{spec}");
        }
    }

    /// `spec.python.configMap`: a configMap volume, mounted read-only at /etc/granary/python,
    /// which PYTHONPATH names; nothing of it without the field.
    #[test]
    fn spec_python_config_map_is_mounted_read_only_on_the_python_path() {
        let table = [
            (json!({}), None),
            (json!({"python": {}}), None),
            (python_stage(), None),
            (json!({"python": {"configMap": "augment-code"}}), Some("augment-code")),
            (
                json!({"python": {"configMap": "team.code"},
                       "stages": [{"op": "python.map", "function": "augment:jitter"}]}),
                Some("team.code"),
            ),
        ];
        for (spec, config_map) in table {
            let pod = pod(spec.clone());
            let c = &pod.containers[0];
            let volumes = pod.volumes.clone().unwrap_or_default();
            let volume = volumes.iter().find(|v| v.name == PYTHON_VOLUME);
            let mount = c.volume_mounts.iter().flatten().find(|m| m.name == PYTHON_VOLUME);
            let path = c.env.iter().flatten().find(|e| e.name == "PYTHONPATH");
            // The tmp emptyDir stays in every case.
            assert!(volumes.iter().any(|v| v.name == "tmp"), "{spec}");
            let Some(config_map) = config_map else {
                assert!(volume.is_none() && mount.is_none() && path.is_none(), "{spec}");
                continue;
            };
            let source = volume.and_then(|v| v.config_map.as_ref()).expect("a configMap volume");
            assert_eq!(source.name, config_map, "{spec}");
            assert_eq!(source.optional, None, "a missing ConfigMap holds the pod back: {spec}");
            let mount = mount.expect("a mount");
            assert_eq!((mount.mount_path.as_str(), mount.read_only), (PYTHON_MOUNT, Some(true)), "{spec}");
            assert_eq!(path.and_then(|e| e.value.as_deref()), Some(PYTHON_MOUNT), "{spec}");
        }
    }
}
