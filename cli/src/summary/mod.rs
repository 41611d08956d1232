//! The figures `granary run` reports: per epoch and for the run, printed as text or one JSON
//! line (`--json`). [`tally::Tally`] counts them as batches arrive, the same way for the engine
//! in this process and for the client reading from workers.

pub mod digest;
pub mod padding;
pub mod progress;
pub mod startup;
pub mod tally;

use serde::Serialize;

/// One epoch's figures.
#[derive(Serialize, Debug, Clone)]
pub struct EpochSummary {
    /// Epoch, counted from 0.
    pub epoch: u32,
    /// Elements delivered.
    pub items: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Wall time of the epoch.
    pub seconds: f64,
    /// Digest of the epoch's elements, with `--digest` (see [`digest`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What the cache did in the epoch (`compute`, `write` or `read`), when the pipeline caches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Cache entry bytes read in the epoch, as stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_bytes_read: Option<u64>,
    /// Cache entry bytes written in the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_bytes_written: Option<u64>,
    /// The autocacher's predicted items/s for the epoch's kind (for a reading epoch,
    /// 1 / (read seconds per element + seconds per element of the stages after the cut)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_items_per_s: Option<f64>,
}

/// The run's figures (`--json`).
#[derive(Serialize, Debug, Clone)]
pub struct RunSummary {
    /// Pipeline name.
    pub pipeline: String,
    /// Elements delivered.
    pub items: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Tensor bytes delivered.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Elements per second.
    pub items_per_s: f64,
    /// Tensor megabytes (10^6) per second.
    pub mb_per_s: f64,
    /// Seconds from the command's start to the engine (`--workers 0`) or the local service
    /// being ready: reading the manifest, listing the source, planning, starting the dispatcher
    /// and the worker processes.
    pub startup_seconds: f64,
    /// Seconds from the command's start to the first batch; `None` when none arrived.
    pub first_batch_seconds: Option<f64>,
    /// Peak resident memory of this process (VmHWM), if known.
    pub peak_rss_bytes: Option<u64>,
    /// Compute threads used.
    pub threads: usize,
    /// Per-epoch figures.
    pub epochs: Vec<EpochSummary>,
    /// What the autoscaler did, when it sized the pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling: Option<granary_dispatcher::autoscaler::ScalingReport>,
    /// What the autocacher decided and did, when the pipeline caches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<granary_dispatcher::CacheReport>,
    /// With `spec.batch.pad`: pad cells over all cells of the padded fields, over the delivered
    /// batches (see [`padding`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub padding_fraction: Option<f64>,
    /// With `spec.errors.policy: skip`: elements a stage failed on that were dropped, as the
    /// dispatcher counted them (once per split and epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_elements: Option<u64>,
    /// The plan that ran, when the optimizer rewrote the stages (see `granary plan`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSummary>,
}

/// The plan a run ran, when it differs from the stages as written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanSummary {
    /// The stages in the order they ran, each `spec.stages[i] name` by its place as written.
    pub stages: Vec<String>,
    /// The fields the source read, when not all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_fields: Option<Vec<String>>,
    /// How many rewrites made the plan.
    pub rewrites: usize,
}

impl EpochSummary {
    /// An epoch with nothing delivered yet.
    pub fn new(epoch: u32) -> EpochSummary {
        EpochSummary {
            epoch,
            items: 0,
            batches: 0,
            seconds: 0.0,
            digest: None,
            cache: None,
            cache_bytes_read: None,
            cache_bytes_written: None,
            predicted_items_per_s: None,
        }
    }
}

impl RunSummary {
    /// A run with nothing delivered yet.
    pub fn new(pipeline: String, threads: usize) -> RunSummary {
        RunSummary {
            pipeline,
            items: 0,
            batches: 0,
            bytes: 0,
            seconds: 0.0,
            items_per_s: 0.0,
            mb_per_s: 0.0,
            startup_seconds: 0.0,
            first_batch_seconds: None,
            peak_rss_bytes: None,
            threads,
            epochs: Vec::new(),
            scaling: None,
            cache: None,
            padding_fraction: None,
            skipped_elements: None,
            plan: None,
        }
    }

    /// Adds what the autocacher did to the epochs (and the report itself).
    pub fn with_cache(mut self, report: Option<granary_dispatcher::CacheReport>) -> RunSummary {
        let Some(report) = report else { return self };
        for epoch in &mut self.epochs {
            if let Some(c) = report.epochs.iter().find(|c| c.epoch == epoch.epoch) {
                epoch.cache = Some(c.mode.clone());
                epoch.cache_bytes_read = Some(c.bytes_read);
                epoch.cache_bytes_written = Some(c.bytes_written);
                epoch.predicted_items_per_s = c.predicted_items_per_s;
            }
        }
        self.cache = Some(report);
        self
    }

    /// Adds the plan the optimizer made of `spec` (the same every process running it derives),
    /// when it rewrote anything.
    pub fn with_plan(mut self, spec: &granary_crds::InputPipelineSpec) -> RunSummary {
        self.plan = granary_optimizer::optimize(spec).in_effect(spec).map(|p| PlanSummary {
            rewrites: p.rewrites.len(),
            stages: p.stages,
            source_fields: p.source_fields,
        });
        self
    }

    /// Adds the elements skipped under `spec.errors.policy: skip` (`None` when the pipeline does
    /// not skip).
    pub fn with_skipped(mut self, skipped: Option<u64>) -> RunSummary {
        self.skipped_elements = skipped;
        self
    }

    /// Sets the wall time and the rates derived from it, and the peak RSS.
    pub fn finish(&mut self, seconds: f64) {
        self.seconds = seconds;
        let secs = seconds.max(1e-9);
        self.items_per_s = self.items as f64 / secs;
        self.mb_per_s = self.bytes as f64 / secs / 1e6;
        self.peak_rss_bytes = peak_rss();
    }
}

/// Peak resident set size of this process (VmHWM), on Linux.
pub fn peak_rss() -> Option<u64> {
    peak_rss_of(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// `VmHWM` of a `/proc/PID/status` text, in bytes (the kernel writes it in kB).
pub fn peak_rss_of(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Prints the human summary.
pub fn print_summary(s: &RunSummary) {
    println!(
        "{}: {} items in {} batches, {:.2} s: {:.0} items/s, {:.1} MB/s ({} threads{})",
        s.pipeline,
        s.items,
        s.batches,
        s.seconds,
        s.items_per_s,
        s.mb_per_s,
        s.threads,
        s.peak_rss_bytes.map(|b| format!(", peak RSS {} MiB", b >> 20)).unwrap_or_default()
    );
    if let Some(first) = s.first_batch_seconds {
        println!("  first batch {first:.2} s after the start ({:.2} s to start up)", s.startup_seconds);
    }
    for e in &s.epochs {
        let cache = match (&e.cache, e.predicted_items_per_s) {
            (Some(mode), predicted) => format!(
                ", cache {mode} ({:.1} MB read, {:.1} MB written{})",
                e.cache_bytes_read.unwrap_or(0) as f64 / 1e6,
                e.cache_bytes_written.unwrap_or(0) as f64 / 1e6,
                predicted.map(|p| format!(", {p:.0} items/s predicted")).unwrap_or_default()
            ),
            (None, _) => String::new(),
        };
        println!(
            "  epoch {}: {} items, {} batches, {:.2} s{}{cache}",
            e.epoch,
            e.items,
            e.batches,
            e.seconds,
            e.digest.as_ref().map(|d| format!(", digest {d}")).unwrap_or_default()
        );
    }
    if let Some(plan) = &s.plan {
        println!(
            "  plan: {} rewrite{}: {}{} (granary plan FILE explains)",
            plan.rewrites,
            if plan.rewrites == 1 { "" } else { "s" },
            plan.stages.join(" → "),
            plan.source_fields
                .as_ref()
                .map(|f| format!("; the source read {}", f.join(", ")))
                .unwrap_or_default()
        );
    }
    if let Some(skipped) = s.skipped_elements {
        println!(
            "  skipped: {skipped} elements a stage failed on (spec.errors.policy: skip; see the workers' logs)"
        );
    }
    if let Some(decision) = s.cache.as_ref().and_then(|c| c.decision.as_ref()) {
        println!("  autocacher: {}", decision.reason);
    }
    if let Some(scaling) = &s.scaling {
        println!(
            "  autoscaler: {} workers at the end, {:.0} worker-seconds, {} changes",
            scaling.desired,
            scaling.worker_seconds,
            scaling.decisions.len()
        );
        for d in &scaling.decisions {
            println!("    {:>6.1} s: {} → {} workers: {}", d.at_s, d.from, d.to, d.reason);
        }
    }
}
