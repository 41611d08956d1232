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
    /// Lower bound for `policy: auto`. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_workers: Option<u32>,
    /// Upper bound for `policy: auto`. Defaults to 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_workers: Option<u32>,
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
