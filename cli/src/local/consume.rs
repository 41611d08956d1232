//! The built-in consumer of `granary run --workers N`: reads every epoch through the client over
//! loopback, with the same progress bar and summary as the in-process engine.

use crate::commands::run::{EpochSummary, RunArgs, RunSummary, progress_bar};
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
    let mut summary = RunSummary::new(pipeline.to_string(), threads);
    summary.epochs = (0..epochs).map(EpochSummary::new).collect();
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
        summary.record_batch(&bar, batch.epoch, epochs, batch.len() as u64, bytes, start);
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
    summary.finish(start.elapsed().as_secs_f64());
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
