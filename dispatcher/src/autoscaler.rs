//! Sizing a pipeline's worker pool: every period, the autoscaling policy observes the
//! dispatcher's latest worker and consumer metrics, and the pool is scaled to its target. Workers
//! removed from the pool drain (finish or return their leases), and clients drop whatever a
//! replay sends twice, so scaling never loses or duplicates an element.

use crate::plan::Mode;
use crate::pool::WorkerPool;
use crate::service::Dispatcher;
use granary_policies as policies;
use granary_policies::{Decision, Observation, Policy, PoolConfig};
use granary_proto::v1 as pb;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
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
        }
    }

    /// The report handle.
    pub fn scaling(&self) -> Scaling {
        self.scaling.clone()
    }

    /// Evaluates every period until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => { self.evaluate().await; }
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
        let decision = self.policy.observe(&observation);
        let at_s = observation.now_s;
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

    /// The policy's view of the pipeline now. Workers count as running once they report.
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
                };
                (p.job, job)
            })
            .collect();
        for (job, index, m) in &snapshot.consumers {
            if let Some(j) = jobs.get_mut(job) {
                j.consumers.push(consumer(*index, m));
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
    }
}

fn consumer(index: u32, m: &pb::ClientMetrics) -> policies::ConsumerMetrics {
    policies::ConsumerMetrics {
        consumer_index: index,
        step_seconds: m.step_seconds,
        wait_seconds: m.wait_seconds,
        buffered_batches: m.buffered_batches,
        batches_total: m.batches_total,
        batches_per_second: m.batches_per_second,
    }
}
