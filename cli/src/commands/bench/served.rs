//! `granary bench --workers N`: the same pipeline served by the local service (dispatcher in
//! this process, N worker processes) and read by one client over loopback gRPC, timed like the
//! in-process run so the two figures are comparable.

use super::{BenchArgs, Measurement};
use crate::local::{END_OF_RUN_GRACE, runtime, service};
use crate::summary::padding::PaddingTally;
use granary_client::{Client, ClientOptions};
use granary_crds::Manifest;
use std::time::Instant;

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
}

/// Starts the local service with `workers` worker processes and times `args.batches` batches
/// after `args.warmup`, as one client of the pipeline sees them.
pub fn measure(manifest: &Manifest, args: &BenchArgs, workers: u32) -> anyhow::Result<Served> {
    let total = args.warmup + args.batches;
    let mut manifest = manifest.clone();
    // Every epoch has at least one batch, so this many epochs always cover the run; the plans of
    // epochs never reached cost nothing but their seeds.
    manifest.pipeline.spec.epochs = u32::try_from(total).unwrap_or(u32::MAX).max(1);
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
        tls: false,
    };
    runtime()?.block_on(async {
        let local = service::LocalService::start(&manifest, &options).await?;
        let padding = PaddingTally::of(&manifest);
        let result = read(&local.address.to_string(), &local.pipeline, args.warmup, total, padding).await;
        local.stop(END_OF_RUN_GRACE).await;
        result
    })
}

async fn read(
    address: &str,
    pipeline: &str,
    warmup: u64,
    total: u64,
    mut padding: Option<PaddingTally>,
) -> anyhow::Result<Served> {
    let mut options = ClientOptions::new(pipeline);
    options.dispatcher = Some(address.to_string());
    let start = Instant::now();
    let mut client = Client::open(options).await?;
    let mut first_batch_seconds = None;
    let mut timed_start = None;
    let (mut pulled, mut items, mut bytes, mut wire) = (0u64, 0u64, 0u64, 0u64);
    while pulled < total {
        let Some(batch) = client.next().await else {
            anyhow::bail!("the service ended after {pulled} of {total} batches");
        };
        let batch = batch?;
        first_batch_seconds.get_or_insert_with(|| start.elapsed().as_secs_f64());
        pulled += 1;
        if pulled == warmup {
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
    Ok(Served {
        measurement: Measurement {
            items,
            seconds,
            items_per_s: items as f64 / seconds,
            first_batch_seconds: first_batch_seconds.unwrap_or(seconds),
            padding_fraction: padding.as_ref().and_then(PaddingTally::fraction),
        },
        mb_per_s: bytes as f64 / seconds / 1e6,
        wire_mb_per_s: wire as f64 / seconds / 1e6,
    })
}
