//! The operator's settings, from `granary operator`'s flags.

use granary_crds::WorkersSpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use std::time::Duration;

/// Field manager of every server-side apply, and the Events' reporting controller.
pub const MANAGER: &str = "granary-operator";
/// Finalizer that lets the operator forget a deleted pipeline before it goes.
pub const FINALIZER: &str = "granary.dev/cleanup";

/// How worker pods are built.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSettings {
    /// Container image holding `granary`.
    pub image: String,
    /// `imagePullPolicy`, when set.
    pub image_pull_policy: Option<String>,
    /// CPU and memory requests and limits of each worker.
    pub resources: Option<ResourceRequirements>,
    /// Secret (in the pipeline's namespace) whose keys become the workers' environment: the
    /// object-store credentials. Optional in the pod, so a namespace without it still runs.
    pub env_secret: Option<String>,
    /// `host:port` the workers dial for the dispatcher.
    pub dispatcher: String,
    /// Image of the workers of pipelines with `python.map` stages (and no `spec.workers.image`):
    /// one with Python and NumPy. `None`: the `-python` variant of `image`.
    pub python_image: Option<String>,
    /// Pod settings every pipeline's workers start from (the chart's `workers.pod` values), in
    /// `spec.workers`' shape; each pipeline's `spec.workers` is merged over them.
    pub pod_defaults: WorkersSpec,
}

/// Everything reconciliation needs besides the API client and the dispatcher.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Worker pods.
    pub workers: WorkerSettings,
    /// How often each pipeline's autoscaler evaluates.
    pub policy_period: Duration,
    /// How often a pipeline's status is refreshed while nothing else changes.
    pub status_period: Duration,
}
