//! Trainer-side step and wait times, reported to the dispatcher with each heartbeat.

use std::time::{Duration, Instant};

use granary_proto::v1::ClientMetrics;

/// Step and wait times since the last report.
#[derive(Debug, Clone)]
pub(crate) struct StepMetrics {
    since: Instant,
    batches: u64,
    steps: u64,
    step_total: Duration,
    wait_total: Duration,
    total: u64,
}

impl StepMetrics {
    /// An empty interval starting at `now`.
    pub(crate) fn new(now: Instant) -> StepMetrics {
        StepMetrics {
            since: now,
            batches: 0,
            steps: 0,
            step_total: Duration::ZERO,
            wait_total: Duration::ZERO,
            total: 0,
        }
    }

    /// A batch was delivered after `wait` inside `next()`; `step` is the time the trainer spent
    /// between the previous `next()` returning and this call (none for the first call).
    pub(crate) fn record(&mut self, step: Option<Duration>, wait: Duration) {
        self.batches += 1;
        self.total += 1;
        self.wait_total += wait;
        if let Some(step) = step {
            self.steps += 1;
            self.step_total += step;
        }
    }

    /// Means over the interval since the last report, which starts a new interval.
    pub(crate) fn report(&mut self, now: Instant, buffered: u32) -> ClientMetrics {
        let elapsed = now.saturating_duration_since(self.since).as_secs_f64();
        let mean =
            |total: Duration, count: u64| if count == 0 { 0.0 } else { total.as_secs_f64() / count as f64 };
        let metrics = ClientMetrics {
            step_seconds: mean(self.step_total, self.steps),
            wait_seconds: mean(self.wait_total, self.batches),
            buffered_batches: buffered,
            batches_total: self.total,
            batches_per_second: if elapsed > 0.0 { self.batches as f64 / elapsed } else { 0.0 },
        };
        *self = StepMetrics { total: self.total, ..StepMetrics::new(now) };
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_means_over_the_interval() {
        let start = Instant::now();
        let mut metrics = StepMetrics::new(start);
        metrics.record(None, Duration::from_millis(300));
        metrics.record(Some(Duration::from_millis(100)), Duration::from_millis(100));
        metrics.record(Some(Duration::from_millis(300)), Duration::from_millis(200));
        let report = metrics.report(start + Duration::from_secs(2), 5);
        assert!((report.step_seconds - 0.2).abs() < 1e-9);
        assert!((report.wait_seconds - 0.2).abs() < 1e-9);
        assert!((report.batches_per_second - 1.5).abs() < 1e-9);
        assert_eq!((report.buffered_batches, report.batches_total), (5, 3));

        let report = metrics.report(start + Duration::from_secs(3), 0);
        assert_eq!((report.step_seconds, report.wait_seconds, report.batches_per_second), (0.0, 0.0, 0.0));
        assert_eq!(report.batches_total, 3);
    }
}
