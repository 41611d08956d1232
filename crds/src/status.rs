//! `status`: what the operator and dispatcher report back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of an `InputPipeline`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InputPipelineStatus {
    /// Lifecycle phase: `Pending`, `Running`, `Degraded`, `Failed` or `Completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PipelinePhase>,
    /// Ready and desired workers, as `ready/desired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
    /// Worker pods ready to serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_workers: Option<u32>,
    /// Worker count the autoscaler (or `spec.scaling.replicas`) asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_workers: Option<u32>,
    /// Elements delivered to trainers per second, recently (all consumers together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<f64>,
    /// Share of the trainers' time spent waiting for batches, recently: 0 (never waits) to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer_wait_fraction: Option<f64>,
    /// What the autocacher decided and what the cache holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheStatus>,
    /// Elements a stage failed on that were dropped under `spec.errors.policy: skip`, over every
    /// job and epoch (counted once per split, epoch and job). Absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_elements: Option<u64>,
    /// Current epoch of the slowest consumer, counted from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u32>,
    /// Spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The plan the workers run, when the optimizer rewrote the stages (`granary plan` prints
    /// it with every rule). Absent when the stages run as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// Where trainers connect: the dispatcher's address and the pipeline's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// `Ready`, `Scaling`, `Caching` and `Degraded`, in Kubernetes' standard form: each with
    /// its status, a CamelCase reason, a message, the generation it describes and when its
    /// status last changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The plan in effect: the stages in the order they run, the fields the source reads, and each
/// rewrite of the optimizer.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// The stages in the order they run, each `spec.stages[i] name` by its place as written.
    pub stages: Vec<String>,
    /// The fields the source reads, when not all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_fields: Option<Vec<String>>,
    /// One line per rewrite: what moved, or what the source skips, and why the output is the
    /// same.
    pub rewrites: Vec<String>,
}

/// Where a pipeline's trainers connect, as the Rust and Python clients take it
/// (`granary.Pipeline(pipeline, dispatcher=dispatcher)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The dispatcher's `host:port`, inside the cluster.
    pub dispatcher: String,
    /// The pipeline's key at the dispatcher: `<namespace>/<name>`.
    pub pipeline: String,
}

/// Lifecycle phase of a pipeline.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum PipelinePhase {
    /// Accepted; workers starting or the source not yet listed.
    Pending,
    /// Serving batches.
    Running,
    /// Serving, but something needs attention (see the `Degraded` condition).
    Degraded,
    /// Stopped by an error that needs the user (see the `Ready` condition).
    Failed,
    /// Every job delivered every epoch.
    Completed,
}

/// The cache of a pipeline, as `kubectl get` and `describe` show it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CacheStatus {
    /// `off` (no `spec.cache` or `policy: never`), `profiling` (measuring before deciding),
    /// `compute` (decided not to cache), `writing` or `reading`.
    pub state: String,
    /// Stage whose output is cached, when writing or reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// Fingerprint of the cache entry, when writing or reading (the first source's, with
    /// `spec.sources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// With `spec.sources`, when writing or reading: each source's entry, in order. A source's
    /// entry is the one a single-source pipeline reading it with the same stages uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceCacheEntry>,
    /// Entry bytes read so far, as stored.
    #[serde(default)]
    pub bytes_read: u64,
    /// Entry bytes written so far, as stored.
    #[serde(default)]
    pub bytes_written: u64,
    /// The autocacher's reason, with the figures that decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The closed loop's last check of a finished epoch, in words: the decision's predicted
    /// epoch time against the measured one, and what followed (within the tolerance, held, or
    /// re-deciding), e.g. "epoch 1: predicted 8.4 s computing, measured 2.1 s (−75%):
    /// re-deciding → write `small` (cut 2)". Absent until an epoch finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// How many times the closed loop re-decided caching because an epoch's measured time was
    /// off the prediction by more than the tolerance.
    #[serde(default)]
    pub redecisions: u32,
}

/// One source's cache entry in `status.cache.sources`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceCacheEntry {
    /// The source's name in `spec.sources`.
    pub name: String,
    /// Fingerprint of its entry.
    pub entry: String,
}
