//! Sizing a pipeline's worker pool: every period, the autoscaling policy observes the
//! dispatcher's latest worker and consumer metrics, and the pool is scaled to its target. Workers
//! removed from the pool drain (finish or return their leases), and clients drop whatever a
//! replay sends twice, so scaling never loses or duplicates an element.
//!
//! The scale-to-zero rule ([`ScaleToZero`]) runs on top of the policy: with `min_workers: 0`
//! and `idle_after_s`, a pool no trainer reads for that long goes to zero; a pipeline whose every
//! job delivered every epoch releases its workers whatever `min_workers` says. A trainer that
//! registers while the pool is at zero wakes the autoscaler, which starts workers at once.

use crate::plan::Mode;
use crate::pool::WorkerPool;
use crate::service::Dispatcher;
use granary_policies as policies;
use granary_policies::placement::{HostLoad, Place};
use granary_policies::{Decision, Observation, Policy, PoolConfig, ScaleToZero};
use granary_proto::v1 as pb;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A pool the autoscaler and its owner share.
pub type SharedPool = Arc<tokio::sync::Mutex<dyn WorkerPool>>;

/// Decisions kept for status and summaries.
const KEPT_DECISIONS: usize = 100;

/// One change of the target worker count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// Seconds since the autoscaler started.
    pub at_s: f64,
    /// Target before.
    pub from: u32,
    /// Target after.
    pub to: u32,
    /// Why, in words.
    pub reason: String,
}

/// What the autoscaler reports while it runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScalingReport {
    /// The current target.
    pub desired: u32,
    /// Worker processes running at the last evaluation.
    pub running: u32,
    /// Integral of running workers over time, in worker-seconds.
    pub worker_seconds: f64,
    /// The latest reason, also when the target held.
    pub last_reason: String,
    /// Changes of the target so far, up and down.
    pub scale_ups: u64,
    /// See `scale_ups`.
    pub scale_downs: u64,
    /// The most recent changes, oldest first.
    pub decisions: VecDeque<DecisionRecord>,
    /// Starts from zero workers so far.
    pub cold_starts: u64,
    /// Seconds from the latest start from zero until a worker reported (measured at the
    /// evaluations); `None` before the first such start completed.
    pub last_cold_start_s: Option<f64>,
}

/// A handle on the autoscaler's report.
#[derive(Clone, Default)]
pub struct Scaling(Arc<Mutex<ScalingReport>>);

impl Scaling {
    /// A copy of the report.
    pub fn report(&self) -> ScalingReport {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn update(&self, f: impl FnOnce(&mut ScalingReport)) {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Drives one pipeline's pool from its policy.
pub struct Autoscaler {
    dispatcher: Dispatcher,
    pipeline: String,
    policy: Box<dyn Policy + Send>,
    pool: SharedPool,
    config: PoolConfig,
    period: Duration,
    started: Instant,
    last: Option<Instant>,
    desired: u32,
    scaling: Scaling,
    idle: ScaleToZero,
    /// When the pool last started from zero workers, until one reports.
    cold_since: Option<Instant>,
}

impl Autoscaler {
    /// An autoscaler for `pipeline` that evaluates `policy` every `period` and scales `pool`,
    /// whose target is `initial` now.
    pub fn new(
        dispatcher: Dispatcher,
        pipeline: &str,
        policy: Box<dyn Policy + Send>,
        pool: SharedPool,
        config: PoolConfig,
        period: Duration,
        initial: u32,
    ) -> Autoscaler {
        let scaling = Scaling::default();
        scaling.update(|r| r.desired = initial);
        Autoscaler {
            dispatcher,
            pipeline: pipeline.to_string(),
            policy,
            pool,
            config,
            period,
            started: Instant::now(),
            last: None,
            desired: initial,
            scaling,
            idle: ScaleToZero::new(),
            cold_since: None,
        }
    }

    /// The report handle.
    pub fn scaling(&self) -> Scaling {
        self.scaling.clone()
    }

    /// Evaluates every period, and at once when a trainer registers while the pool is at zero,
    /// until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let arrivals = self.dispatcher.trainer_arrivals(&self.pipeline);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => { self.evaluate().await; }
                () = arrivals.notified() => {
                    if self.desired == 0 {
                        tracing::info!(pipeline = %self.pipeline, "a trainer registered while no worker runs");
                        self.evaluate().await;
                    }
                }
            }
        }
    }

    /// One evaluation: observe, decide, scale when the target changes.
    pub async fn evaluate(&mut self) -> Decision {
        let running = match self.pool.lock().await.current().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(pipeline = %self.pipeline, "cannot count the workers: {e}");
                self.desired
            }
        };
        let now = Instant::now();
        let dt = self.last.map_or(0.0, |last| now.duration_since(last).as_secs_f64());
        self.last = Some(now);
        let observation = self.observe(now);
        let completed = self.completed();
        let decision = self.idle.decide(&mut *self.policy, &observation, completed);
        let at_s = observation.now_s;
        let cold_start = self.cold_start(now, observation.running_workers, &decision);
        if decision.is_change() {
            tracing::info!(
                pipeline = %self.pipeline,
                from = self.desired,
                to = decision.target,
                "scaling: {}",
                decision.reason
            );
            if let Err(e) = self.pool.lock().await.scale_to(decision.target).await {
                tracing::error!(pipeline = %self.pipeline, "cannot scale to {} workers: {e}", decision.target);
            }
        }
        let from = self.desired;
        self.desired = decision.target;
        self.scaling.update(|r| {
            r.worker_seconds += f64::from(running) * dt;
            r.running = running;
            r.desired = decision.target;
            r.last_reason = decision.reason.clone();
            match cold_start {
                ColdStart::Began => r.cold_starts += 1,
                ColdStart::Took(s) => r.last_cold_start_s = Some(s),
                ColdStart::None => {}
            }
            if decision.is_change() {
                if decision.target > from {
                    r.scale_ups += 1;
                } else {
                    r.scale_downs += 1;
                }
                r.decisions.push_back(DecisionRecord {
                    at_s,
                    from,
                    to: decision.target,
                    reason: decision.reason.clone(),
                });
                while r.decisions.len() > KEPT_DECISIONS {
                    r.decisions.pop_front();
                }
            }
        });
        decision
    }

    /// Whether every job of the pipeline delivered every epoch (as the operator's Completed
    /// phase): then, with no trainer attached, the pool releases its workers.
    fn completed(&self) -> bool {
        self.dispatcher.completed(&self.pipeline)
    }

    /// Tracks starts from zero: one begins when the target leaves zero, and took until the
    /// first evaluation that finds a worker running.
    fn cold_start(&mut self, now: Instant, running: u32, decision: &Decision) -> ColdStart {
        if let Some(since) = self.cold_since {
            if decision.target == 0 {
                self.cold_since = None;
            } else if running > 0 {
                self.cold_since = None;
                let took = now.duration_since(since).as_secs_f64();
                tracing::info!(pipeline = %self.pipeline, "cold start: a worker runs {took:.1} s after starting from zero");
                return ColdStart::Took(took);
            }
            return ColdStart::None;
        }
        if self.desired == 0 && decision.target > 0 && running == 0 {
            self.cold_since = Some(now);
            return ColdStart::Began;
        }
        ColdStart::None
    }

    /// The policy's view of the pipeline now. Workers count as running once they report;
    /// consumers while they are attached (registered, neither gone nor finished), with zero
    /// metrics when none reported yet.
    fn observe(&self, now: Instant) -> Observation {
        let snapshot = self.dispatcher.snapshot(&self.pipeline);
        let reporting = u32::try_from(snapshot.workers.len()).unwrap_or(u32::MAX);
        let mut jobs: BTreeMap<String, policies::JobMetrics> = self
            .dispatcher
            .progress(&self.pipeline)
            .into_iter()
            .map(|p| {
                let job = policies::JobMetrics {
                    name: p.job.clone(),
                    mode: match p.mode {
                        Mode::Distributed => policies::JobMode::Distributed,
                        Mode::Replicated => policies::JobMode::Replicated,
                    },
                    epoch: p.epoch,
                    batches_per_epoch: p.batches_per_epoch,
                    consumers: Vec::new(),
                    finishing: if p.normalize_on_worker { Place::Workers } else { Place::Client },
                    image_share: p.image_share,
                };
                (p.job, job)
            })
            .collect();
        let attached: BTreeSet<(String, u32)> =
            self.dispatcher.attached(&self.pipeline).into_iter().collect();
        let mut reported = false;
        let hosts: BTreeMap<(&str, u32), &HostLoad> =
            snapshot.hosts.iter().map(|(job, index, load)| ((job.as_str(), *index), load)).collect();
        for (job, index, m) in &snapshot.consumers {
            if let (Some(j), true) = (jobs.get_mut(job), attached.contains(&(job.clone(), *index))) {
                let mut c = consumer(*index, m);
                if let Some(host) = hosts.get(&(job.as_str(), *index)) {
                    c.host_idle_cores = host.idle_cores;
                    // What the client spends finishing while it does (placement keeps the last
                    // figure it reported above nothing).
                    if j.finishing == Place::Client {
                        c.finish_cores = host.last_finish_cores.unwrap_or(0.0);
                    }
                }
                j.consumers.push(c);
                reported = true;
            }
        }
        // Trainers that registered but never reported still count as attached (one waiting on a
        // pool at zero finishes no step to report); they are left out once another reports, so
        // that their unknown step time does not hide the known demand.
        let unreported = if reported { Vec::new() } else { attached.iter().collect() };
        for (job, index) in unreported {
            if let Some(j) = jobs.get_mut(job) {
                j.consumers.push(policies::ConsumerMetrics { consumer_index: *index, ..Default::default() });
            }
        }
        Observation {
            now_s: now.duration_since(self.started).as_secs_f64(),
            running_workers: reporting,
            desired_workers: self.desired,
            workers: snapshot.workers.iter().map(|(_, m)| worker(m)).collect(),
            jobs: jobs.into_values().filter(|j| !j.consumers.is_empty()).collect(),
            config: self.config.clone(),
        }
    }
}

/// What an evaluation did to the tracking of starts from zero.
enum ColdStart {
    None,
    Began,
    Took(f64),
}

fn worker(m: &pb::WorkerMetrics) -> policies::WorkerMetrics {
    policies::WorkerMetrics {
        elements_per_second: m.elements_per_second,
        batches_per_second: m.batches_per_second,
        bytes_per_second: m.bytes_per_second,
        stages: m
            .stages
            .iter()
            .map(|s| policies::StageTime {
                stage: s.stage.clone(),
                seconds_per_element: s.seconds_per_element,
            })
            .collect(),
        buffered_parts: m.buffered_parts,
        buffer_capacity: m.buffer_capacity,
        active_leases: m.active_leases,
        cpu_cores_used: m.cpu_cores_used,
        cores: m.cores,
        finish_seconds_per_element: m.finish_seconds_per_element,
    }
}

fn consumer(index: u32, m: &pb::ClientMetrics) -> policies::ConsumerMetrics {
    policies::ConsumerMetrics {
        consumer_index: index,
        step_seconds: m.step_seconds,
        wait_seconds: m.wait_seconds,
        buffered_batches: m.buffered_batches,
        prefetch_batches: m.prefetch_batches,
        batches_total: m.batches_total,
        batches_per_second: m.batches_per_second,
        host_idle_cores: None,
        finish_cores: 0.0,
    }
}

#[cfg(test)]
mod tests;
