//! The trainers of a served round: one or more clients of the same job (consumers `0..n` of `n`,
//! each with its share of every epoch) reading at once, as trainer processes of one data-parallel
//! job do. The timed window is shared: it opens when the last trainer has pulled its warm-up
//! batches and closes when the trainers together have received the timed batches, so one trainer
//! and many are timed on the same amount of data. Batches count when they arrive inside the
//! window, with the wait of the `next()` that returned them.

use super::proc_tree::{self, CpuSeconds};
use crate::summary::padding::PaddingTally;
use granary_client::{Client, ClientOptions};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How the trainers of a round read.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    /// Trainers of the job, reading at once.
    pub trainers: u32,
    /// Batches each pulls before the window opens.
    pub warmup: u64,
    /// Batches they pull between them in the window.
    pub timed: u64,
    /// How long every trainer then stops reading, its client open and heartbeating, as a
    /// trainer in a long checkpoint does: the workers' peak memory covers it.
    pub stall: Duration,
    /// How long each trainer "trains" on every batch before it asks for the next (zero: not
    /// at all), as a trainer's thread waits on its accelerator.
    pub step: Duration,
    /// Every this many batches (0: never), the step lasts `pause` longer: a checkpoint or an
    /// evaluation pass, during which the client and the workers can work ahead.
    pub pause_every: u64,
    /// How much longer those steps last.
    pub pause: Duration,
}

/// What the trainers of one round saw in the timed window, together.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Elements received.
    pub items: u64,
    /// Batches received (an epoch's last may be short: a step takes one batch, whatever its
    /// rows).
    pub batches: u64,
    /// Seconds the window lasted.
    pub seconds: f64,
    /// Tensor bytes delivered to the trainers.
    pub bytes: u64,
    /// Bytes that crossed the wire.
    pub wire: u64,
    /// CPU used in the window; `None` without `/proc`.
    pub cpu: Option<CpuSeconds>,
    /// Milliseconds each `next()` in the window waited, every trainer's.
    pub waits_ms: Vec<f64>,
    /// With a step: milliseconds each step before a batch of the window ran past its length
    /// (the trainer's task was woken late: the host's cores were busy, or the timer's tick).
    pub overruns_ms: Vec<f64>,
    /// Seconds from the start of the round to the first batch any trainer received.
    pub first_batch_seconds: Option<f64>,
    /// With `spec.batch.pad`: pad cells over all cells of the padded fields.
    pub padding_fraction: Option<f64>,
    /// The deepest prefetch any trainer's client had tuned to when it stopped.
    pub prefetch_batches: Option<u32>,
}

/// The window's shared state while the trainers run.
struct Shared {
    trainers: u32,
    warmup: u64,
    timed: u64,
    stall: Duration,
    step: Duration,
    pause_every: u64,
    pause: Duration,
    /// Trainers past their warm-up.
    warmed: AtomicU32,
    /// When the window opened, and the CPU reading then.
    opened: OnceLock<(Instant, Option<CpuSeconds>)>,
    /// Batches pulled in the window, by all trainers.
    pulled: AtomicU64,
    /// When the window closed, and the CPU reading then.
    closed: OnceLock<(Instant, Option<CpuSeconds>)>,
    /// Set once the window closed (or a trainer failed): every trainer stops, even one waiting
    /// in `next()` for a batch the others' progress would release.
    stop: watch::Sender<bool>,
    start: Instant,
    first_batch: OnceLock<f64>,
    padding: Mutex<Option<PaddingTally>>,
}

/// One trainer's figures in the window.
#[derive(Default)]
struct Own {
    items: u64,
    batches: u64,
    bytes: u64,
    wire: u64,
    waits_ms: Vec<f64>,
    overruns_ms: Vec<f64>,
    prefetch_batches: u32,
}

/// Runs `reading.trainers` clients of `options`' job at once (consumer `i` of them); each
/// pulls its warm-up batches untimed, then they pull the timed batches between them, then they
/// stall.
pub async fn read(
    options: ClientOptions,
    reading: Reading,
    padding: Option<PaddingTally>,
) -> anyhow::Result<Window> {
    let trainers = reading.trainers.max(1);
    let shared = Arc::new(Shared {
        trainers,
        warmup: reading.warmup,
        timed: reading.timed.max(1),
        stall: reading.stall,
        step: reading.step,
        pause_every: reading.pause_every,
        pause: reading.pause,
        warmed: AtomicU32::new(0),
        opened: OnceLock::new(),
        pulled: AtomicU64::new(0),
        closed: OnceLock::new(),
        stop: watch::Sender::new(false),
        start: Instant::now(),
        first_batch: OnceLock::new(),
        padding: Mutex::new(padding),
    });
    let mut tasks = Vec::with_capacity(trainers as usize);
    for index in 0..trainers {
        let mut options = options.clone();
        options.consumer_index = Some(index);
        options.num_consumers = trainers;
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let result = trainer(options, &shared).await;
            // A trainer that failed ends the round for the others too.
            shared.stop.send_replace(true);
            result.map_err(|e| e.context(format!("trainer {index} of {}", shared.trainers)))
        }));
    }
    let mut window = Window::default();
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok(own)) => {
                window.items += own.items;
                window.batches += own.batches;
                window.bytes += own.bytes;
                window.wire += own.wire;
                window.waits_ms.extend(own.waits_ms);
                window.overruns_ms.extend(own.overruns_ms);
                window.prefetch_batches = window.prefetch_batches.max(Some(own.prefetch_batches));
            }
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => failure = failure.or(Some(anyhow::anyhow!("a trainer task failed: {e}"))),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let (Some((opened, cpu_before)), Some((closed, cpu_after))) = (shared.opened.get(), shared.closed.get())
    else {
        anyhow::bail!("the timed window never closed");
    };
    window.seconds = closed.saturating_duration_since(*opened).as_secs_f64().max(1e-9);
    window.cpu = cpu_before.zip(*cpu_after).map(|(before, after)| after.since(&before));
    window.first_batch_seconds = shared.first_batch.get().copied();
    window.padding_fraction =
        shared.padding.lock().ok().and_then(|p| p.as_ref().and_then(PaddingTally::fraction));
    Ok(window)
}

/// One trainer: warm-up, then batches until the window closes.
async fn trainer(options: ClientOptions, shared: &Shared) -> anyhow::Result<Own> {
    let mut client = Client::open(options).await?;
    let mut stopped = shared.stop.subscribe();
    let mut own = Own::default();
    let mut pulled = 0u64;
    let mut overrun = None;
    if shared.warmup == 0 {
        arrive(shared);
    }
    while !*stopped.borrow() {
        let step = shared.step_after(pulled);
        if pulled > 0 && !step.is_zero() {
            // The step on the previous batch; the client may work ahead meanwhile.
            let stepped = Instant::now();
            tokio::select! {
                () = tokio::time::sleep(step) => {}
                _ = stopped.wait_for(|stop| *stop) => break,
            }
            overrun = Some(stepped.elapsed().saturating_sub(step));
        }
        let asked = Instant::now();
        let next = tokio::select! {
            next = client.next() => next,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let Some(batch) = next else {
            anyhow::bail!("the service ended after {pulled} batches");
        };
        let batch = batch?;
        let returned = Instant::now();
        shared.first_batch.get_or_init(|| shared.start.elapsed().as_secs_f64());
        pulled += 1;
        if pulled == shared.warmup {
            arrive(shared);
            continue;
        }
        // Batches that arrived inside the window count, until it holds `timed` of them.
        let in_window = shared.opened.get().is_some_and(|(at, _)| returned >= *at);
        if !in_window {
            continue;
        }
        let place = shared.pulled.fetch_add(1, Ordering::SeqCst);
        if place >= shared.timed {
            continue;
        }
        own.items += batch.len() as u64;
        own.batches += 1;
        own.bytes += batch.tensors.iter().map(|t| t.data.len() as u64).sum::<u64>();
        own.wire += batch.wire_bytes;
        own.waits_ms.push(returned.saturating_duration_since(asked).as_secs_f64() * 1e3);
        own.overruns_ms.extend(overrun.map(|late| late.as_secs_f64() * 1e3));
        if let Ok(mut padding) = shared.padding.lock()
            && let Some(p) = padding.as_mut()
        {
            p.add(batch.tensors.iter().map(|t| (t.name.as_str(), &t.data[..])));
        }
        if place + 1 == shared.timed {
            shared.closed.get_or_init(|| (Instant::now(), proc_tree::cpu_seconds()));
            shared.stop.send_replace(true);
        }
    }
    if !shared.stall.is_zero() {
        // The client stays open: its streams and the worker's queues for it fill up.
        tokio::time::sleep(shared.stall).await;
    }
    own.prefetch_batches = client.prefetch_batches();
    drop(client);
    Ok(own)
}

impl Shared {
    /// The step a trainer takes on its `pulled`-th batch: longer by the pause on every
    /// `pause_every`-th.
    fn step_after(&self, pulled: u64) -> Duration {
        let paused = self.pause_every > 0 && pulled > 0 && pulled.is_multiple_of(self.pause_every);
        if paused { self.step + self.pause } else { self.step }
    }
}

/// A trainer finished its warm-up; the last one opens the window.
fn arrive(shared: &Shared) {
    if shared.warmed.fetch_add(1, Ordering::SeqCst) + 1 == shared.trainers {
        shared.opened.get_or_init(|| (Instant::now(), proc_tree::cpu_seconds()));
    }
}

/// The `q`-quantile (0..=1) of `values` by the nearest-rank method; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let waits: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&waits, 0.5), Some(50.0));
        assert_eq!(quantile(&waits, 0.99), Some(99.0));
        assert_eq!(quantile(&waits, 1.0), Some(100.0));
        assert_eq!(quantile(&waits, 0.0), Some(1.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
