//! How Granary processes expose their metrics: each process keeps a Prometheus [`Registry`] and
//! serves it in the text format at `GET /metrics` on `--metrics-addr` (`GRANARY_METRICS_ADDR`).
//!
//! Conventions: names start with `granary_`, are in base units (seconds, bytes), counters end
//! in `_total`, latencies are histograms; series carry `namespace` and `pipeline` (see
//! [`pipeline_labels`]), and `worker`, `stage` or `trainer_job` where they apply.

mod histogram;
mod labels;
mod server;

pub use histogram::CumulativeHistogramVec;
pub use labels::{LOCAL_NAMESPACE, pipeline_labels};
pub use prometheus;
use prometheus::{Encoder, Registry, TextEncoder};
pub use server::{MetricsServer, Readiness, Refresh, Targets, TelemetryError};

/// A registry holding the standard `process_*` metrics (CPU seconds, resident memory, open file
/// descriptors, start time) of this process, for Granary's own metrics to join.
pub fn registry() -> Registry {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    if let Err(e) = registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self())) {
        tracing::warn!("cannot report process metrics: {e}");
    }
    registry
}

/// The registry's metrics in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!("cannot encode metrics: {e}");
    }
    String::from_utf8(out).unwrap_or_default()
}
