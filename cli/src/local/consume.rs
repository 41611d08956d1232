//! The built-in consumer of `granary run --workers N`: reads every epoch through the client over
//! loopback, with the same progress bar and summary as the in-process engine.

use crate::commands::run::{EpochSummary, RunArgs, RunSummary, peak_rss, progress_bar};
use granary_client::{Batch, Client, ClientOptions};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

/// Consumes `pipeline` from the dispatcher at `address` and returns the figures. Batches of an
/// epoch arrive in completion order, so the digest combines per-batch hashes order-free.
pub async fn consume(
    address: &str,
    pipeline: &str,
    args: &RunArgs,
    threads: usize,
) -> anyhow::Result<RunSummary> {
    let mut options = ClientOptions::new(pipeline);
    options.dispatcher = Some(address.to_string());
    let mut client = Client::open(options).await?;
    let epochs = client.epochs();
    let bar = progress_bar(args.json);
    let limit = args.limit_batches.unwrap_or(u64::MAX);
    let start = Instant::now();
    let mut summary = RunSummary {
        pipeline: pipeline.to_string(),
        items: 0,
        batches: 0,
        bytes: 0,
        seconds: 0.0,
        items_per_s: 0.0,
        mb_per_s: 0.0,
        peak_rss_bytes: None,
        threads,
        epochs: (0..epochs)
            .map(|epoch| EpochSummary { epoch, items: 0, batches: 0, seconds: 0.0, digest: None })
            .collect(),
    };
    let mut digests = vec![0u64; epochs as usize];
    let mut epoch_start = Instant::now();
    let mut current = 0u32;
    while summary.batches < limit {
        let Some(batch) = client.next().await else { break };
        let batch = batch?;
        while batch.epoch > current {
            if let Some(e) = summary.epochs.get_mut(current as usize) {
                e.seconds = epoch_start.elapsed().as_secs_f64();
            }
            epoch_start = Instant::now();
            current += 1;
        }
        let bytes: u64 = batch.tensors.iter().map(|t| t.data.len() as u64).sum();
        if let Some(e) = summary.epochs.get_mut(batch.epoch as usize) {
            e.items += batch.len() as u64;
            e.batches += 1;
        }
        if args.digest
            && let Some(d) = digests.get_mut(batch.epoch as usize)
        {
            *d = d.wrapping_add(hash_batch(&batch));
        }
        summary.items += batch.len() as u64;
        summary.batches += 1;
        summary.bytes += bytes;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        bar.set_position(summary.batches);
        bar.set_message(format!(
            "epoch {}/{epochs} · {:.0} items/s · {:.0} MB/s",
            batch.epoch + 1,
            summary.items as f64 / secs,
            summary.bytes as f64 / secs / 1e6
        ));
    }
    if let Some(e) = summary.epochs.get_mut(current as usize) {
        e.seconds = epoch_start.elapsed().as_secs_f64();
    }
    if args.digest {
        for (e, d) in summary.epochs.iter_mut().zip(digests) {
            e.digest = Some(format!("{d:016x}"));
        }
    }
    bar.finish_and_clear();
    summary.seconds = start.elapsed().as_secs_f64();
    let secs = summary.seconds.max(1e-9);
    summary.items_per_s = summary.items as f64 / secs;
    summary.mb_per_s = summary.bytes as f64 / secs / 1e6;
    summary.peak_rss_bytes = peak_rss();
    Ok(summary)
}

fn hash_batch(batch: &Batch) -> u64 {
    let mut h = DefaultHasher::new();
    batch.keys.hash(&mut h);
    for t in &batch.tensors {
        t.name.hash(&mut h);
        t.dtype.hash(&mut h);
        t.shape.hash(&mut h);
        t.data.hash(&mut h);
    }
    h.finish()
}
