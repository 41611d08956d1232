//! `granary run`: the in-process engine with a progress bar and a summary.

use anyhow::Context;
use granary_crds::load_manifest;
use granary_worker::{Batch, Engine, EngineOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `granary run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// InputPipeline manifest.
    pub file: PathBuf,
    /// Number of epochs (overrides spec.epochs).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Stop after this many batches in all.
    #[arg(long)]
    pub limit_batches: Option<u64>,
    /// Compute threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory budget for data in flight, in bytes or with a suffix (`512Mi`, `2Gi`).
    #[arg(long, default_value = "512Mi")]
    pub prefetch_bytes: String,
    /// Print one JSON summary line on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Also compute a digest of every epoch's batches (keys and tensor bytes), to compare runs.
    #[arg(long)]
    pub digest: bool,
    /// Override a manifest field, e.g. `--set spec.batch.size=64` (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// Worker processes of the local service (dispatcher in this process), a fixed count; 0 runs
    /// the engine in this process instead. Default: as `spec.scaling` says. With `policy: auto`
    /// (the default) the autoscaler sizes the pool between `minWorkers` and `maxWorkers` (here
    /// at most the number of cores unless the spec sets it); with `fixed`, `replicas`.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Most worker processes the autoscaler may run here (default: `spec.scaling.maxWorkers`,
    /// at most the number of cores). Raise it for pipelines that wait on I/O rather than compute.
    #[arg(long, conflicts_with = "workers")]
    pub max_workers: Option<u32>,
    /// Seconds between autoscaling evaluations.
    #[arg(long, default_value_t = 5.0)]
    pub policy_period: f64,
    /// Serve the dispatcher API at ADDR for external clients instead of consuming; prints
    /// `{"dispatcher":"HOST:PORT","pipeline":NAME}` once ready and runs until SIGTERM.
    #[arg(long, value_name = "ADDR")]
    pub serve: Option<std::net::SocketAddr>,
    /// With `--serve`: exit once every consumer of every job delivered all epochs.
    #[arg(long, requires = "serve")]
    pub exit_when_done: bool,
    /// With workers: apply a final `float32` `image.normalize` on the workers and send `float32`
    /// over the wire, instead of `uint8` that the client finishes (the default; same values).
    #[arg(long)]
    pub normalize_on_worker: bool,
    /// Serve the dispatcher's Prometheus metrics at `GET /metrics` on ADDR (needs the local
    /// service: `--workers` of 1 or more, or `--serve`).
    #[arg(long, env = "GRANARY_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where the dispatcher journals its state (a local path or an object-store URL).
    #[arg(long, value_name = "URL")]
    pub journal: Option<String>,
    /// Store-wide budget of the cache store(s) in use, in bytes or with a suffix (`20Gi`): the
    /// least recently used entries not in use are evicted beyond it.
    #[arg(long, value_name = "BYTES")]
    pub cache_max_bytes: Option<String>,
}

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
    /// Digest of the epoch's batches, with `--digest`.
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
            peak_rss_bytes: None,
            threads,
            epochs: Vec::new(),
            scaling: None,
            cache: None,
        }
    }

    /// Counts a delivered batch of epoch `epoch` (of `epochs`) and shows the running rates since
    /// `start` on `bar`.
    pub fn record_batch(
        &mut self,
        bar: &ProgressBar,
        epoch: u32,
        epochs: u32,
        items: u64,
        bytes: u64,
        start: Instant,
    ) {
        self.items += items;
        self.batches += 1;
        self.bytes += bytes;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        bar.set_position(self.batches);
        bar.set_message(format!(
            "epoch {}/{epochs} · {:.0} items/s · {:.0} MB/s",
            epoch + 1,
            self.items as f64 / secs,
            self.bytes as f64 / secs / 1e6
        ));
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

    /// Sets the wall time and the rates derived from it, and the peak RSS.
    pub fn finish(&mut self, seconds: f64) {
        self.seconds = seconds;
        let secs = seconds.max(1e-9);
        self.items_per_s = self.items as f64 / secs;
        self.mb_per_s = self.bytes as f64 / secs / 1e6;
        self.peak_rss_bytes = peak_rss();
    }
}

/// Loads a manifest with `--set` overrides; when it is invalid, prints every problem to stderr
/// and returns `None` (exit code 2).
pub fn load_or_report(file: &Path, set: &[String]) -> Option<granary_crds::Manifest> {
    match load_manifest(file, set) {
        Ok(m) => Some(m),
        Err(problems) => {
            eprintln!("{}: invalid ({} problems)", file.display(), problems.0.len());
            for p in &problems.0 {
                eprintln!("{p}");
            }
            None
        }
    }
}

/// Engine options from `--threads` and `--prefetch-bytes`.
pub fn engine_options(threads: Option<usize>, prefetch_bytes: &str) -> anyhow::Result<EngineOptions> {
    let mut options = EngineOptions::default();
    if let Some(t) = threads {
        anyhow::ensure!(t > 0, "--threads must be at least 1");
        options.threads = t;
    }
    options.prefetch_bytes = granary_crds::quantity::parse_bytes(prefetch_bytes)
        .map_err(|e| anyhow::anyhow!("--prefetch-bytes: {e}"))? as usize;
    Ok(options)
}

/// Runs `granary run`.
pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let mut set = args.set.clone();
    if let Some(epochs) = args.epochs {
        set.push(format!("spec.epochs={epochs}"));
    }
    let Some(manifest) = load_or_report(&args.file, &set) else {
        return Ok(ExitCode::from(2));
    };
    if args.serve.is_some() {
        return crate::local::serve(&manifest, args);
    }
    if args.workers == Some(0) && args.serve.is_none() && args.metrics_addr.is_some() {
        anyhow::bail!(
            "--metrics-addr (or GRANARY_METRICS_ADDR) serves the dispatcher's metrics, and --workers 0 runs \
             without one: use --workers 1 or more, or --serve, or unset it"
        );
    }
    let summary =
        if args.workers == Some(0) { execute(&manifest, args)? } else { crate::local::run(&manifest, args)? };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a loaded manifest with the options of `args` and returns the figures.
pub fn execute(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<RunSummary> {
    let options = engine_options(args.threads, &args.prefetch_bytes)?;
    let engine = Engine::open(manifest, options)?;
    let epochs = args.epochs.unwrap_or(engine.spec().epochs);
    let name = manifest.pipeline.metadata.name.clone().unwrap_or_default();
    let bar = progress_bar(args.json);
    let limit = args.limit_batches.unwrap_or(u64::MAX);
    let start = Instant::now();
    let mut summary = RunSummary::new(name, options.threads);
    // Every epoch has a summary, even one without batches; `seconds` runs from the end of the
    // previous epoch's last batch to the end of this one's.
    let open = EpochSummary::new;
    let mut current = open(0);
    let mut hasher = args.digest.then(DefaultHasher::new);
    let mut epoch_start = Instant::now();
    let close = |e: &mut EpochSummary, hasher: &mut Option<DefaultHasher>, since: &mut Instant| {
        e.seconds = since.elapsed().as_secs_f64();
        e.digest = hasher.replace(DefaultHasher::new()).map(|h| format!("{:016x}", h.finish()));
        *since = Instant::now();
    };
    if epochs > 0 {
        for batch in engine.run_epochs(0..epochs) {
            let batch = batch.with_context(|| format!("epoch {}", current.epoch))?;
            while batch.epoch > current.epoch {
                close(&mut current, &mut hasher, &mut epoch_start);
                let next = open(current.epoch + 1);
                summary.epochs.push(std::mem::replace(&mut current, next));
            }
            if let Some(h) = hasher.as_mut() {
                hash_batch(&batch, h);
            }
            current.items += batch.len() as u64;
            current.batches += 1;
            summary.record_batch(
                &bar,
                current.epoch,
                epochs,
                batch.len() as u64,
                batch.nbytes() as u64,
                start,
            );
            if summary.batches >= limit {
                break;
            }
        }
        close(&mut current, &mut hasher, &mut epoch_start);
        let last = current.epoch;
        summary.epochs.push(current);
        if summary.batches < limit {
            for epoch in last + 1..epochs {
                let mut e = open(epoch);
                close(&mut e, &mut hasher, &mut epoch_start);
                summary.epochs.push(e);
            }
        }
    }
    bar.finish_and_clear();
    summary.finish(start.elapsed().as_secs_f64());
    Ok(summary)
}

fn hash_batch(batch: &Batch, h: &mut DefaultHasher) {
    batch.keys.hash(h);
    for t in &batch.tensors {
        t.name.hash(h);
        t.dtype.name().hash(h);
        t.shape.hash(h);
        t.data.hash(h);
    }
}

/// A spinner with the batch count, hidden when `quiet`.
pub fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {pos} batches · {elapsed} · {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Peak resident set size of this process (VmHWM), on Linux.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
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
