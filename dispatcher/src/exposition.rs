//! The dispatcher's Prometheus metrics (`granary run --metrics-addr`, and the operator's metrics
//! port), rebuilt from the live state at each scrape. Per pipeline (`namespace`, `pipeline`):
//! the workers ready, desired, registered and lost; lease outcomes; the cache's state, bytes and
//! splits by outcome, the closed loop's last predicted and measured epoch time and its
//! re-decisions; elements skipped (`spec.errors.policy: skip`); per trainer job
//! (`trainer_job`): consumers, epoch, batches delivered and demanded, buffered batches, and
//! histograms of the trainers' step and wait times.

use crate::autoscaler::Scaling;
use crate::service::Dispatcher;
use granary_proto::TRAINER_SECONDS_BUCKETS;
use granary_telemetry::prometheus::{Error, GaugeVec, IntCounter, IntCounterVec, Opts, Registry};
use granary_telemetry::{CumulativeHistogramVec, pipeline_labels};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

const PIPELINE: [&str; 2] = ["namespace", "pipeline"];
const JOB: [&str; 3] = ["namespace", "pipeline", "trainer_job"];

/// How a pipeline's worker count is set.
#[derive(Clone)]
enum Sizing {
    Auto(Scaling),
    Fixed(u32),
}

/// The dispatcher's metrics in a registry of their own.
pub struct Exposition {
    registry: Registry,
    ready: GaugeVec,
    desired: GaugeVec,
    decisions: IntCounterVec,
    registrations: IntCounterVec,
    lost: IntCounterVec,
    consumers: GaugeVec,
    epoch: GaugeVec,
    normalize_on_worker: GaugeVec,
    image_share: GaugeVec,
    batches: IntCounterVec,
    demand: GaugeVec,
    buffered: GaugeVec,
    step: CumulativeHistogramVec,
    wait: CumulativeHistogramVec,
    cache_state: GaugeVec,
    cache_bytes: IntCounterVec,
    cache_splits: IntCounterVec,
    cache_recomputed: IntCounterVec,
    cache_epoch_seconds: GaugeVec,
    cache_redecisions: IntCounterVec,
    splits: IntCounterVec,
    skipped: IntCounterVec,
    journal: IntCounterVec,
    sizing: Mutex<BTreeMap<String, Sizing>>,
}

/// Sets a counter, reset by `refresh`, to a running total the dispatcher keeps.
fn set_total(counter: IntCounter, total: u64) {
    counter.inc_by(total);
}

impl Exposition {
    /// Registers every metric, and the `process_*` metrics of this process.
    pub fn new() -> Result<Exposition, Error> {
        let registry = granary_telemetry::registry();
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, Error>(g)
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, Error>(c)
        };
        let histogram = |name: &str, help: &str| {
            let h = CumulativeHistogramVec::new(name, help, &JOB, &TRAINER_SECONDS_BUCKETS)?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, Error>(h)
        };
        Ok(Exposition {
            ready: gauges(
                "granary_workers_ready",
                "Workers registered for the pipeline and heartbeating.",
                &PIPELINE,
            )?,
            desired: gauges(
                "granary_workers_desired",
                "Workers the pipeline should have: the autoscaler's target, or the fixed count.",
                &PIPELINE,
            )?,
            decisions: counters(
                "granary_autoscaler_decisions_total",
                "Changes of the autoscaler's target worker count, by direction (up or down).",
                &["namespace", "pipeline", "direction"],
            )?,
            registrations: counters(
                "granary_dispatcher_worker_registrations_total",
                "Worker registrations: a worker starting, or registering again after a dispatcher restart.",
                &PIPELINE,
            )?,
            lost: counters(
                "granary_dispatcher_workers_lost_total",
                "Workers dropped after missing their heartbeats (crashed, killed or cut off); their splits \
                 went to other workers.",
                &PIPELINE,
            )?,
            consumers: gauges(
                "granary_dispatcher_consumers",
                "Consumers registered in the trainer job.",
                &JOB,
            )?,
            epoch: gauges(
                "granary_dispatcher_job_epoch",
                "Epoch of the trainer job's slowest consumer.",
                &JOB,
            )?,
            normalize_on_worker: gauges(
                "granary_dispatcher_job_normalize_on_worker",
                "1 while the workers apply the pipeline's final float32 normalization for the trainer \
                 job (placement: its trainers' hosts have no idle cores), 0 while its clients do.",
                &JOB,
            )?,
            image_share: gauges(
                "granary_dispatcher_job_image_share",
                "Share of the trainer job's images its trainers' hosts make from the workers' plans \
                 (placement of the image run), 0 to 1.",
                &JOB,
            )?,
            batches: counters(
                "granary_trainer_batches_total",
                "Batches delivered to the job's trainers.",
                &JOB,
            )?,
            demand: gauges(
                "granary_trainer_demand_batches_per_second",
                "Batches per second the job's trainers would take if they never waited: consumers over \
                 their mean step time in the last heartbeat interval.",
                &JOB,
            )?,
            buffered: gauges(
                "granary_trainer_buffered_batches",
                "Complete batches buffered in the job's clients, ready for the trainers.",
                &JOB,
            )?,
            step: histogram(
                "granary_trainer_step_seconds",
                "Seconds a trainer step takes outside the client (between one batch and the next \
                 request), as the clients measure it.",
            )?,
            wait: histogram(
                "granary_trainer_wait_seconds",
                "Seconds a trainer waits inside the client for each batch.",
            )?,
            cache_state: gauges(
                "granary_cache_state",
                "1 for what the pipeline's cache does now (off, profiling, compute, writing, reading), \
                 0 for the other states.",
                &["namespace", "pipeline", "state"],
            )?,
            cache_bytes: counters(
                "granary_cache_bytes_total",
                "Cache entry bytes (as stored) read or written for the pipeline, by direction.",
                &["namespace", "pipeline", "direction"],
            )?,
            cache_splits: counters(
                "granary_cache_splits_total",
                "Splits produced, by what the cache did: read (a hit), written (computed and written), \
                 computed (without the cache), or fallback (the read failed on a bad entry or the \
                 store, and the split was recomputed from the source).",
                &["namespace", "pipeline", "outcome"],
            )?,
            cache_recomputed: counters(
                "granary_cache_recomputed_elements_total",
                "Elements computed from the source after a cache read failed.",
                &PIPELINE,
            )?,
            cache_epoch_seconds: gauges(
                "granary_cache_epoch_seconds",
                "The autocacher's last checked epoch: the seconds its decision predicted for the \
                 epoch's splits (predicted) and the seconds they took (measured). Off by more than \
                 25%, the autocacher re-decides.",
                &["namespace", "pipeline", "kind"],
            )?,
            cache_redecisions: counters(
                "granary_cache_redecisions_total",
                "Times the autocacher re-decided at an epoch boundary because the epoch's measured \
                 time was off its prediction by more than 25%.",
                &PIPELINE,
            )?,
            splits: counters(
                "granary_dispatcher_splits_total",
                "Split leases by what became of them: leased, completed, or requeued (given back by a \
                 draining worker, or taken from a dead or late one and handed out again).",
                &["namespace", "pipeline", "event"],
            )?,
            skipped: counters(
                "granary_dispatcher_elements_skipped_total",
                "Elements a stage failed on that were dropped under spec.errors.policy skip, counted once \
                 per split, epoch and trainer job (journaled: it survives a restart).",
                &PIPELINE,
            )?,
            journal: counters(
                "granary_dispatcher_journal_writes_total",
                "Appends to the dispatcher's journal, by result (ok or error).",
                &["result"],
            )?,
            sizing: Mutex::new(BTreeMap::new()),
            registry,
        })
    }

    /// Also reports what the autoscaler of `pipeline` does.
    pub fn with_scaling(self, pipeline: &str, scaling: Scaling) -> Exposition {
        self.track_scaling(pipeline, scaling);
        self
    }

    fn sizing(&self) -> MutexGuard<'_, BTreeMap<String, Sizing>> {
        self.sizing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reports what the autoscaler of `pipeline` does from now on (replacing earlier sizing).
    pub fn track_scaling(&self, pipeline: &str, scaling: Scaling) {
        self.sizing().insert(pipeline.to_string(), Sizing::Auto(scaling));
    }

    /// Reports a fixed worker count for `pipeline` from now on (replacing earlier sizing).
    pub fn track_fixed(&self, pipeline: &str, workers: u32) {
        self.sizing().insert(pipeline.to_string(), Sizing::Fixed(workers));
    }

    /// Stops reporting how `pipeline` is sized.
    pub fn untrack_scaling(&self, pipeline: &str) {
        self.sizing().remove(pipeline);
    }

    /// The registry to serve.
    pub fn registry(&self) -> Registry {
        self.registry.clone()
    }

    /// Rebuilds every series from the dispatcher's state (counters from the totals it keeps), so
    /// pipelines and jobs that are gone lose their series. The metrics server runs this and the
    /// rendering under one lock, so a scrape never sees a half-built registry.
    pub fn refresh(&self, dispatcher: &Dispatcher) {
        for family in [
            &self.ready,
            &self.desired,
            &self.consumers,
            &self.epoch,
            &self.normalize_on_worker,
            &self.image_share,
            &self.demand,
            &self.buffered,
            &self.cache_state,
            &self.cache_epoch_seconds,
        ] {
            family.reset();
        }
        for family in [
            &self.decisions,
            &self.registrations,
            &self.lost,
            &self.batches,
            &self.cache_bytes,
            &self.cache_splits,
            &self.cache_recomputed,
            &self.cache_redecisions,
            &self.splits,
            &self.skipped,
            &self.journal,
        ] {
            family.reset();
        }
        self.step.retain(|_| false);
        self.wait.retain(|_| false);
        if let Some((ok, failed)) = dispatcher.journal_writes() {
            set_total(self.journal.with_label_values(&["ok"]), ok);
            set_total(self.journal.with_label_values(&["error"]), failed);
        }
        let pipelines = dispatcher.pipelines();
        let sizing = self.sizing().clone();
        for (pipeline, sizing) in &sizing {
            let (namespace, name) = pipeline_labels(pipeline);
            match sizing {
                Sizing::Fixed(n) => self.desired.with_label_values(&[namespace, name]).set(f64::from(*n)),
                Sizing::Auto(scaling) => {
                    let report = scaling.report();
                    self.desired.with_label_values(&[namespace, name]).set(f64::from(report.desired));
                    for (direction, total) in [("up", report.scale_ups), ("down", report.scale_downs)] {
                        set_total(self.decisions.with_label_values(&[namespace, name, direction]), total);
                    }
                }
            }
        }
        for pipeline in &pipelines {
            self.refresh_pipeline(dispatcher, pipeline);
        }
    }

    fn refresh_pipeline(&self, dispatcher: &Dispatcher, pipeline: &str) {
        let (namespace, name) = pipeline_labels(pipeline);
        let labels = [namespace, name];
        self.ready.with_label_values(&labels).set(dispatcher.workers(pipeline).len() as f64);
        let workers = dispatcher.worker_counts(pipeline);
        set_total(self.registrations.with_label_values(&labels), workers.registrations);
        set_total(self.lost.with_label_values(&labels), workers.lost);
        let counts = dispatcher.split_counts(pipeline);
        for (event, total) in
            [("leased", counts.leased), ("completed", counts.completed), ("requeued", counts.requeued)]
        {
            set_total(self.splits.with_label_values(&[namespace, name, event]), total);
        }
        set_total(self.skipped.with_label_values(&labels), dispatcher.skipped(pipeline));
        if let Some(report) = dispatcher.cache_report(pipeline) {
            self.refresh_cache(&labels, &report);
        }
        for job in dispatcher.progress(pipeline) {
            let labels = [namespace, name, job.job.as_str()];
            self.consumers.with_label_values(&labels).set(f64::from(job.consumers));
            self.epoch.with_label_values(&labels).set(f64::from(job.epoch));
            self.normalize_on_worker
                .with_label_values(&labels)
                .set(f64::from(u8::from(job.normalize_on_worker)));
            self.image_share.with_label_values(&labels).set(job.image_share);
        }
        for (job, totals) in dispatcher.trainer_totals(pipeline) {
            let labels = [namespace, name, job.as_str()];
            set_total(self.batches.with_label_values(&labels), totals.batches);
            self.step.add(&labels, &totals.step.counts, totals.step.sum);
            self.wait.add(&labels, &totals.wait.counts, totals.wait.sum);
        }
        // Per job: consumers, the step times measured in the last interval, buffered batches.
        let mut jobs: BTreeMap<&str, (u32, Vec<f64>, u32)> = BTreeMap::new();
        let snapshot = dispatcher.snapshot(pipeline);
        for (job, _, m) in &snapshot.consumers {
            let entry = jobs.entry(job.as_str()).or_default();
            entry.0 += 1;
            // An interval without a step (e.g. the extra heartbeat at an epoch's start) says
            // nothing about the step time, as the policies read it too.
            if m.step_seconds.is_finite() && m.step_seconds > 0.0 {
                entry.1.push(m.step_seconds);
            }
            entry.2 += m.buffered_batches;
        }
        for (job, (consumers, steps, buffered)) in jobs {
            let labels = [namespace, name, job];
            if !steps.is_empty() {
                let mean = steps.iter().sum::<f64>() / steps.len() as f64;
                self.demand.with_label_values(&labels).set(f64::from(consumers) / mean);
            }
            self.buffered.with_label_values(&labels).set(f64::from(buffered));
        }
    }

    fn refresh_cache(&self, labels: &[&str; 2], report: &crate::CacheReport) {
        let [namespace, name] = *labels;
        let state = report.state();
        for s in crate::CACHE_STATES {
            self.cache_state.with_label_values(&[namespace, name, s]).set(if s == state { 1.0 } else { 0.0 });
        }
        if report.store.is_none() {
            return;
        }
        let sum = |f: fn(&crate::EpochCache) -> u64| report.epochs.iter().map(f).sum::<u64>();
        set_total(self.cache_bytes.with_label_values(&[namespace, name, "read"]), sum(|e| e.bytes_read));
        set_total(
            self.cache_bytes.with_label_values(&[namespace, name, "written"]),
            sum(|e| e.bytes_written),
        );
        for (outcome, total) in [
            ("read", sum(|e| e.splits_read - e.splits_read_failed)),
            ("written", sum(|e| e.splits_written)),
            ("computed", sum(|e| e.splits_computed)),
            ("fallback", report.fallbacks()),
        ] {
            set_total(self.cache_splits.with_label_values(&[namespace, name, outcome]), total);
        }
        set_total(self.cache_recomputed.with_label_values(labels), sum(|e| e.recomputed));
        set_total(self.cache_redecisions.with_label_values(labels), u64::from(report.redecisions));
        if let Some(check) = report.checks.last() {
            for (kind, seconds) in
                [("predicted", check.predicted_seconds), ("measured", check.measured_seconds)]
            {
                if seconds.is_finite() {
                    self.cache_epoch_seconds.with_label_values(&[namespace, name, kind]).set(seconds);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheReport, EpochCache, EpochCheck};

    fn epoch(epoch: u32, mode: &str) -> EpochCache {
        EpochCache {
            epoch,
            mode: mode.into(),
            bytes_read: 0,
            bytes_written: if mode == "write" { 4096 } else { 0 },
            splits_read: 0,
            splits_written: if mode == "write" { 3 } else { 0 },
            splits_computed: if mode == "write" { 0 } else { 3 },
            splits_bad: 0,
            splits_read_failed: 0,
            recomputed: 0,
            predicted_items_per_s: None,
            measured_items_per_s: None,
        }
    }

    fn check(epoch: u32, predicted: f64, measured: f64, verdict: &str) -> EpochCheck {
        EpochCheck {
            epoch,
            action: "compute".into(),
            elements: 30,
            predicted_seconds: predicted,
            measured_seconds: measured,
            error: (measured - predicted) / predicted,
            verdict: verdict.into(),
            text: format!("epoch {epoch}: {verdict}"),
        }
    }

    fn report(checks: Vec<EpochCheck>) -> CacheReport {
        let redecisions = checks.iter().filter(|c| c.verdict == "re-decided").count() as u32;
        CacheReport {
            policy: "auto".into(),
            store: Some("file:///cache".into()),
            decision: None,
            stage: None,
            fingerprint: None,
            sources: Vec::new(),
            epochs: vec![epoch(0, "compute"), epoch(1, "write")],
            last_check: checks.last().map(|c| c.text.clone()),
            checks,
            redecisions,
        }
    }

    /// The value of the series `series` (name and labels as rendered), if present.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    fn rendered(exposition: &Exposition, report: &CacheReport) -> String {
        exposition.cache_epoch_seconds.reset();
        exposition.cache_redecisions.reset();
        exposition.refresh_cache(&["ns", "p"], report);
        granary_telemetry::render(&exposition.registry())
    }

    #[test]
    fn the_cache_series_show_the_last_check_and_the_re_decisions() {
        let exposition = Exposition::new().expect("the metrics register");
        let seconds = |kind: &str| {
            format!("granary_cache_epoch_seconds{{kind=\"{kind}\",namespace=\"ns\",pipeline=\"p\"}}")
        };
        let redecisions = "granary_cache_redecisions_total{namespace=\"ns\",pipeline=\"p\"}";

        let text = rendered(&exposition, &report(Vec::new()));
        assert_eq!(sample(&text, &seconds("predicted")), None, "no epoch was checked yet:\n{text}");
        assert_eq!(sample(&text, &seconds("measured")), None, "{text}");
        assert_eq!(sample(&text, redecisions), Some(0.0), "{text}");
        let splits = "granary_cache_splits_total{namespace=\"ns\",outcome=\"written\",pipeline=\"p\"}";
        assert_eq!(sample(&text, splits), Some(3.0), "{text}");

        let checks = vec![check(0, 0.03, 0.09, "re-decided"), check(1, 0.05, 0.055, "within")];
        let text = rendered(&exposition, &report(checks));
        assert_eq!(sample(&text, &seconds("predicted")), Some(0.05), "the last check's:\n{text}");
        assert_eq!(sample(&text, &seconds("measured")), Some(0.055), "{text}");
        assert_eq!(sample(&text, redecisions), Some(1.0), "{text}");
        assert!(text.contains("# TYPE granary_cache_epoch_seconds gauge"), "{text}");
        assert!(text.contains("# TYPE granary_cache_redecisions_total counter"), "{text}");

        let never = CacheReport { store: None, policy: "never".into(), ..report(Vec::new()) };
        let text = rendered(&exposition, &never);
        assert_eq!(sample(&text, redecisions), None, "a pipeline without a store has none:\n{text}");
    }
}
