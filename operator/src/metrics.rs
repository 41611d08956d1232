//! The operator's own metrics, next to the dispatcher's on the same `/metrics`.

use granary_telemetry::prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// Counters and gauges of the operator.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
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
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(OperatorMetrics { reconciles, leader })
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, ok: bool) {
        self.reconciles.with_label_values(&[if ok { "ok" } else { "error" }]).inc();
    }

    /// Records leadership.
    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}
