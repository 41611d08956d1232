//! The worker pool under Kubernetes: a Deployment's `scale` subresource. The autoscaler (or a
//! fixed `spec.scaling.replicas`) sets the count; the Deployment controller starts and stops the
//! pods, and stopped pods drain within their termination grace period.

use granary_crds::{InputPipelineSpec, ScalingPolicy};
use granary_dispatcher::pool::{PoolError, PoolFuture, WorkerPool};
use granary_policies::PoolConfig;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};

/// Field manager of scale changes, apart from the operator's applies so that `spec.replicas`
/// never belongs to the applied configuration.
pub const SCALE_MANAGER: &str = "granary-autoscaler";

/// How a pipeline's pool is sized.
#[derive(Clone, Debug, PartialEq)]
pub enum Sizing {
    /// Exactly this many workers (`policy: fixed`).
    Fixed(u32),
    /// Within these bounds, as the autoscaler decides.
    Auto(PoolConfig),
}

/// The sizing `spec` asks for.
pub fn sizing(spec: &InputPipelineSpec) -> Sizing {
    let scaling = spec.scaling.clone().unwrap_or_default();
    match scaling.policy {
        ScalingPolicy::Fixed => Sizing::Fixed(scaling.replicas.unwrap_or(1)),
        ScalingPolicy::Auto => {
            let min = scaling.min_workers.unwrap_or(1);
            Sizing::Auto(PoolConfig {
                min_workers: min,
                max_workers: scaling.max_workers.unwrap_or(16).max(min),
                elements_per_batch: spec.batch.size,
                worker_cost_per_hour: scaling.worker_cost_per_hour,
                trainer_cost_per_hour: scaling.trainer_cost_per_hour,
                idle_after_s: scaling.idle_after_s(),
            })
        }
    }
}

/// The count to start from: the fixed count, or the current one kept within the bounds (a new
/// leader resumes where the pool is instead of starting over at `minWorkers`).
pub fn initial(sizing: &Sizing, current: Option<u32>) -> u32 {
    match sizing {
        Sizing::Fixed(n) => *n,
        Sizing::Auto(bounds) => {
            current.unwrap_or(bounds.lower()).clamp(bounds.lower(), bounds.max_workers.max(bounds.lower()))
        }
    }
}

/// A pipeline's worker Deployment as a [`WorkerPool`].
pub struct KubernetesPool {
    deployments: Api<Deployment>,
    name: String,
}

impl KubernetesPool {
    /// The pool of Deployment `name` reached through `deployments` (namespaced).
    pub fn new(deployments: Api<Deployment>, name: impl Into<String>) -> KubernetesPool {
        KubernetesPool { deployments, name: name.into() }
    }

    /// Sets the Deployment's `spec.replicas` through the scale subresource.
    pub async fn set(&self, n: u32) -> Result<(), PoolError> {
        let patch = serde_json::json!({ "spec": { "replicas": n } });
        self.deployments
            .patch_scale(&self.name, &scale_params(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| {
                PoolError(format!("cannot scale Deployment `{}` to {n}: {}", self.name, api_message(&e)))
            })
    }

    /// The Deployment's `status.replicas`: worker pods that exist.
    pub async fn running(&self) -> Result<u32, PoolError> {
        let scale = self.deployments.get_scale(&self.name).await.map_err(|e| {
            PoolError(format!("cannot read the scale of Deployment `{}`: {}", self.name, api_message(&e)))
        })?;
        Ok(scale.status.map_or(0, |s| s.replicas.max(0) as u32))
    }
}

/// What the API server said, for an error it answered (its `Status` message and reason, without
/// the debug dump kube's `Display` appends); otherwise the error as it displays.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => other.to_string(),
    }
}

fn scale_params() -> PatchParams {
    PatchParams { field_manager: Some(SCALE_MANAGER.to_string()), ..PatchParams::default() }
}

impl WorkerPool for KubernetesPool {
    fn scale_to(&mut self, n: u32) -> PoolFuture<'_, ()> {
        Box::pin(async move { self.set(n).await })
    }

    fn current(&mut self) -> PoolFuture<'_, u32> {
        Box::pin(async move { self.running().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pipeline;

    fn spec(scaling: serde_json::Value) -> InputPipelineSpec {
        let mut p = pipeline("ns", "p", "u");
        p.spec.scaling = serde_json::from_value(scaling).unwrap();
        p.spec
    }

    #[test]
    fn sizing_reads_the_policy_and_its_bounds() {
        assert_eq!(sizing(&spec(serde_json::json!({"policy": "fixed", "replicas": 3}))), Sizing::Fixed(3));
        let Sizing::Auto(bounds) = sizing(&spec(serde_json::json!({"minWorkers": 2, "maxWorkers": 5})))
        else {
            panic!("auto")
        };
        assert_eq!((bounds.min_workers, bounds.max_workers, bounds.elements_per_batch), (2, 5, 8));
        let Sizing::Auto(bounds) = sizing(&spec(serde_json::Value::Null)) else { panic!("auto by default") };
        assert_eq!((bounds.min_workers, bounds.max_workers, bounds.idle_after_s), (1, 16, None));
        let Sizing::Auto(bounds) = sizing(&spec(serde_json::json!({"minWorkers": 0, "idleAfter": "2m"})))
        else {
            panic!("auto")
        };
        assert_eq!((bounds.min_workers, bounds.idle_after_s), (0, Some(120.0)));
        assert_eq!(initial(&Sizing::Auto(bounds), None), 0, "an idle pool starts empty");
    }

    #[test]
    fn a_new_leader_resumes_the_pool_within_its_bounds() {
        let auto = sizing(&spec(serde_json::json!({"minWorkers": 2, "maxWorkers": 5})));
        assert_eq!(initial(&auto, None), 2);
        assert_eq!(initial(&auto, Some(1)), 2);
        assert_eq!(initial(&auto, Some(4)), 4);
        assert_eq!(initial(&auto, Some(9)), 5);
        assert_eq!(initial(&Sizing::Fixed(3), Some(9)), 3);
    }
}
