//! What a policy sees: one [`Observation`] of a pipeline's worker pool at time `now_s`.
//!
//! The fields mirror the gRPC metrics (`granary.v1.WorkerMetrics`, `granary.v1.ClientMetrics`) so
//! that the dispatcher can fill them without translation. Every rate is over the last reporting
//! interval. Values that are not finite or negative are read as zero by every policy.

use serde::{Deserialize, Serialize};

use crate::placement::Place;

/// Mean compute time of one stage, as a worker reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    /// Stage name, e.g. `image.decode → image.random_resized_crop`.
    pub stage: String,
    /// Mean compute seconds per element over the last interval.
    pub seconds_per_element: f64,
}

/// One running worker's metrics over the last interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerMetrics {
    /// Elements produced per second.
    pub elements_per_second: f64,
    /// Batch parts handed to consumers per second.
    pub batches_per_second: f64,
    /// Payload bytes sent to consumers per second.
    pub bytes_per_second: f64,
    /// Compute time per element of each stage.
    pub stages: Vec<StageTime>,
    /// Parts queued for consumers, all queues together.
    pub buffered_parts: u32,
    /// Capacity of those queues.
    pub buffer_capacity: u32,
    /// Splits in progress.
    pub active_leases: u32,
    /// CPU seconds used per second (0..=`cores`).
    pub cpu_cores_used: f64,
    /// Cores the worker may use.
    pub cores: u32,
    /// Compute seconds per element the worker spent finishing tensors its consumers would
    /// otherwise finish (placement put the job's final normalization on the workers); 0 when it
    /// finished none in the interval.
    #[serde(default)]
    pub finish_seconds_per_element: f64,
}

/// One consumer's (trainer process's) metrics over the last interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConsumerMetrics {
    /// Index of the consumer within its job.
    pub consumer_index: u32,
    /// Mean seconds per step spent outside the client (the trainer computing). Zero when the
    /// consumer finished no step in the interval.
    pub step_seconds: f64,
    /// Mean seconds per step spent waiting for a batch.
    pub wait_seconds: f64,
    /// Complete batches buffered in the client.
    pub buffered_batches: u32,
    /// Complete batches the client holds ahead at most now (its prefetch depth, which it tunes);
    /// 0 when it does not say, read as [`UNREPORTED_PREFETCH_BATCHES`].
    #[serde(default)]
    pub prefetch_batches: u32,
    /// Batches this consumer received since it started.
    pub batches_total: u64,
    /// Batches this consumer received per second.
    pub batches_per_second: f64,
    /// Cores its host left idle over the interval; `None` when the host cannot measure them.
    #[serde(default)]
    pub host_idle_cores: Option<f64>,
    /// Cores its client spent finishing tensors the workers left to it (placement), over the
    /// interval.
    #[serde(default)]
    pub finish_cores: f64,
}

/// The prefetch depth of a consumer that does not report one: the fixed depth clients held
/// before they tuned it.
pub const UNREPORTED_PREFETCH_BATCHES: u32 = 4;

impl ConsumerMetrics {
    /// How full the client's prefetch buffer is: batches buffered over the most it holds, 0 to
    /// 1. Comparable across consumers and over time, where the depth itself changes.
    pub fn prefetch_fill(&self) -> f64 {
        let depth = match self.prefetch_batches {
            0 => UNREPORTED_PREFETCH_BATCHES,
            depth => depth,
        };
        f64::from(self.buffered_batches.min(depth)) / f64::from(depth)
    }
}

/// How the batches of a job reach its consumers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobMode {
    /// Each batch goes to one consumer: the consumers are data-parallel peers, and the job
    /// needs `consumers / step_seconds` batches per second.
    #[default]
    Distributed,
    /// Every batch goes to every consumer: the job needs `1 / step_seconds` batches per second.
    Replicated,
}

/// The consumers of one job. Several jobs may share one worker pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobMetrics {
    /// Job name.
    pub name: String,
    /// Distributed or replicated delivery.
    pub mode: JobMode,
    /// The epoch being delivered (0 is the first).
    pub epoch: u32,
    /// Batches in one epoch of this job (all consumers together).
    pub batches_per_epoch: u64,
    /// Its connected consumers.
    pub consumers: Vec<ConsumerMetrics>,
    /// Where the job's deferred finishing (the final normalization) runs now: its clients, or
    /// the workers when the trainers' hosts have no room (see [`crate::placement`]).
    #[serde(default)]
    pub finishing: Place,
    /// The share of the job's images its clients' hosts make now, 0 to 1 (see
    /// [`crate::image_placement`]); their cost is part of the consumers' `finish_cores`.
    #[serde(default)]
    pub image_share: f64,
}

/// Bounds and prices that come with the pipeline's spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Fewest workers.
    pub min_workers: u32,
    /// Most workers. A value below `min_workers` is read as `min_workers`.
    pub max_workers: u32,
    /// Elements in one batch (the spec's batch size); 0 when unknown.
    pub elements_per_batch: u32,
    /// Price of one worker per hour, when known.
    pub worker_cost_per_hour: Option<f64>,
    /// Price of one consumer (trainer process with its accelerators) per hour, when known.
    pub trainer_cost_per_hour: Option<f64>,
    /// With `min_workers: 0`: seconds without any connected consumer after which the pool goes
    /// to zero workers, and below which it keeps one while workers run (the scale-to-zero rule,
    /// `idle`). `None`: no such rule; the policy alone sizes the pool within the bounds.
    #[serde(default)]
    pub idle_after_s: Option<f64>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_workers: 1,
            max_workers: 16,
            elements_per_batch: 0,
            worker_cost_per_hour: None,
            trainer_cost_per_hour: None,
            idle_after_s: None,
        }
    }
}

impl PoolConfig {
    /// The lowest allowed count.
    pub fn lower(&self) -> u32 {
        self.min_workers
    }

    /// The highest allowed count (never below [`PoolConfig::lower`]).
    pub fn upper(&self) -> u32 {
        self.max_workers.max(self.min_workers)
    }

    /// `n` moved into the bounds.
    pub fn clamp(&self, n: u32) -> u32 {
        n.clamp(self.lower(), self.upper())
    }

    /// Both prices, when both are set, finite and non-negative.
    pub fn prices(&self) -> Option<(f64, f64)> {
        let worker = self.worker_cost_per_hour.filter(|p| p.is_finite() && *p >= 0.0)?;
        let trainer = self.trainer_cost_per_hour.filter(|p| p.is_finite() && *p >= 0.0)?;
        Some((worker, trainer))
    }
}

/// Everything a policy is told at one evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Seconds since an arbitrary origin; only differences matter.
    pub now_s: f64,
    /// Workers started and reporting.
    pub running_workers: u32,
    /// The count the pool was last asked for.
    pub desired_workers: u32,
    /// One entry per reporting worker.
    pub workers: Vec<WorkerMetrics>,
    /// The jobs reading from this pool.
    pub jobs: Vec<JobMetrics>,
    /// Bounds and prices.
    pub config: PoolConfig,
}

impl Observation {
    /// Number of connected consumers over all jobs.
    pub fn consumer_count(&self) -> usize {
        self.jobs.iter().map(|j| j.consumers.len()).sum()
    }
}

/// `x` when finite and positive, else 0: how every policy reads a measured value.
pub(crate) fn sane(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}
