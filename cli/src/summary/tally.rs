//! Counting a run's batches into its [`RunSummary`], the same way whichever engine delivers
//! them: the engine in this process (`--workers 0`) or the client reading from workers.

use crate::args::RunArgs;
use crate::summary::digest::{EpochDigest, TensorRows};
use crate::summary::padding::PaddingTally;
use crate::summary::progress::progress_bar;
use crate::summary::{EpochSummary, RunSummary};
use indicatif::ProgressBar;
use std::time::Instant;

/// A delivered batch, as the tally reads it.
pub struct Delivered<'a> {
    /// The epoch it belongs to.
    pub epoch: u32,
    /// Elements in it.
    pub rows: u64,
    /// Their keys, in row order.
    pub keys: &'a [String],
    /// Its tensors.
    pub tensors: Vec<TensorRows<'a>>,
}

/// The figures of a run in progress, and the progress line that shows them.
pub struct Tally {
    summary: RunSummary,
    epochs: u32,
    /// The epoch the latest batch belonged to.
    current: u32,
    /// When the previous epoch's last batch arrived (or the run started).
    epoch_start: Instant,
    start: Instant,
    /// Per epoch, with `--digest`.
    digests: Option<Vec<EpochDigest>>,
    bar: ProgressBar,
    limit: u64,
    /// With `spec.batch.pad`, the padding fraction so far.
    padding: Option<PaddingTally>,
}

impl Tally {
    /// A run of `epochs` epochs of `pipeline`, starting now, with the `--json`, `--digest` and
    /// `--limit-batches` of `args`.
    pub fn new(pipeline: String, threads: usize, epochs: u32, args: &RunArgs) -> Tally {
        let mut summary = RunSummary::new(pipeline, threads);
        summary.startup_seconds = super::startup::seconds();
        // Every epoch has a summary, even one without batches.
        summary.epochs = (0..epochs).map(EpochSummary::new).collect();
        Tally {
            summary,
            epochs,
            current: 0,
            epoch_start: Instant::now(),
            start: Instant::now(),
            digests: args.digest.then(|| vec![EpochDigest::default(); epochs as usize]),
            bar: progress_bar(args.json),
            limit: args.limit_batches.unwrap_or(u64::MAX),
            padding: None,
        }
    }

    /// Also counts the padding fraction of `manifest`'s batches, when it pads.
    pub fn count_padding(mut self, manifest: &granary_crds::Manifest) -> Tally {
        self.padding = PaddingTally::of(manifest);
        self
    }

    /// True once `--limit-batches` batches arrived.
    pub fn is_full(&self) -> bool {
        self.summary.batches >= self.limit
    }

    /// Counts a batch. An epoch's `seconds` run from the previous epoch's last batch to its own
    /// last batch.
    pub fn record(&mut self, batch: Delivered<'_>) -> anyhow::Result<()> {
        anyhow::ensure!(
            batch.epoch < self.epochs,
            "a batch of epoch {} arrived in a run of {} epochs",
            batch.epoch,
            self.epochs
        );
        while batch.epoch > self.current {
            self.close_current();
            self.current += 1;
        }
        if let Some(d) = self.digests.as_mut().and_then(|d| d.get_mut(batch.epoch as usize)) {
            d.add(batch.keys, &batch.tensors)?;
        }
        if let Some(p) = self.padding.as_mut() {
            p.add(batch.tensors.iter().map(|t| (t.name, t.data)));
        }
        let bytes: u64 = batch.tensors.iter().map(|t| t.data.len() as u64).sum();
        if let Some(e) = self.summary.epochs.get_mut(batch.epoch as usize) {
            e.items += batch.rows;
            e.batches += 1;
        }
        let s = &mut self.summary;
        s.first_batch_seconds.get_or_insert_with(super::startup::seconds);
        s.items += batch.rows;
        s.batches += 1;
        s.bytes += bytes;
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_position(s.batches);
        self.bar.set_message(format!(
            "epoch {}/{} · {:.0} items/s · {:.0} MB/s",
            batch.epoch + 1,
            self.epochs,
            s.items as f64 / secs,
            s.bytes as f64 / secs / 1e6
        ));
        Ok(())
    }

    /// Batches counted so far.
    pub fn batches(&self) -> u64 {
        self.summary.batches
    }

    fn close_current(&mut self) {
        if let Some(e) = self.summary.epochs.get_mut(self.current as usize) {
            e.seconds = self.epoch_start.elapsed().as_secs_f64();
        }
        self.epoch_start = Instant::now();
    }

    /// The run's figures, as of now. A run cut short by `--limit-batches` lists the epochs it
    /// reached; otherwise every epoch is listed, with its digest even when it had no batches.
    pub fn finish(mut self) -> RunSummary {
        self.close_current();
        let reached = if self.is_full() { self.current as usize + 1 } else { self.epochs as usize };
        self.summary.epochs.truncate(reached);
        if let Some(digests) = self.digests.take() {
            for (e, d) in self.summary.epochs.iter_mut().zip(digests) {
                e.digest = Some(d.finish());
            }
        }
        self.bar.finish_and_clear();
        let seconds = self.start.elapsed().as_secs_f64();
        self.summary.finish(seconds);
        self.summary.padding_fraction = self.padding.as_ref().and_then(PaddingTally::fraction);
        self.summary
    }
}
