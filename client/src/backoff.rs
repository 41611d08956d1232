//! Exponential backoff between retries.

use std::time::Duration;

/// Delays that double from a first to a largest value.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, doubling up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first }
    }

    /// 100 ms doubling to 2 s: the client's reconnect schedule.
    pub(crate) fn reconnect() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
    }

    /// The delay to wait now; the next one is twice as long.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the first delay, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut backoff = Backoff::reconnect();
        let delays: Vec<u64> = (0..7).map(|_| backoff.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }
}
