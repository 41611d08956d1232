//! `spec.workers` and `spec.python`: how a pipeline's worker pods are made, beyond the chart's
//! defaults. The pod fields use Kubernetes' own types, so the API server checks their shape at
//! admission; [`WorkersSpec::check`] adds what the schema cannot say (names, references between
//! fields, and what Granary itself sets in the pod).

mod check;
mod names;

use k8s_openapi::api::core::v1::{
    Affinity, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, Toleration, Volume,
    VolumeMount,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use check::{PYTHON_MOUNT, PYTHON_VOLUME, RESERVED_ENV, RESERVED_VOLUMES, TMP_MOUNT, TMP_VOLUME};
pub(crate) use names::is_dns_subdomain;

/// The pipeline's worker pods: each field is merged over the defaults the operator was
/// installed with (the chart's `workers` values). Maps merge key by key and lists add to the
/// defaults, this pipeline's entry winning on the same key or name; `resources` and `affinity`
/// replace the defaults whole. Ignored by `granary run`, which starts local processes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkersSpec {
    /// Container image of this pipeline's workers, instead of the chart's. For `python.map`
    /// stages whose code is a package, build one `FROM` Granary's Python image with the package
    /// installed (examples/python-stage/Dockerfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// CPU and memory requests and limits of each worker container, replacing the chart's
    /// `workers.resources`. The autoscaler counts a worker's cores from its CPU limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels a worker pod's node must have (`kubernetes.io/arch: amd64`, a node pool).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the worker pods tolerate, e.g. those of a dedicated CPU node pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod affinity of the worker pods (spread them, keep them near the trainers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// ServiceAccount the worker pods run as, in the pipeline's namespace: the identity cloud
    /// object stores map to a role (IRSA on EKS, Workload Identity on GKE). The pods still mount
    /// no Kubernetes API token: IRSA's webhook adds its own projected token, and GKE's metadata
    /// server needs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
    /// Secrets (in the pipeline's namespace) holding credentials for pulling the worker image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// PriorityClass of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Extra environment variables of the worker container (object-store settings such as
    /// `AWS_REGION`, values from Secrets). Variables Granary sets itself (`GRANARY_DISPATCHER`,
    /// `GRANARY_POD_IP`, `GRANARY_ADVERTISE`, `PYTHONPATH` with `spec.python`) cannot be given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Secrets and ConfigMaps whose keys become environment variables of the worker container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Extra volumes of the worker pods (a dataset on a PersistentVolumeClaim, a CSI mount, a
    /// projected token). `tmp` and `python` are Granary's own names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Where the worker container mounts `volumes`; each names one of them. `/tmp` and the
    /// Python code folder are Granary's own mount paths.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Extra labels of the worker pods. The labels Granary selects its pods by
    /// (`app.kubernetes.io/name`, `app.kubernetes.io/instance`, `app.kubernetes.io/managed-by`,
    /// `granary.dev/pipeline`) cannot be given.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// Extra annotations of the worker pods (a service mesh's opt-out, a cost-allocation tag).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
}

/// Where the workers find the code of `python.map` stages, besides their image.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PythonSpec {
    /// A ConfigMap in the pipeline's namespace whose keys are Python files (`augment.py: |`):
    /// mounted into the worker pods and importable there, so `function: augment:jitter` finds
    /// `jitter` in its `augment.py`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map: Option<String>,
}

impl PythonSpec {
    pub(crate) fn check(&self, problems: &mut Vec<crate::Problem>) {
        if let Some(name) = &self.config_map
            && !is_dns_subdomain(name)
        {
            problems.push(crate::Problem::new(
                "spec.python.configMap",
                format!(
                    "is `{name}`; a ConfigMap name is lowercase letters, digits, `-` and `.`, starting and ending \
                     with a letter or digit, at most 253 characters"
                ),
            ));
        }
    }
}
