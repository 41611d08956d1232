//! The worker's Prometheus metrics (`--metrics-addr`), refreshed from each heartbeat's sample so
//! that a scrape and the dispatcher see the same figures. Every series carries `namespace`,
//! `pipeline` (what the worker serves; empty when it serves any) and `worker` (its id at the
//! dispatcher).

use super::metrics::StageTotal;
use granary_proto::v1::WorkerMetrics;
use granary_telemetry::prometheus::{
    Counter, CounterVec, Error, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
    Registry,
};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

const LABELS: [&str; 3] = ["namespace", "pipeline", "worker"];
const STAGE_LABELS: [&str; 4] = ["namespace", "pipeline", "worker", "stage"];

/// Running totals at the time of a sample.
#[derive(Clone, Debug, Default)]
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
    /// Splits whose cache read failed and that were recomputed.
    pub cache_fallbacks: u64,
    /// Elements computed after a failed cache read.
    pub cache_recomputed: u64,
    /// Elements a stage failed on that were dropped (`spec.errors.policy: skip`).
    pub skipped: u64,
    /// CPU seconds the process and its Python stage runners used.
    pub cpu_seconds: f64,
    /// Per stage, compute time and elements.
    pub stages: Vec<StageTotal>,
    /// Compute threads the running engines run now, all together.
    pub compute_threads: u64,
    /// Reads the running engines' `format: files` sources keep in flight now, all together.
    pub read_depth: u64,
}

/// The worker's metrics in a registry of their own.
pub struct Exposition {
    registry: Registry,
    /// `namespace` and `pipeline` label values.
    pipeline: [String; 2],
    /// The worker id, once registered.
    worker: RwLock<String>,
    elements: IntCounterVec,
    parts: IntCounterVec,
    bytes: IntCounterVec,
    cache_read: IntCounterVec,
    cache_written: IntCounterVec,
    cache_fallbacks: IntCounterVec,
    cache_recomputed: IntCounterVec,
    skipped: IntCounterVec,
    cpu: CounterVec,
    stage_seconds: CounterVec,
    stage_elements: IntCounterVec,
    buffered: GaugeVec,
    capacity: GaugeVec,
    leases: GaugeVec,
    cores: GaugeVec,
    compute_threads: GaugeVec,
    read_depth: GaugeVec,
    split_seconds: HistogramVec,
}

impl Exposition {
    /// Registers every metric, and the `process_*` metrics; `pipeline` is what the worker serves
    /// (`namespace/name`, a bare name, or empty for any).
    pub fn new(pipeline: &str) -> Result<Exposition, Error> {
        let registry = granary_telemetry::registry();
        let counter = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &LABELS)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, Error>(c)
        };
        let gauge = |name: &str, help: &str| {
            let g = GaugeVec::new(Opts::new(name, help), &LABELS)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, Error>(g)
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
        let cache_fallbacks = counter(
            "granary_worker_cache_fallback_splits_total",
            "Splits whose cache read failed (an entry that failed verification, or the store failing) \
             and that were recomputed from the source.",
        )?;
        let cache_recomputed = counter(
            "granary_worker_cache_recomputed_elements_total",
            "Elements computed from the source after a cache read failed.",
        )?;
        let skipped = counter(
            "granary_worker_elements_skipped_total",
            "Elements a stage failed on (an undecodable image, a transform that rejected it) that were \
             dropped under spec.errors.policy skip; each split produced again counts its skips again.",
        )?;
        let stage_elements = IntCounterVec::new(
            Opts::new("granary_worker_stage_elements_total", "Elements each stage computed."),
            &STAGE_LABELS,
        )?;
        registry.register(Box::new(stage_elements.clone()))?;
        let stage_seconds = CounterVec::new(
            Opts::new(
                "granary_worker_stage_seconds_total",
                "Seconds each stage spent computing; over granary_worker_stage_elements_total, the \
                 time per element.",
            ),
            &STAGE_LABELS,
        )?;
        registry.register(Box::new(stage_seconds.clone()))?;
        let cpu = CounterVec::new(
            Opts::new(
                "granary_worker_cpu_seconds_total",
                "CPU seconds (user and system) the worker and its Python stage runners used.",
            ),
            &LABELS,
        )?;
        registry.register(Box::new(cpu.clone()))?;
        let split_seconds = HistogramVec::new(
            HistogramOpts::new(
                "granary_worker_split_seconds",
                "Seconds from leasing a split to queueing its last part for the consumers.",
            )
            .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &LABELS,
        )?;
        registry.register(Box::new(split_seconds.clone()))?;
        let (namespace, name) = match pipeline {
            "" => ("", ""),
            id => granary_telemetry::pipeline_labels(id),
        };
        Ok(Exposition {
            pipeline: [namespace.to_string(), name.to_string()],
            worker: RwLock::new(String::new()),
            elements,
            parts,
            bytes,
            cache_read,
            cache_written,
            cache_fallbacks,
            cache_recomputed,
            skipped,
            cpu,
            stage_seconds,
            stage_elements,
            buffered: gauge("granary_worker_buffered_parts", "Batch parts queued for consumers.")?,
            capacity: gauge(
                "granary_worker_buffer_capacity_parts",
                "Capacity of the consumer queues, in parts.",
            )?,
            leases: gauge("granary_worker_active_leases", "Splits leased and in progress.")?,
            cores: gauge("granary_worker_cores", "Cores the worker computes with.")?,
            compute_threads: gauge(
                "granary_worker_compute_threads",
                "Compute threads the worker's engines run now (more than its cores while tuning adds \
                 threads for a Python stage that waits).",
            )?,
            read_depth: gauge(
                "granary_worker_read_depth",
                "Reads the worker's format: files sources keep in flight now, tuned to the store's \
                 latency (0 without such a source).",
            )?,
            split_seconds,
            registry,
        })
    }

    /// The registry to serve.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    /// The worker's id at the dispatcher (after registering), for the `worker` label.
    pub fn set_worker(&self, id: &str) {
        *self.worker.write().unwrap_or_else(PoisonError::into_inner) = id.to_string();
    }

    fn labels(&self) -> [String; 3] {
        let worker = self.worker.read().unwrap_or_else(PoisonError::into_inner).clone();
        [self.pipeline[0].clone(), self.pipeline[1].clone(), worker]
    }

    /// A split was computed in `took`, from its lease on.
    pub fn split_produced(&self, took: Duration) {
        let labels = self.labels();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        self.split_seconds.with_label_values(&labels).observe(took.as_secs_f64());
    }

    /// Records a heartbeat's sample.
    pub fn observe(&self, totals: &Totals, sample: &WorkerMetrics) {
        let labels = self.labels();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let set = |family: &IntCounterVec, total: u64| {
            let counter = family.with_label_values(&labels);
            counter.inc_by(total.saturating_sub(counter.get()));
        };
        set(&self.elements, totals.elements);
        set(&self.parts, totals.parts);
        set(&self.bytes, totals.bytes);
        set(&self.cache_read, totals.cache_read);
        set(&self.cache_written, totals.cache_written);
        set(&self.cache_fallbacks, totals.cache_fallbacks);
        set(&self.cache_recomputed, totals.cache_recomputed);
        set(&self.skipped, totals.skipped);
        raise(&self.cpu.with_label_values(&labels), totals.cpu_seconds);
        for stage in &totals.stages {
            let stage_labels = [labels[0], labels[1], labels[2], stage.stage.as_str()];
            let elements: IntCounter = self.stage_elements.with_label_values(&stage_labels);
            elements.inc_by(stage.elements.saturating_sub(elements.get()));
            raise(&self.stage_seconds.with_label_values(&stage_labels), stage.nanos as f64 / 1e9);
        }
        self.buffered.with_label_values(&labels).set(f64::from(sample.buffered_parts));
        self.capacity.with_label_values(&labels).set(f64::from(sample.buffer_capacity));
        self.leases.with_label_values(&labels).set(f64::from(sample.active_leases));
        self.cores.with_label_values(&labels).set(f64::from(sample.cores));
        self.compute_threads.with_label_values(&labels).set(totals.compute_threads as f64);
        self.read_depth.with_label_values(&labels).set(totals.read_depth as f64);
    }
}

/// Raises a float counter to `total` (never lowers it).
fn raise(counter: &Counter, total: f64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_becomes_labelled_counters_and_gauges() {
        let e = Exposition::new("ml/imagenet").unwrap();
        e.set_worker("worker-7");
        let sample = WorkerMetrics {
            buffered_parts: 3,
            buffer_capacity: 8,
            active_leases: 2,
            cores: 4,
            ..Default::default()
        };
        let stages = vec![StageTotal { stage: "image.decode".into(), nanos: 2_000_000_000, elements: 1000 }];
        e.observe(
            &Totals { elements: 100, parts: 10, bytes: 1000, cpu_seconds: 1.5, stages, ..Totals::default() },
            &sample,
        );
        let stages = vec![StageTotal { stage: "image.decode".into(), nanos: 3_000_000_000, elements: 1500 }];
        let later = Totals {
            elements: 150,
            parts: 12,
            bytes: 1500,
            cache_read: 4096,
            cache_fallbacks: 1,
            cache_recomputed: 7,
            skipped: 2,
            cpu_seconds: 2.5,
            stages,
            compute_threads: 7,
            read_depth: 64,
            ..Totals::default()
        };
        e.observe(&later, &sample);
        e.split_produced(Duration::from_millis(300));
        let text = granary_telemetry::render(&e.registry());
        let l = "namespace=\"ml\",pipeline=\"imagenet\",worker=\"worker-7\"";
        let stage = "namespace=\"ml\",pipeline=\"imagenet\",stage=\"image.decode\",worker=\"worker-7\"";
        for line in [
            format!("granary_worker_elements_produced_total{{{l}}} 150"),
            format!("granary_worker_parts_sent_total{{{l}}} 12"),
            format!("granary_worker_sent_bytes_total{{{l}}} 1500"),
            format!("granary_worker_buffered_parts{{{l}}} 3"),
            format!("granary_worker_buffer_capacity_parts{{{l}}} 8"),
            format!("granary_worker_active_leases{{{l}}} 2"),
            format!("granary_worker_cores{{{l}}} 4"),
            format!("granary_worker_compute_threads{{{l}}} 7"),
            format!("granary_worker_read_depth{{{l}}} 64"),
            format!("granary_worker_cpu_seconds_total{{{l}}} 2.5"),
            format!("granary_worker_stage_seconds_total{{{stage}}} 3"),
            format!("granary_worker_stage_elements_total{{{stage}}} 1500"),
            format!("granary_worker_cache_read_bytes_total{{{l}}} 4096"),
            format!("granary_worker_cache_written_bytes_total{{{l}}} 0"),
            format!("granary_worker_cache_fallback_splits_total{{{l}}} 1"),
            format!("granary_worker_cache_recomputed_elements_total{{{l}}} 7"),
            format!("granary_worker_elements_skipped_total{{{l}}} 2"),
            format!("granary_worker_split_seconds_bucket{{{l},le=\"0.5\"}} 1"),
            format!("granary_worker_split_seconds_count{{{l}}} 1"),
        ] {
            assert!(text.lines().any(|t| t == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn a_worker_for_any_pipeline_has_empty_pipeline_labels() {
        let e = Exposition::new("").unwrap();
        e.set_worker("worker-1");
        e.observe(&Totals::default(), &WorkerMetrics::default());
        let text = granary_telemetry::render(&e.registry());
        assert!(
            text.contains("granary_worker_cores{namespace=\"\",pipeline=\"\",worker=\"worker-1\"} 0"),
            "{text}"
        );
    }
}
