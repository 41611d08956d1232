//! Running a scenario under a policy, or under the oracle, and what a run records.

use serde::{Deserialize, Serialize};

use super::scenario::Scenario;
use super::world::World;
use crate::idle::{ScaleToZero, idle_after};
use crate::policy::Policy;

/// One point of a run's time series (one per tick), for plotting.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TracePoint {
    /// Seconds since the start.
    pub t: f64,
    /// Workers producing.
    pub workers_running: u32,
    /// Workers asked for.
    pub workers_desired: u32,
    /// Batches per second the trainers would take if they never waited.
    pub demand: f64,
    /// Batches per second the running workers can make.
    pub supply: f64,
}

/// One change of the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// When.
    pub t: f64,
    /// Target before.
    pub from: u32,
    /// Target after.
    pub to: u32,
    /// The policy's reason.
    pub reason: String,
}

/// The outcome of one simulated run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Who drove it (`oracle` or the policy's name).
    pub policy: String,
    /// Seconds until every job consumed its batches (the time limit if they did not).
    pub training_time_s: f64,
    /// False when the time limit ended the run.
    pub finished: bool,
    /// When the first job finished; convergence is judged before this.
    pub first_job_done_s: f64,
    /// Integral of the workers asked for (starting ones included) over the run.
    pub worker_seconds: f64,
    /// Share of trainer time spent waiting.
    pub wait_fraction: f64,
    /// Every change of the target.
    pub decisions: Vec<DecisionRecord>,
    /// Targets outside the bounds that the policy returned (the simulator clamps them).
    pub bound_violations: u32,
    /// The time series.
    pub series: Vec<TracePoint>,
    /// Sum over jobs of the seconds from their trainers connecting until they are done (the
    /// time limit for a job that is not).
    #[serde(default)]
    pub job_seconds: f64,
    /// For each job whose trainers connected while no worker ran, seconds until its first
    /// batch (the cold start).
    #[serde(default)]
    pub cold_starts_s: Vec<f64>,
}

/// Who sets the target.
enum Driver<'p> {
    Policy(&'p mut dyn Policy, ScaleToZero),
    Oracle,
}

/// Runs `scenario` under `policy`, evaluated every `policy_period_s` and at once when trainers
/// connect while the target is zero (as the dispatcher wakes its autoscaler), with the
/// scale-to-zero rule ([`ScaleToZero`]) on top.
pub fn run_policy(scenario: &Scenario, policy: &mut dyn Policy) -> Run {
    let name = policy.name().to_string();
    simulate(scenario, Driver::Policy(policy, ScaleToZero::new()), name)
}

/// Runs `scenario` under the oracle: at every tick it asks for the oracle's count for the
/// current demand of the unfinished jobs, paying the same start-up delay as any policy. With
/// scale to zero it keeps one worker until no trainer consumed for `idle_after_s`, as the
/// policies must.
pub fn run_oracle(scenario: &Scenario) -> Run {
    simulate(scenario, Driver::Oracle, "oracle".to_string())
}

fn simulate(s: &Scenario, mut driver: Driver<'_>, policy: String) -> Run {
    let mut w = World::new(s);
    let tick = if s.tick_s > 0.0 && s.tick_s.is_finite() { s.tick_s } else { 1.0 };
    let max_ticks = (s.max_duration_s.max(tick) / tick).ceil().min(1e6) as u64;
    let period = ((s.policy_period_s / tick).round().max(1.0)) as u64;
    let mut run = Run {
        policy,
        training_time_s: 0.0,
        finished: false,
        first_job_done_s: f64::INFINITY,
        worker_seconds: 0.0,
        wait_fraction: 0.0,
        decisions: Vec::new(),
        bound_violations: 0,
        series: Vec::new(),
        job_seconds: 0.0,
        cold_starts_s: Vec::new(),
    };
    let mut arrived = 0;
    // When a trainer last consumed, for the oracle's idle time.
    let mut last_busy = 0.0;
    for k in 0..max_ticks {
        if w.all_done() {
            break;
        }
        let from = w.target;
        let arrival = w.arrived() > arrived;
        arrived = w.arrived();
        let proposal = match &mut driver {
            Driver::Oracle => {
                let active = w.active();
                if active.iter().any(|a| *a) {
                    last_busy = w.t;
                }
                let n = s.oracle_count(s.phase_at(w.t), &active);
                // Scale to zero is a bound in time: one worker stays until the pool was idle
                // for `idle_after_s`, as for every policy.
                let holding = idle_after(&s.config).is_some_and(|after| w.t - last_busy < after);
                let n = if n == 0 && from > 0 && holding { 1 } else { n };
                Some((n, "oracle".to_string()))
            }
            Driver::Policy(p, rule) if (k > 0 && k % period == 0) || (arrival && from == 0) => {
                let obs = w.observe();
                let d = rule.decide(&mut **p, &obs, false);
                Some((d.target, d.reason))
            }
            Driver::Policy(..) => None,
        };
        if let Some((target, reason)) = proposal {
            let bounded = s.config.clamp(target);
            if bounded != target {
                run.bound_violations += 1;
            }
            if bounded != from {
                run.decisions.push(DecisionRecord { t: w.t, from, to: bounded, reason });
                w.scale_to(bounded);
            }
        }
        let running = w.running();
        run.series.push(TracePoint {
            t: w.t,
            workers_running: running,
            workers_desired: w.target,
            demand: w.demand(),
            supply: f64::from(running) * w.worker_supply(),
        });
        w.tick();
    }
    let done: Vec<f64> = w.jobs.iter().filter_map(|j| j.done_at).collect();
    run.finished = w.all_done();
    run.training_time_s = if run.finished { done.iter().copied().fold(0.0, f64::max) } else { w.t };
    run.first_job_done_s = done.iter().copied().fold(run.training_time_s, f64::min);
    run.worker_seconds = w.worker_seconds;
    run.wait_fraction = w.wait_fraction();
    for (spec, job) in s.jobs.iter().zip(&w.jobs) {
        let Some((_, running)) = job.arrived else { continue };
        run.job_seconds += job.done_at.unwrap_or(w.t) - spec.start_s;
        if running == 0 {
            run.cold_starts_s.push(job.first_batch_at.unwrap_or(w.t) - spec.start_s);
        }
    }
    run
}
