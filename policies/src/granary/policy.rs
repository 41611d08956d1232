//! The Granary policy's state machine.

use super::GranaryConfig;
use super::cost;
use crate::bounds::enforce_bounds;
use crate::counts::count_at_least;
use crate::decision::Decision;
use crate::estimate::{self, RateSource};
use crate::inputs::{Observation, PoolConfig};
use crate::policy::Policy;
use crate::trainer_hosts;
use crate::window::Window;
use crate::wording::workers;

/// The last change of the target.
#[derive(Clone, Copy, Debug)]
pub(super) struct Change {
    at_s: f64,
    evaluation: u64,
    up: bool,
}

/// Granary's model-based autoscaler. Create one per pool and call
/// [`observe`](Policy::observe) with each new observation.
#[derive(Clone, Debug)]
pub struct GranaryPolicy {
    pub(super) config: GranaryConfig,
    pub(super) demand: Window,
    pub(super) rate: Window,
    pub(super) wait: Window,
    pub(super) fill: Window,
    /// Busy fraction of the workers' cores (see [`estimate::busy_fraction`]).
    pub(super) busy: Window,
    pub(super) source: Option<RateSource>,
    pub(super) settled_since: Option<f64>,
    /// When the running count was first seen to differ from the desired one.
    pub(super) pending_since: Option<f64>,
    pub(super) last_change: Option<Change>,
    pub(super) evaluations: u64,
    /// Fewest workers since feedback showed trainers waiting at fewer; cleared when demand or
    /// supply shifts.
    pub(super) floor: u32,
}

impl Default for GranaryPolicy {
    fn default() -> Self {
        GranaryPolicy::new(GranaryConfig::default())
    }
}

/// The estimate one evaluation works from.
pub(super) struct Model {
    pub(super) demand: f64,
    pub(super) per_worker: f64,
    pub(super) band: f64,
    /// What the trainers' hosts take on, in words (empty when nothing).
    pub(super) hosts: String,
}

impl GranaryPolicy {
    /// A policy with these settings and no history.
    pub fn new(config: GranaryConfig) -> GranaryPolicy {
        let n = config.window;
        GranaryPolicy {
            demand: Window::new(n),
            rate: Window::new(n),
            wait: Window::new(n),
            fill: Window::new(n),
            busy: Window::new(n),
            source: None,
            settled_since: None,
            pending_since: None,
            last_change: None,
            evaluations: 0,
            floor: 0,
            config,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &GranaryConfig {
        &self.config
    }

    /// Workers needed for `demand`: `ceil(demand × headroom / per_worker)`, or with prices the
    /// count of least cost per batch; within the bounds.
    pub(super) fn needed(&self, cfg: &PoolConfig, consumers: usize, demand: f64, per_worker: f64) -> u32 {
        cfg.clamp(self.needed_unbounded(cfg, consumers, demand, per_worker))
    }

    /// [`needed`](Self::needed) before the upper bound.
    pub(super) fn needed_unbounded(
        &self,
        cfg: &PoolConfig,
        consumers: usize,
        demand: f64,
        per_worker: f64,
    ) -> u32 {
        let r = per_worker / self.config.headroom.max(1.0);
        match cfg.prices() {
            Some((worker, trainer)) => {
                let trainers = trainer * consumers as f64;
                cost::cheapest_count(demand, r, worker, trainers, cfg.lower(), u32::MAX)
            }
            None => count_at_least(demand / r),
        }
    }

    /// Takes the samples of this observation; false when the pool is still changing size.
    fn sample(&mut self, obs: &Observation) -> bool {
        let mut shifted = false;
        if let Some(d) = estimate::demand(obs) {
            shifted |= self.demand.push(d);
        }
        if let Some(r) = estimate::worker_rate(obs, self.config.saturated_below) {
            shifted |= self.rate.push(r.per_worker);
            self.source = Some(r.source);
        }
        if shifted {
            self.floor = 0;
        }
        if obs.running_workers != obs.desired_workers {
            self.unsettle();
            self.pending_since.get_or_insert(obs.now_s);
            return false;
        }
        self.pending_since = None;
        match self.settled_since {
            None => self.settled_since = Some(obs.now_s),
            Some(_) => {
                // Nobody waits when nobody consumes.
                let no_consumers = obs.consumer_count() == 0;
                if let Some(w) = estimate::wait_fraction(obs).or(no_consumers.then_some(0.0)) {
                    self.wait.push(w);
                }
                if let Some(f) = estimate::buffer_fill(obs) {
                    self.fill.push(f);
                }
                if let Some(b) = estimate::busy_fraction(obs) {
                    self.busy.push(b);
                }
            }
        }
        true
    }

    fn unsettle(&mut self) {
        self.settled_since = None;
        self.wait.clear();
        self.fill.clear();
        self.busy.clear();
    }

    pub(super) fn settled(&self, now: f64) -> bool {
        let k = self.config.feedback_samples.max(1);
        self.settled_since.is_some_and(|s| now - s >= self.config.settle_s) && self.wait.len() >= k
    }

    fn model(&self) -> Result<Model, String> {
        let need = self.config.min_samples.max(1);
        let (Some(demand), Some(per_worker)) = (self.demand.mean(), self.rate.mean()) else {
            return Err(match self.demand.mean() {
                None => "no trainer has reported a step time yet".to_string(),
                Some(_) => "no worker has reported its output yet".to_string(),
            });
        };
        if self.demand.len() < need || self.rate.len() < need {
            let have = self.demand.len().min(self.rate.len());
            return Err(format!("collecting metrics: {have} of {need} observations"));
        }
        let noise = self.demand.relative_error().hypot(self.rate.relative_error());
        let band = (self.config.noise_sigmas * noise).max(self.config.min_band).min(0.5);
        Ok(Model { demand, per_worker, band, hosts: String::new() })
    }

    /// The opposite change is refused until the cooldown passed.
    fn reversal_refused(&self, up: bool, now: f64) -> Option<String> {
        let c = self.last_change?;
        let since_s = now - c.at_s;
        let since_evals = self.evaluations.saturating_sub(c.evaluation);
        let cooling = since_s < self.config.reversal_cooldown_s
            || since_evals < self.config.reversal_cooldown_evaluations;
        (c.up != up && cooling).then(|| {
            let last = if c.up { "up" } else { "down" };
            format!("scaled {last} {since_s:.0} s ago (cooldown {:.0} s)", self.config.reversal_cooldown_s)
        })
    }

    pub(super) fn finish(&mut self, obs: &Observation, target: u32, reason: String) -> Decision {
        let desired = obs.desired_workers;
        if target == desired {
            return Decision::hold(desired, reason);
        }
        let up = target > desired;
        if let Some(why) = self.reversal_refused(up, obs.now_s) {
            return Decision::hold(desired, format!("{reason}, but {why}; holding {}", workers(desired)));
        }
        self.record(obs, up);
        Decision::change(desired, target, reason)
    }

    fn record(&mut self, obs: &Observation, up: bool) {
        self.last_change = Some(Change { at_s: obs.now_s, evaluation: self.evaluations, up });
        self.unsettle();
    }
}

impl Policy for GranaryPolicy {
    fn name(&self) -> &'static str {
        "granary"
    }

    fn observe(&mut self, obs: &Observation) -> Decision {
        self.evaluations = self.evaluations.saturating_add(1);
        if let Some(d) = enforce_bounds(obs) {
            self.record(obs, d.target > obs.desired_workers);
            return d;
        }
        let desired = obs.desired_workers;
        let stable = self.sample(obs);
        if desired == 0 {
            let consumers = obs.consumer_count();
            if consumers == 0 {
                return Decision::hold(0, "no consumers and no workers");
            }
            let target = obs.config.clamp(1);
            let reason =
                format!("{consumers} consumers are connected and no worker runs → {}", workers(target));
            return self.finish(obs, target, reason);
        }
        if !stable {
            let since = self.pending_since.map_or(0.0, |p| obs.now_s - p);
            let running = obs.running_workers;
            if running > desired {
                return Decision::hold(
                    desired,
                    format!("waiting for {} to stop", workers(running - desired)),
                );
            }
            if since < self.config.startup_timeout_s {
                return Decision::hold(
                    desired,
                    format!(
                        "waiting for {} of {} to start ({since:.0} s so far)",
                        desired - running,
                        workers(desired)
                    ),
                );
            }
        }
        match self.model() {
            Ok(mut m) => {
                // The trainers' hosts carry the finishing they have room for at the demand.
                if let Some(share) = trainer_hosts::host_share(obs, m.per_worker) {
                    m.per_worker = share.per_worker;
                    m.hosts = share.describe();
                }
                self.decide(obs, &m)
            }
            Err(why) => Decision::hold(desired, format!("{why}; holding {}", workers(desired))),
        }
    }
}
