//! The dispatcher's Prometheus metrics (`granary run --metrics-addr`): per pipeline the workers
//! registered, and per job its consumers, epoch and the trainers' step and wait times, read from
//! the live state at each scrape; with an autoscaler, the workers it wants and its decisions;
//! for caching pipelines, what the cache read, wrote and recomputed.

use crate::autoscaler::Scaling;
use crate::service::Dispatcher;
use granary_telemetry::prometheus::{GaugeVec, IntCounter, IntCounterVec, Opts, Registry};

fn counters(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, granary_telemetry::prometheus::Error> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

/// The dispatcher's metrics in a registry of their own.
pub struct Exposition {
    registry: Registry,
    workers: GaugeVec,
    consumers: GaugeVec,
    epoch: GaugeVec,
    step: GaugeVec,
    wait: GaugeVec,
    rate: GaugeVec,
    desired: GaugeVec,
    decisions: IntCounterVec,
    cache_bytes: IntCounterVec,
    cache_splits: IntCounterVec,
    cache_recomputed: IntCounterVec,
    splits: IntCounterVec,
    journal: IntCounterVec,
    scaling: std::sync::Mutex<Vec<(String, Scaling)>>,
}

impl Exposition {
    /// Registers every metric.
    pub fn new() -> Result<Exposition, granary_telemetry::prometheus::Error> {
        let registry = Registry::new();
        let vec = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, granary_telemetry::prometheus::Error>(g)
        };
        let job = ["pipeline", "job"];
        Ok(Exposition {
            workers: vec(
                "granary_dispatcher_workers",
                "Workers registered for the pipeline.",
                &["pipeline"],
            )?,
            consumers: vec("granary_dispatcher_consumers", "Consumers registered in the job.", &job)?,
            epoch: vec("granary_dispatcher_job_epoch", "Epoch of the job's slowest consumer.", &job)?,
            step: vec(
                "granary_trainer_step_seconds",
                "Mean seconds a trainer step takes outside the client (waiting excluded), job mean.",
                &job,
            )?,
            wait: vec(
                "granary_trainer_wait_seconds",
                "Mean seconds a trainer waits for each batch, job mean.",
                &job,
            )?,
            rate: vec(
                "granary_trainer_batches_per_second",
                "Batches the job's consumers take per second, all together.",
                &job,
            )?,
            desired: vec(
                "granary_workers_desired",
                "Workers the autoscaler wants for the pipeline.",
                &["pipeline"],
            )?,
            decisions: counters(
                &registry,
                "granary_autoscaler_decisions_total",
                "Changes of the target worker count.",
                &["pipeline", "direction"],
            )?,
            cache_bytes: counters(
                &registry,
                "granary_cache_bytes_total",
                "Cache entry bytes (as stored) read or written for the pipeline.",
                &["pipeline", "direction"],
            )?,
            cache_splits: counters(
                &registry,
                "granary_cache_splits_total",
                "Splits produced, by what the cache did: read, written, computed, or bad (an entry that \
                 failed verification and was recomputed).",
                &["pipeline", "outcome"],
            )?,
            cache_recomputed: counters(
                &registry,
                "granary_cache_recomputed_elements_total",
                "Elements computed from the source after a cache read failed.",
                &["pipeline"],
            )?,
            splits: counters(
                &registry,
                "granary_dispatcher_splits_total",
                "Split leases by what became of them: leased, completed, or requeued (given back by a \
                 draining worker, or taken from a dead or late one and handed out again).",
                &["pipeline", "event"],
            )?,
            journal: counters(
                &registry,
                "granary_dispatcher_journal_writes_total",
                "Appends to the dispatcher's journal, by result (ok or error).",
                &["result"],
            )?,
            scaling: std::sync::Mutex::new(Vec::new()),
            registry,
        })
    }

    /// Also reports what the autoscaler of `pipeline` does.
    pub fn with_scaling(self, pipeline: &str, scaling: Scaling) -> Exposition {
        self.track_scaling(pipeline, scaling);
        self
    }

    fn scalings(&self) -> std::sync::MutexGuard<'_, Vec<(String, Scaling)>> {
        self.scaling.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reports what the autoscaler of `pipeline` does from now on (replacing an earlier one).
    pub fn track_scaling(&self, pipeline: &str, scaling: Scaling) {
        let mut all = self.scalings();
        all.retain(|(p, _)| p != pipeline);
        all.push((pipeline.to_string(), scaling));
    }

    /// Stops reporting the autoscaler of `pipeline` and drops its series.
    pub fn untrack_scaling(&self, pipeline: &str) {
        self.scalings().retain(|(p, _)| p != pipeline);
        let _ = self.desired.remove_label_values(&[pipeline]);
    }

    /// The registry to serve.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    fn refresh_cache(&self, pipeline: &str, report: &crate::CacheReport) {
        let sum = |f: fn(&crate::EpochCache) -> u64| report.epochs.iter().map(f).sum::<u64>();
        let set = |counter: IntCounter, total: u64| counter.inc_by(total.saturating_sub(counter.get()));
        set(self.cache_bytes.with_label_values(&[pipeline, "read"]), sum(|e| e.bytes_read));
        set(self.cache_bytes.with_label_values(&[pipeline, "written"]), sum(|e| e.bytes_written));
        for (outcome, total) in [
            ("read", sum(|e| e.splits_read)),
            ("written", sum(|e| e.splits_written)),
            ("computed", sum(|e| e.splits_computed)),
            ("bad", sum(|e| e.splits_bad)),
        ] {
            set(self.cache_splits.with_label_values(&[pipeline, outcome]), total);
        }
        set(self.cache_recomputed.with_label_values(&[pipeline]), sum(|e| e.recomputed));
    }

    /// Reads the dispatcher's state into the gauges.
    pub fn refresh(&self, dispatcher: &Dispatcher) {
        if let Some((ok, failed)) = dispatcher.journal_writes() {
            for (result, total) in [("ok", ok), ("error", failed)] {
                let counter = self.journal.with_label_values(&[result]);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
        }
        for family in [&self.workers, &self.consumers, &self.epoch, &self.step, &self.wait, &self.rate] {
            family.reset();
        }
        for (pipeline, scaling) in self.scalings().iter() {
            let report = scaling.report();
            self.desired.with_label_values(&[pipeline.as_str()]).set(f64::from(report.desired));
            for (direction, total) in [("up", report.scale_ups), ("down", report.scale_downs)] {
                let counter = self.decisions.with_label_values(&[pipeline.as_str(), direction]);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
        }
        for pipeline in dispatcher.pipelines() {
            let p = pipeline.as_str();
            if let Some(report) = dispatcher.cache_report(p) {
                self.refresh_cache(p, &report);
            }
            self.workers.with_label_values(&[p]).set(dispatcher.workers(p).len() as f64);
            let counts = dispatcher.split_counts(p);
            for (event, total) in
                [("leased", counts.leased), ("completed", counts.completed), ("requeued", counts.requeued)]
            {
                let counter = self.splits.with_label_values(&[p, event]);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
            for job in dispatcher.progress(p) {
                let labels = [p, job.job.as_str()];
                self.consumers.with_label_values(&labels).set(f64::from(job.consumers));
                self.epoch.with_label_values(&labels).set(f64::from(job.epoch));
            }
            let snapshot = dispatcher.snapshot(p);
            let mut jobs: std::collections::BTreeMap<&str, (f64, f64, f64, u32)> = Default::default();
            for (job, _, m) in &snapshot.consumers {
                let entry = jobs.entry(job.as_str()).or_default();
                entry.0 += m.step_seconds;
                entry.1 += m.wait_seconds;
                entry.2 += m.batches_per_second;
                entry.3 += 1;
            }
            for (job, (step, wait, rate, n)) in jobs {
                let labels = [p, job];
                let n = f64::from(n.max(1));
                self.step.with_label_values(&labels).set(step / n);
                self.wait.with_label_values(&labels).set(wait / n);
                self.rate.with_label_values(&labels).set(rate);
            }
        }
    }
}
