//! The `at` policy: the cut is set by `spec.cache.at`; the model only predicts.

use super::auto::{self, Weighing};
use super::model::{self, Model};
use super::{Action, CacheDecision, CacheInputs};

/// The cut set by `spec.cache.at` (`spec.cache.policy: at`): read the entry at `boundary` when
/// it is complete (`existing_fraction` ≥ 1), else write it this epoch and read it after.
///
/// The predicted rates come from the same model as [`decide`](super::decide); the candidates are
/// those `decide` would weigh, and the reason notes when the auto policy would rule the cut out.
/// A `boundary` that is not among `inputs.boundaries` means computing, with a reason.
pub fn forced(inputs: &CacheInputs, boundary: usize) -> CacheDecision {
    let m = Model::new(inputs, inputs.store, true, inputs.max_bytes);
    let weighing = Weighing::new(&m, inputs);
    let candidates = weighing.candidates(&m);
    let Some(w) = weighing.cuts.iter().find(|w| w.boundary.index == boundary) else {
        let cuts: Vec<String> = inputs.boundaries.iter().map(|b| b.index.to_string()).collect();
        let cuts = if cuts.is_empty() { "none".to_string() } else { cuts.join(", ") };
        return CacheDecision {
            action: Action::Compute,
            predicted: weighing.compute.as_ref().map_or(auto::compute_only(&m), |c| c.predicted),
            reason: format!(
                "compute: spec.cache.at is cut {boundary}, which is not a cut of the deterministic prefix (cuts: {cuts})"
            ),
            candidates,
        };
    };
    let action = model::action(w.boundary);
    let (predicted, figures) = match &w.estimate {
        Ok(e) => (e.predicted, auto::describe(&m, w.boundary, e, weighing.compute.as_ref().ok())),
        Err(why) => {
            (auto::compute_only(&m), format!("{}; no prediction: {why}", auto::phrase(w.boundary, m.epochs)))
        }
    };
    let mut reason = format!("set by spec.cache.at: {figures}");
    if let (Some(out), Ok(_)) = (&w.out, &w.estimate) {
        reason += &format!(" (the auto policy would rule it out: {})", out.text(&m));
    }
    CacheDecision { action, predicted, reason, candidates }
}
