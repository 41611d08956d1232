//! The objects an `InputPipeline` owns, as pure functions of the pipeline and the operator's
//! settings: the worker Deployment (without `replicas`: the count goes through the scale
//! subresource) and the headless Service in front of the worker pods. What `python.map` stages
//! add to the pod (image, code volume, `PYTHONPATH`) is in [`crate::python`].

use crate::config::WorkerSettings;
use crate::{pod, python};
use granary_crds::InputPipeline;
use granary_crds::workers::{TMP_MOUNT, TMP_VOLUME};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
    SecretEnvSource, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use std::collections::BTreeMap;

/// Port the workers serve batch streams on.
pub const WORKER_DATA_PORT: i32 = 7071;
/// Port the workers serve `/metrics` on.
pub const WORKER_METRICS_PORT: i32 = 9090;
/// Seconds a worker pod gets to drain after SIGTERM: its drain timeout (20 s) plus the time to
/// give leases back, so a scale-down never cuts a split short.
pub const WORKER_GRACE_SECONDS: i64 = 30;
/// Longest pipeline name: `<name>-workers` must be a Service name (at most 63 characters).
pub const MAX_NAME: usize = 63 - SUFFIX.len();
const SUFFIX: &str = "-workers";

/// Name of the Deployment and the Service of pipeline `name`.
pub fn workers_name(name: &str) -> String {
    format!("{name}{SUFFIX}")
}

/// The dispatcher's name for a pipeline: `<namespace>/<name>`, which trainers connect with.
pub fn pipeline_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Why `name` cannot name a pipeline's workers, if it cannot: it must be a DNS-1035 label of
/// at most [`MAX_NAME`] characters, since the Service `<name>-workers` is named after it.
pub fn check_name(name: &str) -> Result<(), String> {
    let label = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !label {
        return Err(format!(
            "`{name}` must start with a lowercase letter and hold only lowercase letters, digits and `-` \
             (not ending with `-`), because the worker Service `{name}{SUFFIX}` is named after it; rename the pipeline"
        ));
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "`{name}` has {} characters; at most {MAX_NAME}, so that `{name}{SUFFIX}` fits a Service name; \
             use a shorter name",
            name.len()
        ));
    }
    Ok(())
}

/// Labels on the workers' Deployment, Service and pods.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut labels = selector(name);
    labels.insert("app.kubernetes.io/instance".into(), name.into());
    labels.insert("app.kubernetes.io/managed-by".into(), "granary-operator".into());
    labels
}

/// The labels that select a pipeline's worker pods.
pub fn selector(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "granary-worker".to_string()),
        ("granary.dev/pipeline".to_string(), name.to_string()),
    ])
}

fn metadata(pipeline: &InputPipeline, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(workers_name(name)),
        namespace: pipeline.meta().namespace.clone(),
        labels: Some(labels(name)),
        owner_references: pipeline.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The worker Deployment of `pipeline`, as applied: no `replicas`. `python_image` is the
/// Python-capable worker image, for pipelines with `python.map` stages and no image of their own
/// ([`python::worker_image`]).
pub fn deployment(pipeline: &InputPipeline, settings: &WorkerSettings, python_image: &str) -> Deployment {
    let name = pipeline.meta().name.clone().unwrap_or_default();
    let namespace = pipeline.meta().namespace.clone().unwrap_or_default();
    let key = pipeline_key(&namespace, &name);
    let pod_ip = EnvVar {
        name: "GRANARY_POD_IP".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: "status.podIP".into(), ..Default::default() }),
            ..Default::default()
        }),
        ..EnvVar::default()
    };
    let mut env = vec![
        env("GRANARY_DISPATCHER", settings.dispatcher.clone()),
        pod_ip,
        env("GRANARY_ADVERTISE", format!("$(GRANARY_POD_IP):{WORKER_DATA_PORT}")),
    ];
    let mut volume_mounts =
        vec![VolumeMount { name: TMP_VOLUME.into(), mount_path: TMP_MOUNT.into(), ..Default::default() }];
    let mut volumes = vec![Volume {
        name: TMP_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    if let Some((volume, mount, python_path)) = python::code_volume(pipeline) {
        volumes.push(volume);
        volume_mounts.push(mount);
        env.push(python_path);
    }
    let mut container = Container {
        name: "worker".into(),
        image: Some(python::worker_image(pipeline, settings, python_image)),
        image_pull_policy: settings.image_pull_policy.clone(),
        args: Some(
            [
                "worker",
                "--listen",
                &format!("0.0.0.0:{WORKER_DATA_PORT}"),
                "--pipeline",
                &key,
                "--metrics-addr",
                &format!("0.0.0.0:{WORKER_METRICS_PORT}"),
            ]
            .map(String::from)
            .to_vec(),
        ),
        env: Some(env),
        env_from: settings.env_secret.as_ref().map(|secret| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource { name: secret.clone(), optional: Some(true) }),
                ..Default::default()
            }]
        }),
        ports: Some(vec![port("data", WORKER_DATA_PORT), port("metrics", WORKER_METRICS_PORT)]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("data".into()),
                ..Default::default()
            }),
            period_seconds: Some(5),
            ..Default::default()
        }),
        resources: settings.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    };
    let mut pod = PodSpec {
        // Workers never call the API server: no ServiceAccount token in the pod, so a
        // compromised worker holds no credentials for the cluster. A `serviceAccountName` for
        // cloud identity keeps it so: IRSA's and Azure's webhooks add their own projected token,
        // and GKE's metadata server needs none.
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(WORKER_GRACE_SECONDS),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    let mut pod_labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    for layer in [&settings.pod_defaults, &pipeline.spec.workers.clone().unwrap_or_default()] {
        pod::merge(&mut pod, &mut container, &mut pod_labels, &mut annotations, layer);
    }
    pod_labels.extend(labels(&name));
    pod.containers = vec![container];
    Deployment {
        metadata: metadata(pipeline, &name),
        spec: Some(DeploymentSpec {
            selector: LabelSelector { match_labels: Some(selector(&name)), ..Default::default() },
            // New workers come up before old ones drain, so a spec change never empties the pool.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::String("25%".into())),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The headless Service of `pipeline`'s workers: DNS for each pod and a target for scraping.
pub fn service(pipeline: &InputPipeline) -> Service {
    let name = pipeline.meta().name.clone().unwrap_or_default();
    let port = |name: &str, port: i32| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Service {
        metadata: metadata(pipeline, &name),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector(&name)),
            ports: Some(vec![port("data", WORKER_DATA_PORT), port("metrics", WORKER_METRICS_PORT)]),
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{pipeline, pipeline_with, settings};

    #[test]
    fn names_must_fit_a_service_name() {
        assert!(check_name("imagenet-resnet50").is_ok());
        assert!(check_name(&"a".repeat(MAX_NAME)).is_ok());
        let long = check_name(&"a".repeat(MAX_NAME + 1)).unwrap_err();
        assert!(long.contains("at most 55"), "{long}");
        for bad in ["9lives", "with.dot", "trailing-", "Upper"] {
            assert!(check_name(bad).unwrap_err().contains("rename"), "{bad}");
        }
    }

    #[test]
    fn the_deployment_omits_replicas_and_runs_granary_worker_for_the_pipeline() {
        let p = pipeline("ns", "imagenet", "uid-1");
        let d = deployment(&p, &settings(), "ghcr.io/granary-dev/granary-python:0.1.0");
        assert_eq!(d.metadata.name.as_deref(), Some("imagenet-workers"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("InputPipeline", "uid-1", Some(true))
        );
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, None, "the count goes through the scale subresource");
        let selector = spec.selector.match_labels.as_ref().unwrap();
        let pod = spec.template.spec.as_ref().unwrap();
        let labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the selector matches the pods");
        assert_eq!(pod.termination_grace_period_seconds, Some(WORKER_GRACE_SECONDS));
        let c = &pod.containers[0];
        let args = c.args.as_ref().unwrap().join(" ");
        assert!(args.starts_with("worker --listen 0.0.0.0:7071 --pipeline ns/imagenet"), "{args}");
        let env: BTreeMap<_, _> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(env["GRANARY_DISPATCHER"], "granary-dispatcher.granary.svc:7070");
        assert_eq!(env["GRANARY_ADVERTISE"], "$(GRANARY_POD_IP):7071");
        let pos = |n: &str| c.env.as_ref().unwrap().iter().position(|e| e.name == n).unwrap();
        assert!(pos("GRANARY_POD_IP") < pos("GRANARY_ADVERTISE"), "$(VAR) expands only earlier variables");
        assert_eq!(c.security_context.as_ref().unwrap().read_only_root_filesystem, Some(true));
        assert_eq!(c.env_from.as_ref().unwrap()[0].secret_ref.as_ref().unwrap().name, "s3-credentials");
        assert_eq!(c.resources, settings().resources);
        assert_eq!(c.image, Some(settings().image), "no python.map stage: the chart's image");
    }

    #[test]
    fn worker_pods_mount_no_token_and_pass_the_restricted_pod_security_profile() {
        let with_code =
            pipeline_with("ns", "jitter", "uid-3", serde_json::json!({"python": {"configMap": "augment"}}));
        for p in [pipeline("ns", "imagenet", "uid-1"), with_code] {
            let d = deployment(&p, &settings(), "ghcr.io/granary-dev/granary-python:0.1.0");
            let pod = d.spec.unwrap().template.spec.unwrap();
            assert_eq!(pod.automount_service_account_token, Some(false), "workers need no API token");
            let pod_context = pod.security_context.clone().unwrap_or_default();
            assert_eq!(pod_context.seccomp_profile.map(|s| s.type_).as_deref(), Some("RuntimeDefault"));
            assert!(pod_context.run_as_user.is_some_and(|uid| uid != 0));
            assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
            for volume in pod.volumes.iter().flatten() {
                assert!(
                    volume.empty_dir.is_some() || volume.config_map.is_some(),
                    "{}: a volume type the restricted profile may forbid",
                    volume.name
                );
            }
            let containers = pod.containers.iter().chain(pod.init_containers.iter().flatten());
            for c in containers {
                let sc = c.security_context.clone().unwrap_or_default();
                assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
                assert_ne!(sc.privileged, Some(true), "{}", c.name);
                assert!(
                    sc.run_as_non_root == Some(true) || pod_context.run_as_non_root == Some(true),
                    "{}: runAsNonRoot",
                    c.name
                );
                let caps = sc.capabilities.unwrap_or_default();
                assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{}", c.name);
                assert!(caps.add.unwrap_or_default().iter().all(|a| a == "NET_BIND_SERVICE"), "{}", c.name);
            }
        }
    }

    #[test]
    fn the_service_is_headless_over_the_worker_pods() {
        let p = pipeline("ns", "bert", "uid-2");
        let s = service(&p);
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("bert-workers"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.as_ref(), Some(&selector("bert")));
        let ports: Vec<i32> = spec.ports.as_ref().unwrap().iter().map(|p| p.port).collect();
        assert_eq!(ports, vec![WORKER_DATA_PORT, WORKER_METRICS_PORT]);
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-2");
    }

    #[test]
    fn a_secretless_operator_adds_no_env_from() {
        let p = pipeline("ns", "bert", "uid-2");
        let settings = WorkerSettings { env_secret: None, ..settings() };
        let d = deployment(&p, &settings, "ghcr.io/granary-dev/granary-python:0.1.0");
        assert!(d.spec.unwrap().template.spec.unwrap().containers[0].env_from.is_none());
    }
}
