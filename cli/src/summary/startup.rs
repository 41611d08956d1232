//! How long a run took to start: from the command's start (marked first thing in `main`) to
//! the engine or the local service being ready, and to the first batch.

use std::sync::OnceLock;
use std::time::Instant;

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the command; later calls keep the first mark.
pub fn mark() {
    STARTED.get_or_init(Instant::now);
}

/// Seconds since [`mark`] (since the first call of this function when nothing marked).
pub fn seconds() -> f64 {
    STARTED.get_or_init(Instant::now).elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_the_first_mark() {
        mark();
        let first = seconds();
        mark();
        let second = seconds();
        assert!(second >= first, "a second mark must not restart the clock: {first} then {second}");
    }
}
