//! `granary bench`: steady-state throughput of a pipeline, with the same-run ratios that make
//! a figure comparable across machines: against a straightforward baseline (every image stage
//! on its own, full-size decode) and against the decode-only limit of the fast path. With
//! `--workers N` it measures the served path instead: the local service read by one client over
//! loopback, against the in-process engine; with `--tls` as well, plaintext against TLS; with
//! `--trainers N`, one trainer against N reading at once.

mod handshake;
mod optimizer;
mod proc_tree;
mod served;
mod trainers;

use crate::args::engine_options;
use crate::commands::run::load_or_report;
use crate::summary::padding::PaddingTally;
use anyhow::Context;
use granary_crds::{Manifest, OpConfig};
use granary_worker::{Engine, EngineOptions, ImagePath};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `granary bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// InputPipeline manifest.
    pub file: PathBuf,
    /// Batches pulled before the clock starts (pipeline fill, thread start-up).
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Batches timed.
    #[arg(long, default_value_t = 30)]
    pub batches: u64,
    /// Print one JSON line (the peer benchmarks' format) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compute threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory budget for data in flight (`auto`: as `granary run`'s).
    #[arg(long, default_value = "auto")]
    pub prefetch_bytes: String,
    #[command(flatten)]
    pub python: crate::args::PythonArg,
    /// Measure the fast path only, without the baseline and decode-only runs.
    #[arg(long)]
    pub fast_only: bool,
    /// Rounds of the in-process comparison: the fast path, the baseline and the decode-only
    /// limit measured in turn this many times, each on a freshly opened engine, and the median
    /// round of each reported, so that a change in the machine's load weighs on all three
    /// (in process only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=15),
          conflicts_with_all = ["fast_only", "workers"])]
    pub rounds: u32,
    /// Measure the pipeline with the optimizer off (`spec.optimize: false`) as well, in
    /// alternating rounds with it on, and report the ratio of the medians (in process only).
    #[arg(long, conflicts_with = "workers")]
    pub compare_optimizer: bool,
    /// Serve the pipeline from this many local worker processes and read it over loopback gRPC,
    /// and compare with the in-process engine (0: the in-process engine and its baselines only).
    #[arg(long, default_value_t = 0)]
    pub workers: u32,
    /// With `--workers`: apply a final `float32` `image.normalize` on the workers and send
    /// `float32` over the wire, instead of `uint8` finished by the client (the default).
    #[arg(long, requires = "workers")]
    pub normalize_on_worker: bool,
    /// With `--workers`: where the images of the pipeline's fused image run are made (`auto`,
    /// `client` or `workers`; see `granary run --images`).
    #[arg(long, value_enum, value_name = "WHERE", requires = "workers")]
    pub images: Option<crate::args::Images>,
    /// With `--workers`: measure the served path both plaintext and with TLS and
    /// authentication (as `granary run --serve --tls`), in alternating rounds, and report the
    /// ratio, the handshake time and the CPU cost per GB of each.
    #[arg(long, requires = "workers")]
    pub tls: bool,
    /// With `--workers`: also read the served pipeline with this many trainers at once
    /// (consumers `0..N` of one job, each with its share of every epoch), in rounds alternating
    /// with one trainer, and report their aggregate throughput against one trainer's and the
    /// wait of their `next()` calls.
    #[arg(long, requires = "workers", conflicts_with = "tls", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub trainers: u32,
    /// With `--workers`: after each served round's timed batches, its trainers stop reading for
    /// this many seconds with their clients open (a long checkpoint); the workers' peak memory
    /// covers the stall.
    #[arg(long, requires = "workers", default_value_t = 0.0, value_parser = stall_seconds)]
    pub stall_seconds: f64,
    /// With `--workers`: each trainer spends this many milliseconds on a step after every batch
    /// (a sleep, as a trainer's thread waits on its accelerator), so that a pipeline that keeps
    /// up shows what the client costs the trainer: the report gives the rate against the
    /// steps' own bound (`vs_step_bound`), the wait in `next()`, and how late the steps
    /// themselves ended (a trainer woken late by busy cores is not waiting on the client).
    #[arg(long, requires = "workers", default_value_t = 0.0, value_parser = step_ms)]
    pub step_ms: f64,
    /// With `--workers`: every this many batches, a trainer's step lasts `--pause-ms` longer
    /// (a checkpoint or an evaluation pass), while the client and the workers may work ahead.
    /// The steps' bound counts the pauses.
    #[arg(long, requires = "pause_ms", requires = "workers", default_value_t = 0)]
    pub pause_every: u64,
    /// With `--pause-every`: milliseconds those steps last longer.
    #[arg(long, requires = "pause_every", default_value_t = 0.0, value_parser = step_ms)]
    pub pause_ms: f64,
    /// With `--workers`: the memory each trainer's client may hold in complete batches ahead of
    /// it, within which it tunes how many (e.g. `2Gi`; `0` keeps 4 batches). Default: the
    /// client's, 1 GiB.
    #[arg(long, requires = "workers", value_parser = byte_count)]
    pub client_prefetch_bytes: Option<u64>,
    /// `config` label of the JSON line (default: the output dtype, `-wds` for tar shards).
    #[arg(long)]
    pub config: Option<String>,
    /// `pipeline` label of the JSON line (default: the manifest's name).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Override a manifest field, e.g. `--set spec.batch.size=64` (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
}

/// The round with the median throughput (the higher of the two middle ones for an even
/// count); `rounds` is not empty.
fn median(mut rounds: Vec<Measurement>) -> Measurement {
    rounds.sort_by(|a, b| a.items_per_s.total_cmp(&b.items_per_s));
    rounds[rounds.len() / 2]
}

/// One timed run.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct Measurement {
    /// Items in the timed batches.
    pub items: u64,
    /// Seconds the timed batches took.
    pub seconds: f64,
    /// `items / seconds`.
    pub items_per_s: f64,
    /// Seconds until the first batch arrived (start-up and pipeline fill).
    pub first_batch_seconds: f64,
    /// With `spec.batch.pad`: pad cells over all cells of the padded fields in the timed
    /// batches.
    pub padding_fraction: Option<f64>,
}

/// The JSON line: the peer benchmarks' keys first, then Granary's ratios.
#[derive(Serialize, Debug)]
struct Report {
    system: &'static str,
    pipeline: String,
    config: String,
    items_per_s: f64,
    cores: usize,
    batches: u64,
    items: u64,
    seconds: f64,
    loadavg_1m: Option<f64>,
    threads: usize,
    batch_size: usize,
    first_batch_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    padding_fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transport: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_workers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mb_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wire_mb_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_s_per_gb: Option<f64>,
    /// The workers' share of `cpu_s_per_gb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_cpu_s_per_gb: Option<f64>,
    /// Median and 99th percentile of the trainer's `next()` wait, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_wait_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_wait_p99_ms: Option<f64>,
    /// The largest peak resident set of a worker process, and that over its compute threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_peak_rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_peak_rss_bytes_per_core: Option<u64>,
    /// `--stall-seconds`, when the trainers stalled after each round.
    #[serde(skip_serializing_if = "Option::is_none")]
    stall_seconds: Option<f64>,
    /// `--step-ms`, when the trainers took a step after each batch, and the trainer's batches
    /// a second over the steps' own bound (one batch every `step_ms`; counted in batches, not
    /// rows, because a step takes one batch however short: an epoch's last one).
    #[serde(skip_serializing_if = "Option::is_none")]
    step_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_step_bound: Option<f64>,
    /// With `step_ms`: the mean milliseconds each step ran past `step_ms` (the trainer was woken
    /// late, not the client's doing) and the mean wait in `next()`, which together make the gap
    /// to the bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    step_overrun_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_wait_mean_ms: Option<f64>,
    /// `--pause-every` and `--pause-ms`, when the trainers paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pause_every: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pause_ms: Option<f64>,
    /// `--client-prefetch-bytes`, when given, and the deepest prefetch a trainer's client had
    /// tuned to at the end of a round.
    #[serde(skip_serializing_if = "Option::is_none")]
    client_prefetch_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_prefetch_batches: Option<u32>,
    #[serde(flatten)]
    tls: Option<TlsReport>,
    #[serde(flatten)]
    trainers: Option<TrainersReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    in_process_items_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_in_process: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline_items_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_baseline: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_only_items_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_decode_only: Option<f64>,
    /// Rounds of the fast path, baseline and decode-only comparison (their medians above).
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds: Option<u32>,
    /// How many rewrites the optimizer made (`granary plan` lists them).
    rewrites: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    unoptimized_items_per_s: Option<f64>,
    /// The optimizer on over off, medians of alternating rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_unoptimized: Option<f64>,
}

/// The `--tls` fields of the JSON line: the headline served figures are the plaintext rounds'.
#[derive(Serialize, Debug)]
struct TlsReport {
    tls_items_per_s: f64,
    /// TLS throughput over plaintext throughput.
    tls_vs_plain: f64,
    tls_mb_per_s: f64,
    tls_cpu_s_per_gb: Option<f64>,
    /// CPU seconds per delivered GB that TLS adds.
    tls_extra_cpu_s_per_gb: Option<f64>,
    /// Median milliseconds to open a plaintext channel to the dispatcher.
    plain_connect_ms: f64,
    /// Median milliseconds to open a TLS channel to the dispatcher, handshake included.
    tls_handshake_ms: f64,
    /// The same to a worker.
    tls_worker_handshake_ms: Option<f64>,
}

impl TlsReport {
    fn of(c: &served::TlsComparison) -> TlsReport {
        TlsReport {
            tls_items_per_s: round2(c.tls.measurement.items_per_s),
            tls_vs_plain: round3(c.tls.measurement.items_per_s / c.plain.measurement.items_per_s),
            tls_mb_per_s: round2(c.tls.mb_per_s),
            tls_cpu_s_per_gb: c.tls.cpu_s_per_gb.map(round3),
            tls_extra_cpu_s_per_gb: c.tls.cpu_s_per_gb.zip(c.plain.cpu_s_per_gb).map(|(t, p)| round3(t - p)),
            plain_connect_ms: round3(c.plain_connect_ms),
            tls_handshake_ms: round3(c.dispatcher_handshake_ms),
            tls_worker_handshake_ms: c.worker_handshake_ms.map(round3),
        }
    }
}

/// The `--trainers` fields of the JSON line: the headline served figures are one trainer's.
#[derive(Serialize, Debug)]
struct TrainersReport {
    trainers: u32,
    /// Their aggregate throughput.
    trainers_items_per_s: f64,
    /// Aggregate over one trainer's throughput.
    trainers_vs_one: f64,
    trainers_mb_per_s: f64,
    trainers_next_wait_p50_ms: Option<f64>,
    trainers_next_wait_p99_ms: Option<f64>,
    trainers_worker_cpu_s_per_gb: Option<f64>,
}

impl TrainersReport {
    fn of(c: &served::TrainersComparison) -> TrainersReport {
        let many = &c.many;
        TrainersReport {
            trainers: c.trainers,
            trainers_items_per_s: round2(many.measurement.items_per_s),
            trainers_vs_one: round3(many.measurement.items_per_s / c.one.measurement.items_per_s),
            trainers_mb_per_s: round2(many.mb_per_s),
            trainers_next_wait_p50_ms: many.next_wait_p50_ms.map(round3),
            trainers_next_wait_p99_ms: many.next_wait_p99_ms.map(round3),
            trainers_worker_cpu_s_per_gb: many.worker_cpu_s_per_gb.map(round3),
        }
    }
}

/// Runs `granary bench`.
pub fn bench(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let Some(manifest) = load_or_report(&args.file, &args.set) else {
        return Ok(crate::exit::code(crate::exit::INVALID_INPUT));
    };
    if args.batches == 0 {
        return Err(crate::exit::InvalidInput("--batches must be at least 1".to_string()).into());
    }
    crate::commands::run::refuse_mixing_in_process(
        &manifest,
        "granary bench measures the engine in process",
    )?;
    let options = engine_options(args.threads, &args.prefetch_bytes, args.python.path.as_deref())?;

    let fast_engine = Engine::open(&manifest, options.clone())?;
    let fused = fast_engine.stages().iter().any(|(path, _)| path.contains(".."));
    let batch_size = fast_engine.spec().batch.size as usize;
    let rewrites = fast_engine.optimized().rewrites.len();
    if !args.json {
        eprintln!(
            "{} · {} threads · batch {batch_size} · {} warm-up + {} timed batches",
            args.file.display(),
            options.threads,
            args.warmup,
            args.batches
        );
        for (path, name) in fast_engine.stages() {
            eprintln!("  {path}: {name}");
        }
    }
    let (fast, unoptimized) = if args.compare_optimizer {
        drop(fast_engine);
        let (on, off) = optimizer::compare(&manifest, &options, |engine| measure(engine, &manifest, args))?;
        (on, Some(off))
    } else {
        let fast = measure(&fast_engine, &manifest, args).context("fast path")?;
        drop(fast_engine);
        (fast, None)
    };
    let comparison = match args.workers {
        n if n > 0 && args.tls => Some(served::compare_tls(&manifest, args, n).context("served")?),
        _ => None,
    };
    let many = match args.workers {
        n if n > 0 && args.trainers > 1 => {
            Some(served::compare_trainers(&manifest, args, n, args.trainers).context("served")?)
        }
        _ => None,
    };
    let served = match (args.workers, &comparison, &many) {
        (_, Some(c), _) => Some(c.plain),
        (_, _, Some(m)) => Some(m.one),
        (0, None, None) => None,
        (n, None, None) => Some(served::measure(&manifest, args, n).context("served")?),
    };
    let mut baseline = None;
    let mut limit = None;
    let mut fast = fast;
    if fused && !args.fast_only && served.is_none() {
        let side = |image_path: ImagePath, what: &str, round: u32| -> anyhow::Result<Measurement> {
            let engine = Engine::open(&manifest, EngineOptions { image_path, ..options.clone() })?;
            measure(&engine, &manifest, args).with_context(|| format!("{what}, round {round}"))
        };
        // The fast path's first round is the one measured above; with the optimizer compared,
        // that is already the median of its own rounds.
        let mut fast_rounds = vec![fast];
        let (mut baselines, mut limits) = (Vec::new(), Vec::new());
        for round in 1..=args.rounds {
            if round > 1 && unoptimized.is_none() {
                fast_rounds.push(side(options.image_path, "fast path", round)?);
            }
            baselines.push(side(ImagePath::Separate, "baseline", round)?);
            limits.push(side(ImagePath::DecodeOnly, "decode-only", round)?);
        }
        fast = median(fast_rounds);
        baseline = Some(median(baselines));
        limit = Some(median(limits));
    }
    let headline = served.map_or(fast, |s| s.measurement);
    // The trainers took steps (and maybe pauses): the report sets them against their bound.
    let stepped = mean_step_ms(args) > 0.0;
    let report = Report {
        system: "granary",
        pipeline: args
            .pipeline
            .clone()
            .unwrap_or_else(|| manifest.pipeline.metadata.name.clone().unwrap_or_default()),
        config: args.config.clone().unwrap_or_else(|| config_label(&manifest)),
        items_per_s: round2(headline.items_per_s),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        batches: args.batches,
        items: headline.items,
        seconds: round3(headline.seconds),
        loadavg_1m: loadavg(),
        threads: options.threads,
        batch_size,
        first_batch_seconds: round3(headline.first_batch_seconds),
        padding_fraction: headline.padding_fraction,
        transport: served.map(|_| "grpc-loopback"),
        service_workers: served.map(|_| args.workers),
        mb_per_s: served.map(|s| round2(s.mb_per_s)),
        wire_mb_per_s: served.map(|s| round2(s.wire_mb_per_s)),
        cpu_s_per_gb: served.and_then(|s| s.cpu_s_per_gb).map(round3),
        worker_cpu_s_per_gb: served.and_then(|s| s.worker_cpu_s_per_gb).map(round3),
        next_wait_p50_ms: served.and_then(|s| s.next_wait_p50_ms).map(round3),
        next_wait_p99_ms: served.and_then(|s| s.next_wait_p99_ms).map(round3),
        worker_peak_rss_bytes: served.and_then(|s| s.worker_peak_rss_bytes),
        worker_peak_rss_bytes_per_core: served
            .and_then(|s| s.worker_peak_rss_bytes.map(|b| b / s.worker_threads.max(1) as u64)),
        stall_seconds: served.and(Some(args.stall_seconds)).filter(|s| *s > 0.0),
        step_ms: served.and(Some(args.step_ms)).filter(|s| *s > 0.0),
        vs_step_bound: served.filter(|_| stepped).map(|s| round3(s.batches_per_s / step_bound(args))),
        step_overrun_ms: served.filter(|_| stepped).and_then(|s| s.step_overrun_ms).map(round3),
        next_wait_mean_ms: served.filter(|_| stepped).and_then(|s| s.next_wait_mean_ms).map(round3),
        pause_every: served.and(Some(args.pause_every)).filter(|p| *p > 0),
        pause_ms: served.and(Some(args.pause_ms)).filter(|_| args.pause_every > 0),
        client_prefetch_bytes: served.and(args.client_prefetch_bytes),
        client_prefetch_batches: served.and_then(|s| s.client_prefetch_batches),
        tls: comparison.as_ref().map(TlsReport::of),
        trainers: many.as_ref().map(TrainersReport::of),
        in_process_items_per_s: served.map(|_| round2(fast.items_per_s)),
        vs_in_process: served.map(|s| round3(s.measurement.items_per_s / fast.items_per_s)),
        baseline_items_per_s: baseline.map(|b| round2(b.items_per_s)),
        vs_baseline: baseline.map(|b| round3(fast.items_per_s / b.items_per_s)),
        decode_only_items_per_s: limit.map(|l| round2(l.items_per_s)),
        vs_decode_only: limit.map(|l| round3(fast.items_per_s / l.items_per_s)),
        rounds: limit.map(|_| args.rounds),
        rewrites,
        unoptimized_items_per_s: unoptimized.map(|u| round2(u.items_per_s)),
        vs_unoptimized: unoptimized.map(|u| round3(fast.items_per_s / u.items_per_s)),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let label = if served.is_some() { "in process" } else { "fast path" };
        println!("{label:<13} {:>9.1} items/s", fast.items_per_s);
        if let Some(s) = served {
            println!(
                "served        {:>9.1} items/s   {:.0} MB/s delivered, {:.0} MB/s on the wire, from {} \
                 worker(s) over loopback = {:.2}× in process",
                s.measurement.items_per_s,
                s.mb_per_s,
                s.wire_mb_per_s,
                args.workers,
                s.measurement.items_per_s / fast.items_per_s
            );
            print_served_costs(&s);
            if args.stall_seconds > 0.0 {
                println!(
                    "              (the trainers stalled {:.1} s after each round, their clients open)",
                    args.stall_seconds
                );
            }
            if stepped {
                let bound = step_bound(args);
                let pauses = if args.pause_every > 0 {
                    format!(", {} ms longer every {} batches,", args.pause_ms, args.pause_every)
                } else {
                    String::new()
                };
                println!(
                    "              {:>9.3} of the {bound:.2} batches/s that {} ms steps{pauses} allow",
                    s.batches_per_s / bound,
                    args.step_ms
                );
                if let (Some(late), Some(wait)) = (s.step_overrun_ms, s.next_wait_mean_ms) {
                    println!(
                        "              {late:>9.2} ms a step ran late on average (the trainer woken late), \
                         {wait:.2} ms a next() waited"
                    );
                }
            }
        }
        if let Some(c) = &comparison {
            print_tls(c);
        }
        if let Some(m) = &many {
            print_trainers(m);
        }
        if let Some(u) = unoptimized {
            println!(
                "optimizer off {:>9.1} items/s   optimizer on = {:.2}× off (medians of {} alternating rounds each)",
                u.items_per_s,
                fast.items_per_s / u.items_per_s,
                optimizer::ROUNDS
            );
        }
        if let Some(b) = baseline {
            println!(
                "baseline      {:>9.1} items/s   fast path = {:.2}× the baseline (full-size decode, one pass per stage)",
                b.items_per_s,
                fast.items_per_s / b.items_per_s
            );
        }
        if let Some(l) = limit {
            println!(
                "decode only   {:>9.1} items/s   fast path = {:.2} of the decode limit (the crop windows decoded, nothing else)",
                l.items_per_s,
                fast.items_per_s / l.items_per_s
            );
        }
        if limit.is_some() && args.rounds > 1 {
            println!("              (medians of {} rounds of each, in turn)", args.rounds);
        }
        if !fused && served.is_none() {
            println!("(no fusable image stages: there is no separate baseline to compare with)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Milliseconds a trainer's step takes on average: `--step-ms`, and the pauses spread over the
/// batches between them.
fn mean_step_ms(args: &BenchArgs) -> f64 {
    let pauses = if args.pause_every > 0 { args.pause_ms / args.pause_every as f64 } else { 0.0 };
    args.step_ms + pauses
}

/// Batches a second a trainer whose steps take `mean_step_ms` on average reads at most.
fn step_bound(args: &BenchArgs) -> f64 {
    1e3 / mean_step_ms(args).max(1e-9)
}

/// Parses `--client-prefetch-bytes`: a byte count, e.g. `512Mi` or `2Gi`.
fn byte_count(text: &str) -> Result<u64, String> {
    granary_crds::quantity::parse_bytes(text)
}

/// Parses `--step-ms`: milliseconds, 0 (no step) to an hour.
fn step_ms(text: &str) -> Result<f64, String> {
    up_to(text, 3_600_000.0, "milliseconds", "40 or 12.5")
}

/// Parses `--stall-seconds`: seconds, 0 to an hour.
fn stall_seconds(text: &str) -> Result<f64, String> {
    up_to(text, 3600.0, "seconds", "5 or 0.5")
}

/// A finite number from 0 to `most` `unit`; the error names the unit and shows `example`.
fn up_to(text: &str, most: f64, unit: &str, example: &str) -> Result<f64, String> {
    let value: f64 = text.parse().map_err(|e| format!("{e}: give {unit}, e.g. {example}"))?;
    if value.is_finite() && (0.0..=most).contains(&value) {
        Ok(value)
    } else {
        Err(format!("give between 0 and {most} {unit}"))
    }
}

/// The CPU, wait and memory lines of a served measurement in the text report.
fn print_served_costs(s: &served::Served) {
    if let Some(cpu) = s.cpu_s_per_gb {
        let workers =
            s.worker_cpu_s_per_gb.map_or(String::new(), |w| format!(", {w:.2} of them the workers'"));
        println!("              {cpu:>9.2} CPU s per GB delivered (this process and the workers{workers})");
    }
    if let (Some(p50), Some(p99)) = (s.next_wait_p50_ms, s.next_wait_p99_ms) {
        println!("              {p50:>9.2} ms median wait in next(), {p99:.2} ms at the 99th percentile");
    }
    if let Some(rss) = s.worker_peak_rss_bytes {
        println!(
            "              {:>9.1} MiB peak resident memory of a worker",
            rss as f64 / f64::from(1 << 20)
        );
    }
}

/// The `--trainers` lines of the text report.
fn print_trainers(m: &served::TrainersComparison) {
    println!(
        "{:<13} {:>9.1} items/s   {:.0} MB/s delivered in all = {:.3}× one trainer ({} rounds each, alternated)",
        format!("{} trainers", m.trainers),
        m.many.measurement.items_per_s,
        m.many.mb_per_s,
        m.many.measurement.items_per_s / m.one.measurement.items_per_s,
        served::TRAINER_ROUNDS
    );
    print_served_costs(&m.many);
}

/// The `--tls` lines of the text report.
fn print_tls(c: &served::TlsComparison) {
    let t = &c.tls;
    println!(
        "served, TLS   {:>9.1} items/s   {:.0} MB/s delivered = {:.3}× plaintext ({} rounds each, alternated)",
        t.measurement.items_per_s,
        t.mb_per_s,
        t.measurement.items_per_s / c.plain.measurement.items_per_s,
        served::TLS_ROUNDS
    );
    if let (Some(tls), Some(plain)) = (t.cpu_s_per_gb, c.plain.cpu_s_per_gb) {
        println!("              {tls:>9.2} CPU s per GB delivered, {:+.2} s per GB for TLS", tls - plain);
    }
    let worker = c.worker_handshake_ms.map_or(String::new(), |w| format!(", to a worker {w:.2} ms"));
    println!(
        "handshake     {:>9.2} ms to the dispatcher over TLS{worker} (plaintext connect {:.2} ms)",
        c.dispatcher_handshake_ms, c.plain_connect_ms
    );
}

/// Pulls `warmup` batches, then times `batches` batches, running epochs back to back (in
/// chunks, so that no epoch boundary drains the pipeline) until enough have arrived.
fn measure(engine: &Engine, manifest: &Manifest, args: &BenchArgs) -> anyhow::Result<Measurement> {
    const EPOCHS_PER_RUN: u32 = 16;
    let start = Instant::now();
    let mut first_batch_seconds = None;
    let mut pulled = 0u64;
    let mut timed_start = None;
    let mut items = 0u64;
    let mut padding = PaddingTally::of(manifest);
    let total = args.warmup + args.batches;
    let mut first_epoch = 0u32;
    while pulled < total {
        let mut any = false;
        for batch in engine.run_epochs(first_epoch..first_epoch.saturating_add(EPOCHS_PER_RUN)) {
            let batch = batch?;
            any = true;
            first_batch_seconds.get_or_insert_with(|| start.elapsed().as_secs_f64());
            pulled += 1;
            if pulled == args.warmup {
                timed_start = Some(Instant::now());
            } else if pulled > args.warmup {
                items += batch.len() as u64;
                if let Some(p) = padding.as_mut() {
                    p.add(batch.tensors.iter().map(|t| (t.name.as_str(), &t.data[..])));
                }
            }
            if pulled == total {
                break;
            }
        }
        anyhow::ensure!(any, "the pipeline produced no batches: is the source empty?");
        first_epoch = first_epoch.saturating_add(EPOCHS_PER_RUN);
    }
    let timed_start = timed_start.unwrap_or(start);
    let seconds = timed_start.elapsed().as_secs_f64().max(1e-9);
    Ok(Measurement {
        items,
        seconds,
        items_per_s: items as f64 / seconds,
        first_batch_seconds: first_batch_seconds.unwrap_or(seconds),
        padding_fraction: padding.as_ref().and_then(PaddingTally::fraction),
    })
}

/// The output dtype of the last `image.normalize` stage (`uint8` without one), with `-wds`
/// when the source is tar shards: the labels the peer benchmarks use.
fn config_label(manifest: &Manifest) -> String {
    let spec = &manifest.pipeline.spec;
    let mut dtype = "uint8".to_string();
    for (i, stage) in spec.stages.iter().enumerate() {
        if let Ok(OpConfig::ImageNormalize(n)) = OpConfig::parse(stage, &format!("spec.stages[{i}]")) {
            dtype = serde_json::to_value(n.dtype)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or(dtype);
        }
    }
    if spec.first_source().is_some_and(|s| s.format == granary_crds::SourceFormat::Webdataset) {
        dtype.push_str("-wds");
    }
    dtype
}

fn loadavg() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok().map(round2)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
