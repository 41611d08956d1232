//! The Kubernetes Horizontal Pod Autoscaler on CPU, Cachew's baseline.
//!
//! Every sync period: `desired = ceil(ready × utilization / target)` where utilization is the
//! mean of `cpu_cores_used / cores` over the reporting workers; no change while
//! `|utilization / target − 1| ≤ tolerance`. Workers that were asked for but do not report yet
//! count as 0% busy when scaling up and 100% when scaling down, and a change that flips direction
//! that way is dropped (the controller's missing-pod rule). A scale-down takes the highest
//! recommendation of the stabilization window; a scale-up adds at most
//! `max(scale_up_pods, scale_up_percent% of current)` per sync. At 0 replicas HPA does nothing.

use std::collections::VecDeque;

use crate::bounds::enforce_bounds;
use crate::counts::count_at_least;
use crate::decision::Decision;
use crate::inputs::{Observation, sane};
use crate::policy::Policy;
use crate::wording::workers;

/// HPA settings (Kubernetes defaults with an 80% CPU target).
#[derive(Clone, Debug, PartialEq)]
pub struct HpaConfig {
    /// Target CPU utilization.
    pub target_utilization: f64,
    /// Relative band around the target with no change.
    pub tolerance: f64,
    /// Seconds of recommendations a scale-down looks back over.
    pub downscale_stabilization_s: f64,
    /// Seconds between evaluations (`--horizontal-pod-autoscaler-sync-period`).
    pub sync_period_s: f64,
    /// Pods a scale-up may add per sync, at least.
    pub scale_up_pods: u32,
    /// Percent of the current count a scale-up may add per sync, at least.
    pub scale_up_percent: u32,
}

impl Default for HpaConfig {
    fn default() -> Self {
        HpaConfig {
            target_utilization: 0.8,
            tolerance: 0.1,
            downscale_stabilization_s: 300.0,
            sync_period_s: 15.0,
            scale_up_pods: 4,
            scale_up_percent: 100,
        }
    }
}

/// Recommendations older than this many are dropped even inside the window.
const MAX_RECOMMENDATIONS: usize = 1024;

/// The HPA baseline.
#[derive(Clone, Debug, Default)]
pub struct HpaPolicy {
    config: HpaConfig,
    last_sync_s: Option<f64>,
    recommendations: VecDeque<(f64, u32)>,
}

impl HpaPolicy {
    /// An HPA with these settings.
    pub fn new(config: HpaConfig) -> HpaPolicy {
        HpaPolicy { config, last_sync_s: None, recommendations: VecDeque::new() }
    }

    /// The raw recommendation from CPU use, and its explanation.
    fn recommend(&self, obs: &Observation, current: u32) -> Result<(u32, String), String> {
        let target = self.config.target_utilization.max(f64::MIN_POSITIVE);
        let utils: Vec<f64> = obs
            .workers
            .iter()
            .filter(|w| w.cores > 0)
            .map(|w| (sane(w.cpu_cores_used) / f64::from(w.cores)).min(1e6))
            .collect();
        if utils.is_empty() {
            return Err("no CPU metrics".to_string());
        }
        let ready = utils.len() as f64;
        let sum: f64 = utils.iter().sum();
        let ratio = sum / ready / target;
        let tol = self.config.tolerance;
        let text = |r: f64| format!("CPU at {:.0}% of the {:.0}% target", r * 100.0, target * 100.0);
        let missing = f64::from(current).max(ready) - ready;
        if missing == 0.0 {
            if (ratio - 1.0).abs() <= tol {
                return Ok((current, format!("{} (within tolerance)", text(ratio))));
            }
            return Ok((count_at_least(ratio * ready), text(ratio)));
        }
        let fill = if ratio < 1.0 { 1.0 } else { 0.0 };
        let adjusted = (sum + fill * missing) / (ready + missing) / target;
        if (adjusted - 1.0).abs() <= tol || (ratio > 1.0) != (adjusted > 1.0) {
            let reason = format!("{}, {missing:.0} not ready: no change", text(ratio));
            return Ok((current, reason));
        }
        Ok((count_at_least(adjusted * (ready + missing)), text(adjusted)))
    }
}

impl Policy for HpaPolicy {
    fn name(&self) -> &'static str {
        "hpa"
    }

    fn observe(&mut self, obs: &Observation) -> Decision {
        if let Some(d) = enforce_bounds(obs) {
            return d;
        }
        let current = obs.desired_workers;
        if current == 0 {
            return Decision::hold(0, "scaled to zero: HPA is disabled");
        }
        if self.last_sync_s.is_some_and(|t| obs.now_s - t < self.config.sync_period_s) {
            return Decision::hold(current, "between syncs");
        }
        self.last_sync_s = Some(obs.now_s);
        let (raw, text) = match self.recommend(obs, current) {
            Ok(r) => r,
            Err(why) => return Decision::hold(current, why),
        };
        let window = self.config.downscale_stabilization_s;
        while self.recommendations.front().is_some_and(|(t, _)| obs.now_s - t > window)
            || self.recommendations.len() >= MAX_RECOMMENDATIONS
        {
            self.recommendations.pop_front();
        }
        self.recommendations.push_back((obs.now_s, raw));
        let down_limit = self.recommendations.iter().map(|(_, r)| *r).max().unwrap_or(raw);
        // The controller's rule: never below the up recommendation (the raw one: the up window
        // is 0 s), never above the highest recommendation of the down window.
        let next = current.max(raw).min(down_limit);
        let pct = u64::from(current) * u64::from(self.config.scale_up_percent) / 100;
        let step = u64::from(self.config.scale_up_pods).max(pct);
        let up_limit = u32::try_from(u64::from(current) + step).unwrap_or(u32::MAX);
        let next = obs.config.clamp(next.min(up_limit));
        let reason = if next == raw {
            format!("{text} → {}", workers(next))
        } else {
            format!("{text} recommends {}; stabilized/limited → {}", workers(raw), workers(next))
        };
        if next == current {
            Decision::hold(current, reason)
        } else {
            Decision::change(current, next, reason)
        }
    }
}
