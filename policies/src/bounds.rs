//! The bounds rule every policy asks first: a desired count outside the pool's bounds is
//! corrected before anything else.

use crate::decision::Decision;
use crate::inputs::Observation;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::PoolConfig;

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
