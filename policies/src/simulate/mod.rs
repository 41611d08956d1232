//! A deterministic simulator to compare policies against an oracle.
//!
//! Time advances in fixed ticks (1 s). Each tick, the running workers make
//! `running × cores / cpu_seconds_per_batch` batches per second, split max-min fairly over the
//! jobs and capped by the room in each job's buffers (the workers' part buffers plus the
//! consumers' prefetch). Each job's trainers take `consumers / step_seconds` batches per second
//! (distributed) and wait when nothing is buffered. Every `policy_period_s` (5 s) the simulator
//! builds an [`Observation`](crate::inputs::Observation) — the metrics of the last interval with
//! seeded multiplicative noise — calls the policy, and asks for its target; new workers produce
//! after the start-up delay, removed workers stop at once.
//!
//! The **oracle** knows the true demand and capacity: at every tick it asks for the fewest workers
//! within the bounds that keep every trainer from waiting (`ceil(demand / capacity)`), or with
//! prices the count of least cost per batch, and pays the same start-up delay. With scale to zero
//! (`min_workers: 0` and `idle_after_s`) it keeps one worker until the pool was idle that long.
//!
//! Jobs may connect later than the start ([`JobSpec::start_s`]): trainers that connect while no
//! worker runs wait for the start-up delay, and the policy is evaluated at once then (the
//! dispatcher wakes its autoscaler when a trainer registers). Every policy runs under the
//! scale-to-zero rule ([`ScaleToZero`](crate::idle::ScaleToZero)), as in the dispatcher.
//!
//! Per (scenario, policy), [`evaluate`] reports `decisions_to_converge` (see
//! [`decisions_to_converge`]: the maximum over phases), `training_time_vs_oracle` (time to
//! consume every job's batches, over the oracle's), `worker_seconds_vs_oracle` (workers asked
//! for, starting ones included, integrated until training ends) and `mean_wait_fraction`.

mod catalog;
mod evaluate;
mod observe;
mod run;
mod scenario;
mod world;

pub use catalog::{all as scenarios, named as scenario, names as scenario_names};
pub use evaluate::{
    PolicyResult, ScenarioResult, decisions_to_converge, evaluate, evaluate_all, rows, score,
};
pub use run::{DecisionRecord, Run, TracePoint, run_oracle, run_policy};
pub use scenario::{JobSpec, Phase, Scenario, StageSpec};
