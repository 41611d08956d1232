//! The [`Policy`] trait every autoscaling policy implements.

use crate::decision::Decision;
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
