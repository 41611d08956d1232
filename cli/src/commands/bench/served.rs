//! `granary bench --workers N`: the same pipeline served by the local service (dispatcher in
//! this process, N worker processes) and read by one client over loopback gRPC, timed like the
//! in-process run so the two figures are comparable. With `--tls` the served path is measured
//! twice in the same run, plaintext and TLS with authentication, in alternating rounds; with
//! `--trainers N`, read by one trainer and by N at once, in alternating rounds.

use super::{BenchArgs, Measurement, handshake, proc_tree, trainers};
use crate::local::{END_OF_RUN_GRACE, runtime, service};
use crate::summary::padding::PaddingTally;
use anyhow::Context;
use granary_client::ClientOptions;
use granary_crds::Manifest;

/// Rounds of each kind with `--tls`, alternated plaintext, TLS, plaintext, TLS… so that a drift
/// of the machine (heat, a neighbour's load) weighs on both alike.
pub const TLS_ROUNDS: u64 = 2;

/// A served run: the client's figures and the bytes it received.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// Items and time of the timed batches.
    pub measurement: Measurement,
    /// Batches per second delivered to the trainers while timed, all of them together.
    pub batches_per_s: f64,
    /// Tensor megabytes (10^6) per second delivered to the trainer while timed.
    pub mb_per_s: f64,
    /// Megabytes per second that crossed the wire while timed (less than `mb_per_s` when the
    /// client finishes a deferred `image.normalize`).
    pub wire_mb_per_s: f64,
    /// CPU seconds per gigabyte (10^9) delivered while timed: this process (dispatcher and
    /// client) and the worker processes, user and system time; `None` without `/proc`.
    pub cpu_s_per_gb: Option<f64>,
    /// The worker processes' share of `cpu_s_per_gb`.
    pub worker_cpu_s_per_gb: Option<f64>,
    /// Median milliseconds a trainer's `next()` waited while timed.
    pub next_wait_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub next_wait_p99_ms: Option<f64>,
    /// Mean of the same: with a step, what `next()` added to each step on average.
    pub next_wait_mean_ms: Option<f64>,
    /// With a step: mean milliseconds a trainer's step ran past its length while timed.
    pub step_overrun_ms: Option<f64>,
    /// The largest peak resident set of a worker process, in bytes, read at the end of each
    /// round; `None` without `/proc`.
    pub worker_peak_rss_bytes: Option<u64>,
    /// Compute threads of each worker process (one per core it is given).
    pub worker_threads: usize,
    /// The deepest prefetch (complete batches held ahead) a trainer's client had tuned to at the
    /// end of a round.
    pub client_prefetch_batches: Option<u32>,
}

/// The served path measured plaintext and with TLS in one run.
#[derive(Debug, Clone, Copy)]
pub struct TlsComparison {
    /// Plaintext rounds, summed.
    pub plain: Served,
    /// TLS rounds (with tokens and stream capabilities), summed.
    pub tls: Served,
    /// Median milliseconds to open a plaintext channel to the dispatcher (the TCP and HTTP/2
    /// part of a TLS connection).
    pub plain_connect_ms: f64,
    /// Median milliseconds to open a TLS channel to the dispatcher, handshake included.
    pub dispatcher_handshake_ms: f64,
    /// Median milliseconds to open a TLS channel to a worker, handshake included.
    pub worker_handshake_ms: Option<f64>,
}

/// Totals of timed batches, summed over rounds.
#[derive(Debug, Clone, Default)]
struct Totals {
    items: u64,
    batches: u64,
    seconds: f64,
    bytes: u64,
    wire: u64,
    cpu: proc_tree::CpuSeconds,
    /// A round had no CPU reading: the total is unknown.
    cpu_unknown: bool,
    waits_ms: Vec<f64>,
    overruns_ms: Vec<f64>,
    peak_rss: Option<u64>,
    worker_threads: usize,
    first_batch_seconds: Option<f64>,
    padding_fraction: Option<f64>,
    prefetch_batches: Option<u32>,
}

impl Totals {
    fn add(&mut self, round: Totals) {
        self.items += round.items;
        self.batches += round.batches;
        self.seconds += round.seconds;
        self.bytes += round.bytes;
        self.wire += round.wire;
        self.cpu.own += round.cpu.own;
        self.cpu.children += round.cpu.children;
        self.cpu_unknown |= round.cpu_unknown;
        self.waits_ms.extend(round.waits_ms);
        self.overruns_ms.extend(round.overruns_ms);
        self.peak_rss = self.peak_rss.max(round.peak_rss);
        self.worker_threads = self.worker_threads.max(round.worker_threads);
        self.first_batch_seconds = self.first_batch_seconds.or(round.first_batch_seconds);
        self.padding_fraction = self.padding_fraction.or(round.padding_fraction);
        self.prefetch_batches = self.prefetch_batches.max(round.prefetch_batches);
    }

    /// One round's totals: the trainers' window, and the workers' peak memory and threads.
    fn of(window: trainers::Window, peak_rss: Option<u64>, worker_threads: usize) -> Totals {
        Totals {
            items: window.items,
            batches: window.batches,
            seconds: window.seconds,
            bytes: window.bytes,
            wire: window.wire,
            cpu: window.cpu.unwrap_or_default(),
            cpu_unknown: window.cpu.is_none(),
            waits_ms: window.waits_ms,
            overruns_ms: window.overruns_ms,
            peak_rss,
            worker_threads,
            first_batch_seconds: window.first_batch_seconds,
            padding_fraction: window.padding_fraction,
            prefetch_batches: window.prefetch_batches,
        }
    }

    fn served(&self) -> Served {
        let seconds = self.seconds.max(1e-9);
        let gb = self.bytes as f64 / 1e9;
        let per_gb = |cpu: f64| (!self.cpu_unknown && gb > 0.0).then(|| cpu / gb);
        Served {
            measurement: Measurement {
                items: self.items,
                seconds,
                items_per_s: self.items as f64 / seconds,
                first_batch_seconds: self.first_batch_seconds.unwrap_or(seconds),
                padding_fraction: self.padding_fraction,
            },
            batches_per_s: self.batches as f64 / seconds,
            mb_per_s: self.bytes as f64 / seconds / 1e6,
            wire_mb_per_s: self.wire as f64 / seconds / 1e6,
            cpu_s_per_gb: per_gb(self.cpu.total()),
            worker_cpu_s_per_gb: per_gb(self.cpu.children),
            next_wait_p50_ms: trainers::quantile(&self.waits_ms, 0.5),
            next_wait_p99_ms: trainers::quantile(&self.waits_ms, 0.99),
            next_wait_mean_ms: mean(&self.waits_ms),
            step_overrun_ms: mean(&self.overruns_ms),
            worker_peak_rss_bytes: self.peak_rss,
            worker_threads: self.worker_threads,
            client_prefetch_batches: self.prefetch_batches,
        }
    }
}

/// The mean of `values`; `None` when empty.
fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Starts the local service with `workers` worker processes and times `args.batches` batches
/// after `args.warmup`, as one client of the pipeline sees them.
pub fn measure(manifest: &Manifest, args: &BenchArgs, workers: u32) -> anyhow::Result<Served> {
    let manifest = with_enough_epochs(manifest, args.warmup + args.batches);
    runtime()?.block_on(async {
        let (totals, _) =
            round(&manifest, args, Shape { workers, tls: false, trainers: 1 }, args.batches).await?;
        Ok(totals.served())
    })
}

/// Measures the served path plaintext and with TLS, [`TLS_ROUNDS`] rounds each, alternating;
/// each round starts its own service and times its share of `args.batches`.
pub fn compare_tls(manifest: &Manifest, args: &BenchArgs, workers: u32) -> anyhow::Result<TlsComparison> {
    let per_round = args.batches.div_ceil(TLS_ROUNDS).max(1);
    let manifest = with_enough_epochs(manifest, args.warmup + per_round);
    runtime()?.block_on(async {
        let (mut plain, mut tls) = (Totals::default(), Totals::default());
        let (mut plain_connect, mut handshakes) = (Vec::new(), Vec::new());
        for _ in 0..TLS_ROUNDS {
            let (totals, connect) =
                round(&manifest, args, Shape { workers, tls: false, trainers: 1 }, per_round)
                    .await
                    .context("plaintext")?;
            plain.add(totals);
            plain_connect.push(connect.dispatcher_ms);
            let (totals, connect) =
                round(&manifest, args, Shape { workers, tls: true, trainers: 1 }, per_round)
                    .await
                    .context("TLS")?;
            tls.add(totals);
            handshakes.push(connect);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let dispatcher: Vec<f64> = handshakes.iter().map(|h| h.dispatcher_ms).collect();
        let worker: Vec<f64> = handshakes.iter().filter_map(|h| h.worker_ms).collect();
        Ok(TlsComparison {
            plain: plain.served(),
            tls: tls.served(),
            plain_connect_ms: mean(&plain_connect),
            dispatcher_handshake_ms: mean(&dispatcher),
            worker_handshake_ms: (!worker.is_empty()).then(|| mean(&worker)),
        })
    })
}

/// The served path read by one trainer and by several at once, in alternating rounds.
#[derive(Debug, Clone, Copy)]
pub struct TrainersComparison {
    /// Trainers of the job in the other rounds.
    pub trainers: u32,
    /// One trainer, rounds summed.
    pub one: Served,
    /// `trainers` trainers, rounds summed: their aggregate.
    pub many: Served,
}

/// Measures the served path read by one trainer and by `trainers` (consumers `0..trainers` of
/// one job) at once, [`TRAINER_ROUNDS`] rounds each, alternating; each round starts its own
/// service and times its share of `args.batches`, pulled by its trainers together.
pub fn compare_trainers(
    manifest: &Manifest,
    args: &BenchArgs,
    workers: u32,
    trainers: u32,
) -> anyhow::Result<TrainersComparison> {
    let per_round = args.batches.div_ceil(TRAINER_ROUNDS).max(1);
    // A trainer may pull ahead while the others warm up: twice the epochs covers it.
    let manifest = with_enough_epochs(manifest, (args.warmup + per_round).saturating_mul(2));
    runtime()?.block_on(async {
        let (mut one, mut many) = (Totals::default(), Totals::default());
        for _ in 0..TRAINER_ROUNDS {
            let shape = Shape { workers, tls: false, trainers: 1 };
            one.add(round(&manifest, args, shape, per_round).await.context("one trainer")?.0);
            let shape = Shape { workers, tls: false, trainers };
            many.add(
                round(&manifest, args, shape, per_round)
                    .await
                    .with_context(|| format!("{trainers} trainers"))?
                    .0,
            );
        }
        Ok(TrainersComparison { trainers, one: one.served(), many: many.served() })
    })
}

/// Rounds of each kind with `--trainers`, alternated as [`TLS_ROUNDS`] are.
pub const TRAINER_ROUNDS: u64 = 2;

/// Every epoch has at least one batch, so `batches` epochs always cover a run; the plans of
/// epochs never reached cost nothing but their seeds.
fn with_enough_epochs(manifest: &Manifest, batches: u64) -> Manifest {
    let mut manifest = manifest.clone();
    manifest.pipeline.spec.epochs = u32::try_from(batches).unwrap_or(u32::MAX).max(1);
    manifest
}

/// Median connection times measured in one round.
struct Connect {
    dispatcher_ms: f64,
    worker_ms: Option<f64>,
}

/// What one round serves, and to whom.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Worker processes.
    workers: u32,
    /// TLS and authentication on every endpoint.
    tls: bool,
    /// Trainers of the job, reading at once.
    trainers: u32,
}

/// One service and its trainers: `args.warmup` batches each untimed, then `batches` timed
/// between them; the workers' peak memory; then the connection times to the service, before it
/// stops.
async fn round(
    manifest: &Manifest,
    args: &BenchArgs,
    shape: Shape,
    batches: u64,
) -> anyhow::Result<(Totals, Connect)> {
    let options = service::ServiceOptions {
        listen: ([127, 0, 0, 1], 0).into(),
        journal: None,
        sizing: service::Sizing::Fixed(shape.workers),
        threads: args.threads,
        prefetch_bytes: args.prefetch_bytes.clone(),
        python: args.python.path.clone(),
        normalize_on_worker: args.normalize_on_worker,
        metrics_addr: None,
        cache_max_bytes: None,
        tls: shape.tls,
    };
    let local = service::LocalService::start(manifest, &options).await?;
    let result = async {
        let mut client = ClientOptions::new(local.pipeline.clone());
        client.dispatcher = Some(local.address.to_string());
        client.images = args.images.map(crate::args::Images::placement);
        if let Some(budget) = args.client_prefetch_bytes {
            client.prefetch_bytes = budget;
        }
        let material = match local.credentials() {
            Some(credentials) => {
                let token = std::fs::read_to_string(credentials.trainer_token_file())
                    .context("cannot read the run's trainer token")?;
                client.token = Some(token);
                let files = granary_security::TlsFiles { ca: credentials.ca_file(), cert: None, key: None };
                let material = files.load().context("the run's CA")?;
                client.tls = Some(material.clone());
                Some(material)
            }
            None => None,
        };
        let padding = PaddingTally::of(manifest);
        let reading = trainers::Reading {
            trainers: shape.trainers,
            warmup: args.warmup,
            timed: batches,
            stall: std::time::Duration::from_secs_f64(args.stall_seconds),
            step: std::time::Duration::from_secs_f64(args.step_ms / 1e3),
            pause_every: args.pause_every,
            pause: std::time::Duration::from_secs_f64(args.pause_ms / 1e3),
        };
        let window = trainers::read(client, reading, padding).await?;
        let totals = Totals::of(window, proc_tree::children_peak_rss_bytes(), options.worker_threads());
        let dispatcher_ms =
            handshake::median_connect_ms(&local.address.to_string(), material.as_ref()).await?;
        let worker_ms = match (material.as_ref(), local.dispatcher.workers(&local.pipeline).first()) {
            (Some(material), Some(worker)) => {
                Some(handshake::median_connect_ms(&worker.address, Some(material)).await?)
            }
            _ => None,
        };
        anyhow::Ok((totals, Connect { dispatcher_ms, worker_ms }))
    }
    .await;
    local.stop(END_OF_RUN_GRACE).await;
    result
}
