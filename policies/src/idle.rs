//! Scale to zero, a rule applied on top of any policy's decision.
//!
//! With `min_workers: 0` and [`PoolConfig::idle_after_s`] set, a pool with no connected consumer
//! for `idle_after_s` goes to zero workers, and a consumer that connects while it is at zero
//! starts it again. In between the pool keeps at least one worker: the policy sees
//! `min_workers: 1` while workers run, so it never goes to zero on its own (and never records a
//! change the rule would undo). Without `idle_after_s`, or with `min_workers` of 1 or more, the
//! rule changes nothing.
//!
//! Apart from that, a pool whose every job delivered every epoch (a Completed pipeline) and
//! that no consumer reads releases every worker, whatever `min_workers` says, and starts again
//! when a consumer connects.

use std::borrow::Cow;

use crate::decision::Decision;
use crate::inputs::{Observation, PoolConfig};
use crate::policy::Policy;
use crate::wording::workers;

/// The state of the scale-to-zero rule for one pool: since when no consumer is connected.
/// Create one per pool, next to its policy, and call [`ScaleToZero::decide`] instead of
/// [`Policy::observe`].
#[derive(Clone, Debug, Default)]
pub struct ScaleToZero {
    /// When the last observation with a connected consumer ended (the first observation
    /// without one); `None` while a consumer is connected.
    idle_since: Option<f64>,
}

/// Seconds without a consumer after which the pool goes to zero, when the rule applies:
/// `min_workers` is 0 and `idle_after_s` is set (a negative value reads as 0, NaN as unset).
pub fn idle_after(config: &PoolConfig) -> Option<f64> {
    if config.min_workers != 0 {
        return None;
    }
    config.idle_after_s.filter(|s| !s.is_nan()).map(|s| s.max(0.0))
}

/// Whether a consumer of any job is connected.
fn attached(obs: &Observation) -> bool {
    obs.jobs.iter().any(|j| !j.consumers.is_empty())
}

impl ScaleToZero {
    /// No history: idle time counts from the first observation without a consumer.
    pub fn new() -> ScaleToZero {
        ScaleToZero::default()
    }

    /// Seconds without a connected consumer as of `now_s`, or `None` while one is connected
    /// (as of the last [`ScaleToZero::apply`]).
    pub fn idle_for(&self, now_s: f64) -> Option<f64> {
        self.idle_since.map(|since| (now_s - since).max(0.0))
    }

    /// What the policy should see: with the rule in force and workers running, `min_workers`
    /// of 1 (the rule alone takes the pool to zero); at zero with the rule in force, or
    /// `completed` and nobody attached, `min_workers` of 0 (the rule alone starts it).
    pub fn view<'a>(&self, obs: &'a Observation, completed: bool) -> Cow<'a, Observation> {
        let zero_ok = idle_after(&obs.config).is_some();
        let min = if obs.desired_workers > 0 && zero_ok {
            1.min(obs.config.upper())
        } else if obs.desired_workers == 0 && (zero_ok || (completed && !attached(obs))) {
            0
        } else {
            return Cow::Borrowed(obs);
        };
        if min == obs.config.min_workers {
            return Cow::Borrowed(obs);
        }
        let mut seen = obs.clone();
        seen.config.max_workers = obs.config.upper();
        seen.config.min_workers = min;
        Cow::Owned(seen)
    }

    /// The policy's decision `inner` (taken on [`ScaleToZero::view`]) after the rule.
    /// `completed`: every job of the pool delivered every epoch.
    pub fn apply(&mut self, obs: &Observation, inner: Decision, completed: bool) -> Decision {
        let attached = attached(obs);
        if attached {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(obs.now_s);
        }
        let desired = obs.desired_workers;
        if completed && !attached {
            return to_zero(desired, "every job completed: releasing every worker", "every job completed");
        }
        let Some(idle_after) = idle_after(&obs.config) else {
            return inner;
        };
        let start = 1.min(obs.config.upper());
        if attached {
            if desired == 0 && inner.target > 0 {
                let reason = format!("a trainer connected: starting workers → {}", workers(inner.target));
                return Decision::change(0, inner.target, reason);
            }
            if inner.target == 0 && start > 0 {
                let reason = if desired == 0 {
                    format!("a trainer connected: starting workers → {}", workers(start))
                } else {
                    format!("{}; a trainer is attached: keeping {}", inner.reason, workers(start))
                };
                return Decision::change(desired, start, reason);
            }
            return inner;
        }
        let idle = self.idle_for(obs.now_s).unwrap_or(0.0);
        if desired == 0 {
            return Decision::hold(0, "no trainer attached: no worker runs");
        }
        if idle >= idle_after {
            let reason = format!(
                "no trainer attached for {idle:.0} s (idle after {idle_after:.0} s): releasing every worker"
            );
            return Decision::change(desired, 0, reason);
        }
        let target = inner.target.max(start);
        let reason = format!(
            "{}; no trainer attached for {idle:.0} s, every worker goes after {idle_after:.0} s",
            inner.reason
        );
        Decision::change(desired, target, reason)
    }

    /// The policy's decision on [`ScaleToZero::view`], after the rule.
    pub fn decide(&mut self, policy: &mut dyn Policy, obs: &Observation, completed: bool) -> Decision {
        let inner = policy.observe(&self.view(obs, completed));
        self.apply(obs, inner, completed)
    }
}

/// To zero from `desired`, or a hold at zero.
fn to_zero(desired: u32, change: &str, held: &str) -> Decision {
    if desired == 0 {
        Decision::hold(0, format!("{held}: no worker runs"))
    } else {
        Decision::change(desired, 0, change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{ConsumerMetrics, JobMetrics};

    fn config(min: u32, idle_after_s: Option<f64>) -> PoolConfig {
        PoolConfig { min_workers: min, max_workers: 8, idle_after_s, ..PoolConfig::default() }
    }

    fn obs(now_s: f64, desired: u32, consumers: usize, config: &PoolConfig) -> Observation {
        let job = JobMetrics {
            name: "train".into(),
            consumers: vec![ConsumerMetrics::default(); consumers],
            ..JobMetrics::default()
        };
        Observation {
            now_s,
            running_workers: desired,
            desired_workers: desired,
            jobs: if consumers > 0 { vec![job] } else { Vec::new() },
            config: config.clone(),
            ..Observation::default()
        }
    }

    /// A policy that always asks for the same count.
    struct Fixed(u32);

    impl Policy for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }

        fn observe(&mut self, obs: &Observation) -> Decision {
            Decision::change(obs.desired_workers, obs.config.clamp(self.0), "fixed")
        }
    }

    #[test]
    fn an_idle_pool_goes_to_zero_after_idle_after_and_not_before() {
        let cfg = config(0, Some(300.0));
        let mut rule = ScaleToZero::new();
        let mut policy = Fixed(0);
        assert_eq!(rule.decide(&mut policy, &obs(0.0, 2, 1, &cfg), false).target, 1);
        let d = rule.decide(&mut policy, &obs(5.0, 1, 0, &cfg), false);
        assert_eq!(d.target, 1, "{}", d.reason);
        let d = rule.decide(&mut policy, &obs(304.0, 1, 0, &cfg), false);
        assert_eq!(d.target, 1, "{}", d.reason);
        assert!(d.reason.contains("every worker goes after 300 s"), "{}", d.reason);
        let d = rule.decide(&mut policy, &obs(305.0, 1, 0, &cfg), false);
        assert_eq!(d.target, 0);
        assert!(d.reason.contains("releasing every worker"), "{}", d.reason);
        let d = rule.decide(&mut policy, &obs(310.0, 0, 0, &cfg), false);
        assert_eq!((d.target, d.is_change()), (0, false));
    }

    #[test]
    fn a_trainer_connecting_at_zero_starts_workers() {
        let cfg = config(0, Some(60.0));
        let mut rule = ScaleToZero::new();
        let d = rule.decide(&mut Fixed(0), &obs(0.0, 0, 2, &cfg), false);
        assert_eq!(d.target, 1);
        assert!(d.reason.starts_with("a trainer connected: starting workers"), "{}", d.reason);
        let d = rule.decide(&mut Fixed(3), &obs(5.0, 0, 2, &cfg), false);
        assert_eq!(d.target, 3, "what the policy asks, when more");
    }

    #[test]
    fn the_policy_never_sees_zero_allowed_while_workers_run() {
        let cfg = config(0, Some(60.0));
        let rule = ScaleToZero::new();
        assert_eq!(rule.view(&obs(0.0, 3, 0, &cfg), false).config.min_workers, 1);
        assert_eq!(rule.view(&obs(0.0, 0, 0, &cfg), false).config.min_workers, 0);
        let mut zero_max = cfg.clone();
        zero_max.max_workers = 0;
        let d = ScaleToZero::new().decide(&mut Fixed(5), &obs(0.0, 0, 1, &zero_max), false);
        assert_eq!(d.target, 0, "max_workers 0 keeps the pool empty");
    }

    #[test]
    fn a_consumer_resets_the_idle_clock() {
        let cfg = config(0, Some(100.0));
        let mut rule = ScaleToZero::new();
        let mut policy = Fixed(2);
        rule.decide(&mut policy, &obs(0.0, 2, 0, &cfg), false);
        rule.decide(&mut policy, &obs(90.0, 2, 1, &cfg), false);
        assert_eq!(rule.idle_for(95.0), None);
        let d = rule.decide(&mut policy, &obs(150.0, 2, 0, &cfg), false);
        assert_eq!(d.target, 2, "idle since 150 s only: {}", d.reason);
        assert_eq!(rule.decide(&mut policy, &obs(250.0, 2, 0, &cfg), false).target, 0);
    }

    #[test]
    fn without_idle_after_or_with_a_minimum_nothing_changes() {
        for cfg in [config(0, None), config(1, Some(10.0)), config(2, Some(0.0))] {
            let mut rule = ScaleToZero::new();
            for (t, desired, consumers) in [(0.0, 3, 0), (1000.0, 3, 0), (2000.0, 0, 1)] {
                let o = obs(t, desired, consumers, &cfg);
                let inner = Fixed(4).observe(&o);
                assert_eq!(rule.decide(&mut Fixed(4), &o, false), inner);
            }
        }
    }

    #[test]
    fn a_completed_pool_releases_its_workers_whatever_the_minimum() {
        let cfg = config(2, None);
        let mut rule = ScaleToZero::new();
        let d = rule.decide(&mut Fixed(2), &obs(0.0, 2, 0, &cfg), true);
        assert_eq!(d.target, 0);
        assert_eq!(d.reason, "every job completed: releasing every worker");
        let d = rule.decide(&mut Fixed(2), &obs(5.0, 0, 0, &cfg), true);
        assert_eq!((d.target, d.is_change()), (0, false));
        let d = rule.decide(&mut Fixed(2), &obs(10.0, 0, 1, &cfg), false);
        assert_eq!(d.target, 2, "a new trainer starts the pool again: {}", d.reason);
    }
}
