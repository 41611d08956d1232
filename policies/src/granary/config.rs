//! Settings of the Granary policy.

use serde::{Deserialize, Serialize};

/// Tuning of [`GranaryPolicy`](super::GranaryPolicy). The defaults are the ones the simulator's
/// acceptance tests hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GranaryConfig {
    /// Spare supply asked for: `needed = ceil(demand × headroom / per_worker)`.
    pub headroom: f64,
    /// Observations averaged for demand and per-worker supply.
    pub window: usize,
    /// Observations needed before the first model decision.
    pub min_samples: usize,
    /// Observations of demand and supply needed before a scale-down (scaling down is never
    /// urgent, so it waits for a full window).
    pub down_samples: usize,
    /// Trainers "still wait" when they wait more than this fraction of a step beyond what the
    /// model expects, in each of the last `feedback_samples` observations.
    pub wait_threshold: f64,
    /// Consecutive settled observations that must agree before feedback acts.
    pub feedback_samples: usize,
    /// Trainers "never wait" below this fraction of a step.
    pub idle_wait: f64,
    /// Worker buffers "stay full" above this fraction of their capacity.
    pub full_buffer: f64,
    /// Workers are the bottleneck while their buffers are less full than this; then their
    /// measured output is their capacity.
    pub saturated_below: f64,
    /// Seconds the running count must equal the desired count before feedback is judged.
    pub settle_s: f64,
    /// Seconds to wait for requested workers to start before judging without them.
    pub startup_timeout_s: f64,
    /// Seconds after a change during which the opposite change is refused.
    pub reversal_cooldown_s: f64,
    /// Evaluations after a change during which the opposite change is refused.
    pub reversal_cooldown_evaluations: u64,
    /// Smallest relative noise band around the needed count.
    pub min_band: f64,
    /// Width of the noise band in standard errors of the estimate.
    pub noise_sigmas: f64,
}

impl Default for GranaryConfig {
    fn default() -> Self {
        GranaryConfig {
            headroom: 1.02,
            window: 12,
            min_samples: 3,
            down_samples: 4,
            wait_threshold: 0.03,
            feedback_samples: 3,
            idle_wait: 0.01,
            full_buffer: 0.75,
            saturated_below: 0.5,
            settle_s: 15.0,
            startup_timeout_s: 600.0,
            reversal_cooldown_s: 120.0,
            reversal_cooldown_evaluations: 20,
            min_band: 0.03,
            noise_sigmas: 3.0,
        }
    }
}

impl GranaryConfig {
    /// The evaluation period the defaults' time constants are tuned for, in seconds.
    pub const DEFAULT_PERIOD_S: f64 = 5.0;

    /// The defaults with their time constants in proportion to an evaluation period of
    /// `period_s` seconds: settling takes 3 periods and the reversal cooldown 24, as with the
    /// defaults at 5 s. The start-up timeout is about workers, not evaluations, and stays.
    pub fn for_period(period_s: f64) -> GranaryConfig {
        let base = GranaryConfig::default();
        let scale =
            if period_s.is_finite() && period_s > 0.0 { period_s / Self::DEFAULT_PERIOD_S } else { 1.0 };
        GranaryConfig {
            settle_s: base.settle_s * scale,
            reversal_cooldown_s: base.reversal_cooldown_s * scale,
            ..base
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_constants_follow_the_period() {
        assert_eq!(GranaryConfig::for_period(GranaryConfig::DEFAULT_PERIOD_S), GranaryConfig::default());
        let fast = GranaryConfig::for_period(1.0);
        assert_eq!((fast.settle_s, fast.reversal_cooldown_s), (3.0, 24.0));
        assert_eq!(fast.startup_timeout_s, GranaryConfig::default().startup_timeout_s);
        assert_eq!(GranaryConfig::for_period(f64::NAN), GranaryConfig::default());
    }
}
