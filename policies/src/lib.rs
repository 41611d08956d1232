//! Autoscaling policies for Granary's worker pools, as pure, deterministic functions of observed
//! metrics, with two baselines and a simulator to compare them against an oracle.
//!
//! No I/O, no clocks, no threads: time arrives as [`Observation::now_s`], and the same sequence
//! of observations always gives the same decisions. The dispatcher builds an [`Observation`] per
//! pool from its latest worker and client metrics, calls [`Policy::observe`], and scales the pool
//! to [`Decision::target`]; the reason goes to status, Events and logs.
//!
//! # The Granary policy
//!
//! * **Demand** `D` (batches/s): the sum over jobs of what their consumers would take if they
//!   never waited. A distributed job's consumers are data-parallel peers at their mean step
//!   time, so the job needs `consumers / step_seconds`; a replicated job needs `1 / step_seconds`.
//! * **Supply per worker** `r`: the measured output per worker while the workers are the
//!   bottleneck (buffers under half full and, where stage times tell, cores at least 80% busy).
//!   Otherwise it is `cores / (Σ stage seconds_per_element ×
//!   batch size)`, or the output scaled to all cores by the CPU in use.
//! * **Trainer hosts** ([`trainer_hosts`]): where a job's clients finish its tensors on their
//!   hosts' idle cores (placement), `r` counts that share of the work as done off the workers
//!   while every host keeps room for it at the demand, and as the workers' once a host would
//!   not: the workers' CPU per batch, `cores / r`, loses the finishing they do now and gains
//!   what they will do at `D`.
//! * **Needed** `n = ceil(D × headroom / r)` (headroom 1.02), within bounds. With both prices
//!   set, the count of least cost per batch instead, `argmin (C_trainers + n·c_worker) /
//!   min(n·r, D)`, which is `n` or `n − 1` (see [`granary::cost`]).
//! * **Noise**: `D` and `r` are means over the last 12 observations. A shift by more than a
//!   factor of `max(1.4, e^(3·cv))`, confirmed twice, restarts the window. With
//!   `band = max(3%, 3 × relative standard error)`, scale up to the model's count when even
//!   `D × (1 − band)` needs more workers, or when the count is short and the trainers keep
//!   waiting. Scale down only to the count for `D × (1 + band)`.
//! * **Evidence**: after the running count has equalled the desired count for 15 s, trainers
//!   who keep waiting 3 points more than the model expects get `ceil(n × (1 − expected) /
//!   (1 − wait))` workers (at least `n + 1`; with prices, one more only if it pays), kept as a
//!   floor. Scale down only while trainers wait under 1% and either worker buffers are over 75%
//!   full or the workers' cores are busy at most the fraction of them still needed (a slow
//!   consumer's backlog may sit in transport windows, not in worker queues); never scale up while trainers never wait and buffers are not draining.
//! * **Start-up**: while fewer workers run than were asked for, hold (up to 600 s).
//! * **Cooldown**: no reversal of direction within 120 s and 20 evaluations of a change.
//!
//! # Scale to zero
//!
//! [`idle::ScaleToZero`] wraps any policy: with `min_workers: 0` and
//! [`PoolConfig::idle_after_s`], a pool no trainer reads for that long goes to zero workers and
//! starts again when one connects; a pool whose every job completed releases every worker.
//!
//! # Baselines
//!
//! [`cachew::CachewPolicy`] (Cachew's incremental rule) and [`hpa::HpaPolicy`] (Kubernetes HPA at
//! 80% CPU). [`simulate`] runs all of them and the oracle on the named scenarios; [`report`]
//! renders the figures. The full write-up is `docs/autoscaling.md`.
//!
//! # Autocaching
//!
//! [`caching`] decides whether to cache a stage output of the deterministic prefix in object
//! storage and at which cut: [`caching::decide`] weighs every cut by measured compute, encode,
//! decode and store throughput, time and storage dollars; [`caching::forced`] follows
//! `spec.cache.at`; [`caching::cachew::decide`] is Cachew's autocacher as a baseline.

#![warn(missing_docs)]

mod bounds;
pub mod cachew;
pub mod caching;
mod counts;
pub mod decision;
pub mod error;
pub mod estimate;
pub mod granary;
pub mod hpa;
pub mod idle;
pub mod image_placement;
pub mod inputs;
pub mod placement;
pub mod policy;
pub mod policy_kind;
pub mod report;
pub mod simulate;
pub mod trainer_hosts;
mod window;
mod wording;

pub use decision::{Decision, DecisionKind};
pub use error::Error;
pub use granary::{GranaryConfig, GranaryPolicy};
pub use idle::ScaleToZero;
pub use inputs::{ConsumerMetrics, JobMetrics, JobMode, Observation, PoolConfig, StageTime, WorkerMetrics};
pub use policy::Policy;
pub use policy_kind::PolicyKind;
pub use report::Row;
