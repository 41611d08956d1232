//! The operator's own metrics, next to the dispatcher's on the same `/metrics`.

use granary_telemetry::prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};
use std::time::Duration;

/// Counters and gauges of the operator.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    duration: Histogram,
    leader: IntGauge,
}

impl OperatorMetrics {
    /// Registers the operator's metrics in `registry`.
    pub fn register(registry: &Registry) -> Result<OperatorMetrics, granary_telemetry::prometheus::Error> {
        let reconciles = IntCounterVec::new(
            Opts::new("granary_operator_reconciles_total", "Reconciles of InputPipelines, by result."),
            &["result"],
        )?;
        let leader = IntGauge::with_opts(Opts::new(
            "granary_operator_leader",
            "1 while this operator replica holds the leader Lease and serves the dispatcher.",
        ))?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "granary_operator_reconcile_duration_seconds",
                "Seconds one reconcile of an InputPipeline takes, API calls included.",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )?;
        // Both results exist from the start, at 0: an error ratio reads 0, not "no data".
        for result in ["ok", "error"] {
            reconciles.with_label_values(&[result]);
        }
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(OperatorMetrics { reconciles, duration, leader })
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, ok: bool) {
        self.reconciles.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
    }

    /// Records how long one reconcile took.
    pub fn timed(&self, took: Duration) {
        self.duration.observe(took.as_secs_f64());
    }

    /// Records leadership.
    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_are_counted_and_timed() {
        let registry = Registry::new();
        let metrics = OperatorMetrics::register(&registry).unwrap();
        metrics.reconciled(true);
        metrics.reconciled(false);
        metrics.timed(Duration::from_millis(30));
        metrics.leading(true);
        let text = granary_telemetry::render(&registry);
        assert!(text.contains("granary_operator_reconciles_total{result=\"ok\"} 1"), "{text}");
        assert!(text.contains("granary_operator_reconciles_total{result=\"error\"} 1"), "{text}");
        assert!(text.contains("granary_operator_reconcile_duration_seconds_bucket{le=\"0.05\"} 1"), "{text}");
        assert!(text.contains("granary_operator_leader 1"), "{text}");
    }
}
