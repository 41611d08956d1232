//! The [`Policy`] trait, the catalog of implementations, and the rules every policy shares.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cachew::CachewPolicy;
use crate::decision::Decision;
use crate::error::Error;
use crate::granary::GranaryPolicy;
use crate::hpa::HpaPolicy;
use crate::inputs::Observation;

/// An autoscaling policy: called with each observation, answers with a [`Decision`]. A policy may
/// keep state between calls; it never reads a clock, so the same observations give the same
/// decisions.
pub trait Policy {
    /// Short name (`granary`, `cachew`, `hpa`).
    fn name(&self) -> &'static str;

    /// Evaluates one observation. The returned target is always within the observation's bounds.
    fn observe(&mut self, obs: &Observation) -> Decision;
}

/// The policies this crate implements, with their default settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// Granary's model-based autoscaler.
    Granary,
    /// Cachew's incremental rule (the baseline from the Cachew paper).
    Cachew,
    /// Kubernetes HPA at 80% CPU (Cachew's own baseline).
    Hpa,
}

impl PolicyKind {
    /// All three, in report order.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Granary, PolicyKind::Cachew, PolicyKind::Hpa];

    /// The policy with default settings.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::Granary => Box::new(GranaryPolicy::default()),
            PolicyKind::Cachew => Box::new(CachewPolicy::default()),
            PolicyKind::Hpa => Box::new(HpaPolicy::default()),
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Granary => "granary",
            PolicyKind::Cachew => "cachew",
            PolicyKind::Hpa => "hpa",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| Error::UnknownPolicy(s.to_string()))
    }
}

/// A change into the bounds when the desired count lies outside them; every policy asks this
/// first.
pub(crate) fn enforce_bounds(obs: &Observation) -> Option<Decision> {
    let desired = obs.desired_workers;
    let bounded = obs.config.clamp(desired);
    if bounded > desired {
        Some(Decision::change(
            desired,
            bounded,
            format!("{desired} workers is below min_workers {bounded} → {bounded} workers"),
        ))
    } else if bounded < desired {
        Some(Decision::change(
            desired,
            bounded,
            format!("{desired} workers is above max_workers {bounded} → {bounded} workers"),
        ))
    } else {
        None
    }
}

/// The smallest count at least `x`: `ceil(x)`, saturating; 0 for NaN and negative values.
pub(crate) fn count_at_least(x: f64) -> u32 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        // In range and non-negative: the cast is exact after ceil.
        x.ceil() as u32
    }
}

/// "1 worker" / "3 workers".
pub(crate) fn workers(n: u32) -> String {
    if n == 1 { "1 worker".to_string() } else { format!("{n} workers") }
}

/// The verb for `n` workers: "makes" or "make".
pub(crate) fn make(n: u32) -> &'static str {
    if n == 1 { "makes" } else { "make" }
}

/// A rate in words with sensible precision.
pub(crate) fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::PoolConfig;

    #[test]
    fn names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>().ok(), Some(kind));
        }
        assert!("k8s".parse::<PolicyKind>().is_err());
    }

    #[test]
    fn counts_saturate() {
        assert_eq!(count_at_least(f64::NAN), 0);
        assert_eq!(count_at_least(-3.0), 0);
        assert_eq!(count_at_least(2.01), 3);
        assert_eq!(count_at_least(2.0), 2);
        assert_eq!(count_at_least(f64::INFINITY), u32::MAX);
    }

    #[test]
    fn out_of_bounds_is_corrected() {
        let mut obs = Observation { desired_workers: 0, ..Default::default() };
        obs.config = PoolConfig { min_workers: 2, max_workers: 4, ..Default::default() };
        assert_eq!(enforce_bounds(&obs).map(|d| d.target), Some(2));
        obs.desired_workers = 9;
        assert_eq!(enforce_bounds(&obs).map(|d| d.target), Some(4));
        obs.desired_workers = 3;
        assert!(enforce_bounds(&obs).is_none());
    }
}
