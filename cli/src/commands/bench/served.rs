//! `granary bench --workers N`: the same pipeline served by the local service (dispatcher in
//! this process, N worker processes) and read by one client over loopback gRPC, timed like the
//! in-process run so the two figures are comparable. With `--tls` the served path is measured
//! twice in the same run, plaintext and TLS with authentication, in alternating rounds.

use super::{BenchArgs, Measurement, cpu, handshake};
use crate::local::{END_OF_RUN_GRACE, runtime, service};
use crate::summary::padding::PaddingTally;
use anyhow::Context;
use granary_client::{Client, ClientOptions};
use granary_crds::Manifest;
use std::time::Instant;

/// Rounds of each kind with `--tls`, alternated plaintext, TLS, plaintext, TLS… so that a drift
/// of the machine (heat, a neighbour's load) weighs on both alike.
pub const TLS_ROUNDS: u64 = 2;

/// A served run: the client's figures and the bytes it received.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// Items and time of the timed batches.
    pub measurement: Measurement,
    /// Tensor megabytes (10^6) per second delivered to the trainer while timed.
    pub mb_per_s: f64,
    /// Megabytes per second that crossed the wire while timed (less than `mb_per_s` when the
    /// client finishes a deferred `image.normalize`).
    pub wire_mb_per_s: f64,
    /// CPU seconds per gigabyte (10^9) delivered while timed: this process (dispatcher and
    /// client) and the worker processes, user and system time; `None` without `/proc`.
    pub cpu_s_per_gb: Option<f64>,
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
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    items: u64,
    seconds: f64,
    bytes: u64,
    wire: u64,
    cpu_seconds: f64,
    /// A round had no CPU reading: the total is unknown.
    cpu_unknown: bool,
    first_batch_seconds: Option<f64>,
    padding_fraction: Option<f64>,
}

impl Totals {
    fn add(&mut self, round: Totals) {
        self.items += round.items;
        self.seconds += round.seconds;
        self.bytes += round.bytes;
        self.wire += round.wire;
        self.cpu_seconds += round.cpu_seconds;
        self.cpu_unknown |= round.cpu_unknown;
        self.first_batch_seconds = self.first_batch_seconds.or(round.first_batch_seconds);
        self.padding_fraction = self.padding_fraction.or(round.padding_fraction);
    }

    fn served(&self) -> Served {
        let seconds = self.seconds.max(1e-9);
        let gb = self.bytes as f64 / 1e9;
        Served {
            measurement: Measurement {
                items: self.items,
                seconds,
                items_per_s: self.items as f64 / seconds,
                first_batch_seconds: self.first_batch_seconds.unwrap_or(seconds),
                padding_fraction: self.padding_fraction,
            },
            mb_per_s: self.bytes as f64 / seconds / 1e6,
            wire_mb_per_s: self.wire as f64 / seconds / 1e6,
            cpu_s_per_gb: (!self.cpu_unknown && gb > 0.0).then(|| self.cpu_seconds / gb),
        }
    }
}

/// Starts the local service with `workers` worker processes and times `args.batches` batches
/// after `args.warmup`, as one client of the pipeline sees them.
pub fn measure(manifest: &Manifest, args: &BenchArgs, workers: u32) -> anyhow::Result<Served> {
    let manifest = with_enough_epochs(manifest, args.warmup + args.batches);
    runtime()?.block_on(async {
        let (totals, _) = round(&manifest, args, workers, false, args.batches).await?;
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
                round(&manifest, args, workers, false, per_round).await.context("plaintext")?;
            plain.add(totals);
            plain_connect.push(connect.dispatcher_ms);
            let (totals, connect) = round(&manifest, args, workers, true, per_round).await.context("TLS")?;
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

/// One service, one client: `args.warmup` batches untimed, then `batches` timed; then the
/// connection times to the service, before it stops.
async fn round(
    manifest: &Manifest,
    args: &BenchArgs,
    workers: u32,
    tls: bool,
    batches: u64,
) -> anyhow::Result<(Totals, Connect)> {
    let options = service::ServiceOptions {
        listen: ([127, 0, 0, 1], 0).into(),
        journal: None,
        sizing: service::Sizing::Fixed(workers),
        threads: args.threads,
        prefetch_bytes: args.prefetch_bytes.clone(),
        python: args.python.path.clone(),
        normalize_on_worker: args.normalize_on_worker,
        metrics_addr: None,
        cache_max_bytes: None,
        tls,
    };
    let local = service::LocalService::start(manifest, &options).await?;
    let result = async {
        let mut client = ClientOptions::new(local.pipeline.clone());
        client.dispatcher = Some(local.address.to_string());
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
        let totals = read(client, args.warmup, args.warmup + batches, padding).await?;
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

async fn read(
    options: ClientOptions,
    warmup: u64,
    total: u64,
    mut padding: Option<PaddingTally>,
) -> anyhow::Result<Totals> {
    let start = Instant::now();
    let mut client = Client::open(options).await?;
    let mut first_batch_seconds = None;
    // Without warm-up the clock starts now, and the workers' start-up counts in the window.
    let mut timed_start = (warmup == 0).then(Instant::now);
    let mut cpu_start = if warmup == 0 { cpu::process_tree_seconds() } else { None };
    let (mut pulled, mut items, mut bytes, mut wire) = (0u64, 0u64, 0u64, 0u64);
    while pulled < total {
        let Some(batch) = client.next().await else {
            anyhow::bail!("the service ended after {pulled} of {total} batches");
        };
        let batch = batch?;
        first_batch_seconds.get_or_insert_with(|| start.elapsed().as_secs_f64());
        pulled += 1;
        if pulled == warmup {
            cpu_start = cpu::process_tree_seconds();
            timed_start = Some(Instant::now());
        } else if pulled > warmup {
            items += batch.len() as u64;
            bytes += batch.tensors.iter().map(|t| t.data.len() as u64).sum::<u64>();
            wire += batch.wire_bytes;
            if let Some(p) = padding.as_mut() {
                p.add(batch.tensors.iter().map(|t| (t.name.as_str(), &t.data[..])));
            }
        }
    }
    let seconds = timed_start.unwrap_or(start).elapsed().as_secs_f64().max(1e-9);
    let cpu_seconds =
        cpu_start.zip(cpu::process_tree_seconds()).map(|(before, after)| (after - before).max(0.0));
    Ok(Totals {
        items,
        seconds,
        bytes,
        wire,
        cpu_seconds: cpu_seconds.unwrap_or(0.0),
        cpu_unknown: cpu_seconds.is_none(),
        first_batch_seconds: first_batch_seconds.or(Some(seconds)),
        padding_fraction: padding.as_ref().and_then(PaddingTally::fraction),
    })
}
