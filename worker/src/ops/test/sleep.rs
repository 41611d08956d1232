//! `test.sleep`: a known wall time per element, without CPU.

use crate::element::Element;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::Sleep;
use std::time::Duration;

/// Sleeps a fixed time per element.
pub struct SleepOp {
    pause: Duration,
}

impl SleepOp {
    /// The operator for `config` (validated: 0 to 60 s).
    pub fn new(config: &Sleep) -> SleepOp {
        SleepOp { pause: Duration::try_from_secs_f64(config.ms / 1000.0).unwrap_or_default() }
    }
}

impl Operator for SleepOp {
    fn apply(&self, _element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        std::thread::sleep(self.pause);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn waits_and_leaves_the_element_alone() {
        let op = SleepOp::new(&Sleep { ms: 20.0 });
        let mut e = Element::new("k");
        let start = Instant::now();
        op.apply(&mut e, &mut SeededRng::for_element(0, 0, 0, 0)).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(e.key, "k");
        assert!(e.fields.is_empty());
    }
}
