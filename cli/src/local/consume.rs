//! The built-in consumer of `granary run --workers N`: reads every epoch through the client over
//! loopback, with the same progress bar, summary and digest as the in-process engine.

use crate::args::RunArgs;
use crate::summary::RunSummary;
use crate::summary::digest::TensorRows;
use crate::summary::tally::{Delivered, Tally};
use granary_client::{Client, ClientOptions};

/// Consumes `pipeline` (served from `manifest`) from the dispatcher at `address` and returns the
/// figures. Batches of an epoch arrive in completion order; the digest does not depend on it.
pub async fn consume(
    address: &str,
    manifest: &granary_crds::Manifest,
    pipeline: &str,
    args: &RunArgs,
    threads: usize,
) -> anyhow::Result<RunSummary> {
    let mut options = ClientOptions::new(pipeline);
    options.dispatcher = Some(address.to_string());
    options.images = args.images.map(crate::args::Images::placement);
    let mut client = Client::open(options).await?;
    let mut tally = Tally::new(pipeline.to_string(), threads, client.epochs(), args).count_padding(manifest);
    while !tally.is_full() {
        let Some(batch) = client.next().await else { break };
        let batch = batch?;
        let tensors = batch
            .tensors
            .iter()
            .map(|t| TensorRows { name: &t.name, dtype: &t.dtype, shape: &t.shape, data: &t.data })
            .collect();
        tally.record(Delivered {
            epoch: batch.epoch,
            rows: batch.len() as u64,
            keys: &batch.keys,
            tensors,
        })?;
    }
    Ok(tally.finish())
}
