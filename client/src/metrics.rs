//! Trainer-side step and wait times, reported to the dispatcher with each heartbeat.

use std::time::{Duration, Instant};

use granary_proto::TRAINER_SECONDS_BUCKETS;
use granary_proto::v1::{ClientMetrics, LatencyHistogram};

/// A cumulative histogram over [`TRAINER_SECONDS_BUCKETS`].
#[derive(Debug, Clone)]
struct Histogram {
    counts: [u64; TRAINER_SECONDS_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram { counts: [0; TRAINER_SECONDS_BUCKETS.len() + 1], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, value: Duration) {
        let seconds = value.as_secs_f64();
        let bucket = TRAINER_SECONDS_BUCKETS.partition_point(|&bound| bound < seconds);
        self.counts[bucket] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    fn message(&self) -> LatencyHistogram {
        LatencyHistogram {
            bounds: TRAINER_SECONDS_BUCKETS.to_vec(),
            counts: self.counts.to_vec(),
            sum: self.sum,
            count: self.count,
        }
    }
}

/// Step and wait times since the last report, and their histograms since the session started.
#[derive(Debug, Clone)]
pub(crate) struct StepMetrics {
    since: Instant,
    batches: u64,
    steps: u64,
    step_total: Duration,
    wait_total: Duration,
    total: u64,
    step_histogram: Histogram,
    wait_histogram: Histogram,
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
            step_histogram: Histogram::new(),
            wait_histogram: Histogram::new(),
        }
    }

    /// A batch was delivered after `wait` inside `next()`; `step` is the time the trainer spent
    /// between the previous `next()` returning and this call (none for the first call).
    pub(crate) fn record(&mut self, step: Option<Duration>, wait: Duration) {
        self.batches += 1;
        self.total += 1;
        self.wait_total += wait;
        self.wait_histogram.observe(wait);
        if let Some(step) = step {
            self.steps += 1;
            self.step_total += step;
            self.step_histogram.observe(step);
        }
    }

    /// Means over the interval since the last report, which starts a new interval; `buffered`
    /// complete batches are ready now, of `prefetch` the client holds ahead at most.
    pub(crate) fn report(&mut self, now: Instant, buffered: u32, prefetch: u32) -> ClientMetrics {
        let elapsed = now.saturating_duration_since(self.since).as_secs_f64();
        let mean =
            |total: Duration, count: u64| if count == 0 { 0.0 } else { total.as_secs_f64() / count as f64 };
        let metrics = ClientMetrics {
            step_seconds: mean(self.step_total, self.steps),
            wait_seconds: mean(self.wait_total, self.batches),
            buffered_batches: buffered,
            prefetch_batches: prefetch,
            batches_total: self.total,
            batches_per_second: if elapsed > 0.0 { self.batches as f64 / elapsed } else { 0.0 },
            step_histogram: Some(self.step_histogram.message()),
            wait_histogram: Some(self.wait_histogram.message()),
        };
        self.since = now;
        self.batches = 0;
        self.steps = 0;
        self.step_total = Duration::ZERO;
        self.wait_total = Duration::ZERO;
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
        let report = metrics.report(start + Duration::from_secs(2), 5, 8);
        assert!((report.step_seconds - 0.2).abs() < 1e-9);
        assert!((report.wait_seconds - 0.2).abs() < 1e-9);
        assert!((report.batches_per_second - 1.5).abs() < 1e-9);
        assert_eq!((report.buffered_batches, report.prefetch_batches, report.batches_total), (5, 8, 3));

        let report = metrics.report(start + Duration::from_secs(3), 0, 4);
        assert_eq!((report.step_seconds, report.wait_seconds, report.batches_per_second), (0.0, 0.0, 0.0));
        assert_eq!(report.batches_total, 3);
    }

    #[test]
    fn histograms_accumulate_over_the_session() {
        let start = Instant::now();
        let mut metrics = StepMetrics::new(start);
        metrics.record(None, Duration::from_micros(100));
        metrics.record(Some(Duration::from_millis(100)), Duration::from_millis(3));
        metrics.report(start + Duration::from_secs(1), 0, 4);
        metrics.record(Some(Duration::from_secs(20)), Duration::from_millis(100));
        let report = metrics.report(start + Duration::from_secs(2), 0, 4);
        let wait = report.wait_histogram.unwrap();
        assert_eq!(wait.bounds, TRAINER_SECONDS_BUCKETS.to_vec());
        assert_eq!(wait.count, 3);
        // 100 µs in the first bucket; 3 ms in (2.5 ms, 5 ms]; 100 ms on the bound of its bucket.
        let mut expected = vec![0; TRAINER_SECONDS_BUCKETS.len() + 1];
        expected[0] = 1;
        expected[3] = 1;
        expected[7] = 1;
        assert_eq!(wait.counts, expected);
        assert!((wait.sum - 0.1031).abs() < 1e-9);
        let step = report.step_histogram.unwrap();
        assert_eq!((step.count, step.counts[7], step.counts[TRAINER_SECONDS_BUCKETS.len()]), (2, 1, 1));
    }
}
