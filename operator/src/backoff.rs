//! How long a pipeline whose reconcile failed waits before the next attempt: capped exponential
//! backoff per object, with jitter so that the pipelines that all failed at once (an API server
//! outage) do not all retry at once. The count of consecutive failures lives with what the
//! operator tracks of each pipeline and is reset by a successful reconcile.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The wait after the first failure (before jitter).
pub const BASE: Duration = Duration::from_secs(1);
/// The longest wait (before jitter).
pub const CAP: Duration = Duration::from_secs(120);

/// The wait before retrying after `failures` consecutive failures (1 for the first), given
/// `unit`, a number in `[0, 1]` (taken into that range when outside it): `BASE · 2^(failures-1)`
/// capped at `CAP`, of which the upper half is scaled by `unit` ("equal jitter"). So the wait lies
/// in `[d/2, d]` for the capped exponential `d`: never less than half of it, so retries still
/// slow down, and spread over the other half.
pub fn delay(failures: u32, unit: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(31);
    let full = BASE.saturating_mul(1u32 << exponent).min(CAP);
    let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.0 };
    let half = full / 2;
    half + half.mul_f64(unit)
}

/// A fresh number in `[0, 1)` for [`delay`]: from the standard library's randomly keyed hasher
/// (each `RandomState` gets new keys), which is random enough to spread retries.
pub fn unit_random() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().build_hasher().finish();
    // The top 53 bits make a double in [0, 1).
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_per_failure_up_to_the_cap() {
        let lowest: Vec<Duration> = (1..=10).map(|n| delay(n, 0.0)).collect();
        let secs: Vec<f64> = lowest.iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]);
        assert_eq!(delay(u32::MAX, 0.0), CAP / 2, "huge counts neither overflow nor pass the cap");
        assert_eq!(delay(0, 0.0), BASE / 2, "0 reads as a first failure");
    }

    #[test]
    fn jitter_spreads_the_upper_half_and_stays_below_the_full_wait() {
        for failures in [1, 4, 12] {
            let full = BASE.saturating_mul(1 << (failures - 1).min(31)).min(CAP);
            assert_eq!(delay(failures, 0.0), full / 2);
            let top = delay(failures, 0.999_999);
            assert!(top < full && top > full.mul_f64(0.99), "{top:?} for {full:?}");
            assert_eq!(delay(failures, 0.5), full / 2 + full / 4);
        }
        // Out-of-range or not-a-number units are taken into [0, 1].
        assert_eq!(delay(3, 7.0), Duration::from_secs(4));
        assert_eq!(delay(3, -1.0), Duration::from_secs(2));
        assert_eq!(delay(3, f64::NAN), Duration::from_secs(2));
    }

    #[test]
    fn random_units_lie_in_the_unit_interval_and_differ() {
        let units: Vec<f64> = (0..64).map(|_| unit_random()).collect();
        assert!(units.iter().all(|u| (0.0..1.0).contains(u)), "{units:?}");
        let mut distinct = units.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        assert!(distinct.len() > 60, "only {} distinct of 64: {units:?}", distinct.len());
    }
}
