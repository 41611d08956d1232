//! `status`: what the operator and dispatcher report back.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of an `InputPipeline`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InputPipelineStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PipelinePhase>,
    /// Ready and desired workers, as `ready/desired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
    /// Elements delivered to trainers per second, recently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_per_second: Option<f64>,
    /// Cache state in words: `compute`, `writing at <stage>`, `reading at <stage>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Current epoch, counted from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u32>,
    /// Spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions such as `Ready`, each with a reason and a message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PipelineCondition>,
}

/// Lifecycle phase of a pipeline.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum PipelinePhase {
    /// Accepted, workers starting.
    Pending,
    /// Serving batches.
    Running,
    /// All epochs delivered.
    Succeeded,
    /// Stopped by an error that needs the user (see the `Ready` condition).
    Failed,
}

/// A condition in the Kubernetes convention.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PipelineCondition {
    /// Condition type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One-word reason in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Explanation in words, naming the field at fault where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}
