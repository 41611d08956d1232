//! `spec.scaling`: how many workers serve the pipeline.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Worker-count policy and bounds, within which the autoscaler sizes the worker pool.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.policy) || self.policy != 'fixed' || has(self.replicas)",
        "message": "policy `fixed` needs `replicas`, the number of workers to run"
    },
    {
        "rule": "!has(self.minWorkers) || !has(self.maxWorkers) || self.minWorkers <= self.maxWorkers",
        "message": "`minWorkers` must be <= `maxWorkers`"
    },
    {
        "rule": "!has(self.idleAfter) || (has(self.minWorkers) && self.minWorkers == 0)",
        "message": "`idleAfter` applies only with `minWorkers: 0`"
    }
]))]
pub struct ScalingSpec {
    /// `auto`: the autoscaler sizes the pool from trainer demand and worker throughput, within
    /// `minWorkers`..`maxWorkers`. `fixed`: exactly `replicas` workers. Defaults to `auto`.
    #[serde(default)]
    pub policy: ScalingPolicy,
    /// Worker count for `policy: fixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub replicas: Option<u32>,
    /// Lower bound for `policy: auto`. Defaults to 1. `0` lets an idle pipeline release every
    /// worker: with no trainer attached for `idleAfter` the pool goes to zero, and a trainer
    /// connecting starts workers again (it waits for their start, the cold start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_workers: Option<u32>,
    /// Upper bound for `policy: auto`. Defaults to 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_workers: Option<u32>,
    /// With `minWorkers: 0`: how long the pipeline may go without any trainer attached before
    /// its workers are released, as a duration such as `90s`, `5m` or `1h`. Defaults to `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub idle_after: Option<String>,
    /// Cost of one worker in dollars per hour, weighed against `trainerCostPerHour`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub worker_cost_per_hour: Option<f64>,
    /// Cost of the training job's accelerators in dollars per hour, the price of every second a
    /// trainer waits for data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub trainer_cost_per_hour: Option<f64>,
}

/// Worker-count policy.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ScalingPolicy {
    /// Size the pool from measured demand and throughput.
    #[default]
    Auto,
    /// Run exactly `replicas` workers.
    Fixed,
}

/// How long a `minWorkers: 0` pipeline waits without trainers before releasing its workers,
/// when `idleAfter` is not given.
pub const DEFAULT_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

impl ScalingSpec {
    /// Seconds without a trainer after which the pool goes to zero: `Some` only for
    /// `policy: auto` with `minWorkers: 0` (`idleAfter`, else [`DEFAULT_IDLE_AFTER`]). A
    /// malformed `idleAfter` reads as the default; validation reports it.
    pub fn idle_after_s(&self) -> Option<f64> {
        if self.policy != ScalingPolicy::Auto || self.min_workers != Some(0) {
            return None;
        }
        let idle = self.idle_after.as_deref().and_then(|t| crate::parse_duration(t).ok());
        Some(idle.unwrap_or(DEFAULT_IDLE_AFTER).as_secs_f64())
    }
}
