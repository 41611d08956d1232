//! The worker's Prometheus metrics (`--metrics-addr`), refreshed from each heartbeat's sample so
//! that a scrape and the dispatcher see the same figures.

use granary_proto::v1::WorkerMetrics;
use granary_telemetry::prometheus::{Gauge, GaugeVec, IntCounter, IntGauge, Opts, Registry};

/// Running totals at the time of a sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    /// Elements produced.
    pub elements: u64,
    /// Batch parts taken by consumer streams.
    pub parts: u64,
    /// Payload bytes taken by consumer streams.
    pub bytes: u64,
    /// Cache entry bytes read, as stored.
    pub cache_read: u64,
    /// Cache entry bytes written and published.
    pub cache_written: u64,
    /// Splits whose cache entry failed verification.
    pub cache_bad: u64,
    /// Elements computed after a failed cache read.
    pub cache_recomputed: u64,
}

/// The worker's metrics in a registry of their own.
pub struct Exposition {
    registry: Registry,
    elements: IntCounter,
    parts: IntCounter,
    bytes: IntCounter,
    buffered: IntGauge,
    capacity: IntGauge,
    leases: IntGauge,
    cores: IntGauge,
    cpu: Gauge,
    stage_seconds: GaugeVec,
    cache_read: IntCounter,
    cache_written: IntCounter,
    cache_bad: IntCounter,
    cache_recomputed: IntCounter,
}

impl Exposition {
    /// Registers every metric.
    pub fn new() -> Result<Exposition, granary_telemetry::prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> Result<IntCounter, _> {
            let c = IntCounter::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, granary_telemetry::prometheus::Error>(c)
        };
        let elements =
            counter("granary_worker_elements_produced_total", "Elements the worker's engines produced.")?;
        let parts =
            counter("granary_worker_parts_sent_total", "Batch parts consumers took from this worker.")?;
        let bytes = counter(
            "granary_worker_sent_bytes_total",
            "Tensor payload bytes consumers took from this worker.",
        )?;
        let cache_read = counter(
            "granary_worker_cache_read_bytes_total",
            "Cache entry bytes (as stored) this worker read.",
        )?;
        let cache_written = counter(
            "granary_worker_cache_written_bytes_total",
            "Cache entry bytes this worker wrote and published.",
        )?;
        let cache_bad = counter(
            "granary_worker_cache_bad_splits_total",
            "Split entries that failed verification (checksum, size, manifest) and were recomputed.",
        )?;
        let cache_recomputed = counter(
            "granary_worker_cache_recomputed_elements_total",
            "Elements computed from the source after a cache read failed.",
        )?;
        let gauge = |name: &str, help: &str| -> Result<IntGauge, _> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, granary_telemetry::prometheus::Error>(g)
        };
        let buffered = gauge("granary_worker_buffered_parts", "Batch parts queued for consumers.")?;
        let capacity =
            gauge("granary_worker_buffer_capacity_parts", "Capacity of the consumer queues, in parts.")?;
        let leases = gauge("granary_worker_active_leases", "Splits leased and in progress.")?;
        let cores = gauge("granary_worker_cores", "Cores the worker computes with.")?;
        let cpu = Gauge::with_opts(Opts::new(
            "granary_worker_cpu_cores_used",
            "CPU seconds the worker used per second over the last heartbeat interval.",
        ))?;
        registry.register(Box::new(cpu.clone()))?;
        let stage_seconds = GaugeVec::new(
            Opts::new(
                "granary_worker_stage_seconds_per_element",
                "Mean compute seconds per element of each stage over the last heartbeat interval.",
            ),
            &["stage"],
        )?;
        registry.register(Box::new(stage_seconds.clone()))?;
        Ok(Exposition {
            registry,
            elements,
            parts,
            bytes,
            buffered,
            capacity,
            leases,
            cores,
            cpu,
            stage_seconds,
            cache_read,
            cache_written,
            cache_bad,
            cache_recomputed,
        })
    }

    /// The registry to serve.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    /// Records a heartbeat's sample.
    pub fn observe(&self, totals: Totals, sample: &WorkerMetrics) {
        for (counter, total) in [
            (&self.elements, totals.elements),
            (&self.parts, totals.parts),
            (&self.bytes, totals.bytes),
            (&self.cache_read, totals.cache_read),
            (&self.cache_written, totals.cache_written),
            (&self.cache_bad, totals.cache_bad),
            (&self.cache_recomputed, totals.cache_recomputed),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.buffered.set(i64::from(sample.buffered_parts));
        self.capacity.set(i64::from(sample.buffer_capacity));
        self.leases.set(i64::from(sample.active_leases));
        self.cores.set(i64::from(sample.cores));
        self.cpu.set(sample.cpu_cores_used);
        for stage in &sample.stages {
            self.stage_seconds.with_label_values(&[stage.stage.as_str()]).set(stage.seconds_per_element);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::v1::StageTime;

    #[test]
    fn a_sample_becomes_counters_and_gauges() {
        let e = Exposition::new().unwrap();
        let sample = WorkerMetrics {
            buffered_parts: 3,
            buffer_capacity: 8,
            active_leases: 2,
            cores: 4,
            cpu_cores_used: 1.5,
            stages: vec![StageTime { stage: "image.decode".into(), seconds_per_element: 0.002 }],
            ..Default::default()
        };
        e.observe(Totals { elements: 100, parts: 10, bytes: 1000, ..Totals::default() }, &sample);
        let later = Totals { cache_read: 4096, cache_bad: 1, cache_recomputed: 7, ..Totals::default() };
        e.observe(Totals { elements: 150, parts: 12, bytes: 1500, ..later }, &sample);
        let text = granary_telemetry::render(&e.registry());
        for line in [
            "granary_worker_elements_produced_total 150",
            "granary_worker_parts_sent_total 12",
            "granary_worker_sent_bytes_total 1500",
            "granary_worker_buffered_parts 3",
            "granary_worker_buffer_capacity_parts 8",
            "granary_worker_active_leases 2",
            "granary_worker_cores 4",
            "granary_worker_cpu_cores_used 1.5",
            "granary_worker_stage_seconds_per_element{stage=\"image.decode\"} 0.002",
            "granary_worker_cache_read_bytes_total 4096",
            "granary_worker_cache_written_bytes_total 0",
            "granary_worker_cache_bad_splits_total 1",
            "granary_worker_cache_recomputed_elements_total 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
