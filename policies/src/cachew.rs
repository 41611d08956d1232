//! Cachew's autoscaling rule, the baseline Granary is measured against.
//!
//! Modelled on eth-easl/cachew `scaling_utils.cc` (`DynamicWorkerCountUpdate`) and its
//! dispatcher: clients report the mean batch time of their last 500 batches; the first 200 batches
//! and the 150 after each change of the worker count are discarded; metrics count only in the
//! first epoch. While scaling, each report adds a worker as long as the batch time improved by
//! more than 7% over the report at the previous count, and steps back to that count otherwise
//! (converged). Once converged, every 21st report is compared with the converged one: a result
//! queue 1.5× longer removes a worker, a batch time 1.5× longer adds one, and scaling resumes. A
//! report taken while the running count differs from the target is kept in the history but
//! changes nothing; an improvement beyond ±120% is discarded as unstable.

use std::collections::VecDeque;

use crate::bounds::enforce_bounds;
use crate::decision::Decision;
use crate::inputs::{Observation, sane};
use crate::policy::Policy;
use crate::wording::workers;

/// Cachew's constants.
#[derive(Clone, Debug, PartialEq)]
pub struct CachewConfig {
    /// Batches per report.
    pub batches_per_report: f64,
    /// Batches discarded at the start.
    pub warmup_batches: f64,
    /// Batches discarded after each change.
    pub discard_after_change: f64,
    /// Relative batch-time improvement that justifies one more worker.
    pub min_improvement_up: f64,
    /// Relative batch-time loss tolerated when removing a worker.
    pub max_loss_down: f64,
    /// Reports in a stable period before a re-check.
    pub stable_reports: u32,
    /// Queue growth that triggers a scale-down after a stable period.
    pub queue_growth: f64,
    /// Batch-time growth that triggers a scale-up after a stable period.
    pub batch_time_growth: f64,
}

impl Default for CachewConfig {
    fn default() -> Self {
        CachewConfig {
            batches_per_report: 500.0,
            warmup_batches: 200.0,
            discard_after_change: 150.0,
            min_improvement_up: 0.07,
            max_loss_down: 0.03,
            stable_reports: 20,
            queue_growth: 1.5,
            batch_time_growth: 1.5,
        }
    }
}

/// One client report.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Report {
    workers: u32,
    batch_time_s: f64,
    /// The consumers' mean prefetch fill ([`crate::inputs::ConsumerMetrics::prefetch_fill`]).
    queue: f64,
}

/// History kept (Cachew keeps the full history; the walk back needs only the last distinct
/// counts).
const HISTORY: usize = 64;

/// Cachew's incremental policy.
#[derive(Clone, Debug)]
pub struct CachewPolicy {
    config: CachewConfig,
    target: Option<u32>,
    scaling: bool,
    history: VecDeque<Report>,
    converged: Option<Report>,
    same_scale: u32,
    /// Batches (per consumer) and time where the current measurement started, once past the
    /// discarded batches.
    window_start: Option<(f64, f64)>,
    /// Batches (per consumer) before which nothing is measured.
    discard_until: f64,
}

impl Default for CachewPolicy {
    fn default() -> Self {
        CachewPolicy::new(CachewConfig::default())
    }
}

impl CachewPolicy {
    /// A policy with these constants and no history.
    pub fn new(config: CachewConfig) -> CachewPolicy {
        CachewPolicy {
            target: None,
            scaling: true,
            history: VecDeque::new(),
            converged: None,
            same_scale: 0,
            window_start: None,
            discard_until: config.warmup_batches,
            config,
        }
    }

    /// A report when the current measurement window is complete.
    fn measure(&mut self, obs: &Observation, batches: f64) -> Result<Report, String> {
        if batches < self.discard_until {
            return Err(format!("discarding batches: {batches:.0} of {:.0}", self.discard_until));
        }
        let Some((b0, t0)) = self.window_start else {
            self.window_start = Some((batches, obs.now_s));
            return Err("measurement started".to_string());
        };
        let done = batches - b0;
        if done < self.config.batches_per_report {
            return Err(format!("measuring: {done:.0} of {:.0} batches", self.config.batches_per_report));
        }
        self.window_start = Some((batches, obs.now_s));
        let consumers = obs.consumer_count().max(1) as f64;
        // The clients' buffers, as a share of their depth: the clients deepen them when their
        // trainer empties a full one, which lengthens the queue without the workers getting
        // further ahead.
        let queue: f64 = obs.jobs.iter().flat_map(|j| &j.consumers).map(|c| c.prefetch_fill()).sum();
        Ok(Report {
            workers: obs.running_workers,
            batch_time_s: (obs.now_s - t0) / done,
            queue: queue / consumers,
        })
    }

    /// `DynamicWorkerCountUpdate`: the next target and why.
    fn update(&mut self, target: u32, last: Report) -> (u32, String) {
        if self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(last);
        let ms = |r: &Report| r.batch_time_s * 1000.0;
        if last.workers != target {
            return (
                target,
                format!("report from {} while the target is {target}; ignored", workers(last.workers)),
            );
        }
        if !self.scaling {
            self.same_scale += 1;
            if self.same_scale <= self.config.stable_reports {
                return (target, format!("stable at {} ({} reports)", workers(target), self.same_scale));
            }
            self.same_scale = 0;
            let Some(conv) = self.converged else { return (target, "stable".to_string()) };
            let queue_ratio = last.queue / conv.queue;
            let time_ratio = last.batch_time_s / conv.batch_time_s;
            if queue_ratio.is_finite() && queue_ratio > self.config.queue_growth && conv.workers > 1 {
                self.scaling = true;
                let reason = format!("result queue grew {queue_ratio:.1}× since convergence");
                return (conv.workers - 1, reason);
            }
            if queue_ratio.is_finite() && time_ratio > self.config.batch_time_growth {
                self.scaling = true;
                let reason = format!("batch time grew {time_ratio:.1}× since convergence");
                return (conv.workers.saturating_add(1), reason);
            }
            return (target, format!("re-check at {}: no change", workers(target)));
        }
        let prev = self.history.iter().rev().skip(1).find(|r| r.workers != last.workers).copied();
        let Some(prev) = prev else {
            if self.history.len() == 1 {
                let next = last.workers.saturating_add(1);
                return (next, format!("first report, batch time {:.1} ms → {}", ms(&last), workers(next)));
            }
            self.converge(last);
            return (last.workers, "no other count to compare with; converged".to_string());
        };
        let improvement = 1.0 - last.batch_time_s / prev.batch_time_s;
        if !improvement.is_finite() || improvement.abs() > 1.2 {
            return (target, format!("improvement {improvement:.2} unstable; discarded"));
        }
        let text = format!(
            "batch time {:.1} ms at {} vs {:.1} ms at {} ({:+.1}%)",
            ms(&last),
            workers(last.workers),
            ms(&prev),
            workers(prev.workers),
            improvement * 100.0
        );
        if prev.workers < last.workers {
            if improvement > self.config.min_improvement_up {
                let next = last.workers.saturating_add(1);
                return (next, format!("{text} → {}", workers(next)));
            }
            self.converge(prev);
            return (prev.workers, format!("{text}: knee, back to {}", workers(prev.workers)));
        }
        if improvement > -self.config.max_loss_down && last.workers > 1 {
            return (last.workers - 1, format!("{text}: loss ok → {}", workers(last.workers - 1)));
        }
        self.converge(prev);
        (prev.workers, format!("{text}: loss too large, back to {}", workers(prev.workers)))
    }

    fn converge(&mut self, at: Report) {
        self.converged = Some(at);
        self.scaling = false;
        self.same_scale = 0;
    }
}

impl Policy for CachewPolicy {
    fn name(&self) -> &'static str {
        "cachew"
    }

    fn observe(&mut self, obs: &Observation) -> Decision {
        if let Some(d) = enforce_bounds(obs) {
            self.target = Some(d.target);
            return d;
        }
        let desired = obs.desired_workers;
        let target = *self.target.get_or_insert(desired);
        let consumers = obs.consumer_count();
        if consumers == 0 {
            return Decision::hold(desired, "no consumers report");
        }
        if obs.jobs.iter().all(|j| j.epoch > 0) {
            return Decision::hold(desired, "past the first epoch: Cachew scales only in epoch 0");
        }
        let total: f64 =
            obs.jobs.iter().flat_map(|j| &j.consumers).map(|c| sane(c.batches_total as f64)).sum();
        let batches = total / consumers as f64;
        let report = match self.measure(obs, batches) {
            Ok(r) => r,
            Err(why) => return Decision::hold(desired, why),
        };
        let (next, reason) = self.update(target, report);
        let next = obs.config.clamp(next.max(1));
        self.target = Some(next);
        if next != desired {
            self.discard_until = batches + self.config.discard_after_change;
            self.window_start = None;
        }
        Decision::change(desired, next, reason)
    }
}
