//! Group commit: requests queue their events in the order they changed the state (they queue
//! while holding the state lock), and one writer at a time appends everything queued as one
//! record; each request is answered once the record holding its events is durable.

use super::{Journal, JournalError};
use crate::state::Event;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a failing store is retried, by default, before the dispatcher stops serving.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(20);
/// The first pause between attempts; it doubles up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between attempts.
const LONGEST_PAUSE: Duration = Duration::from_secs(2);
/// Most attempts at one record, whatever the time.
const MOST_ATTEMPTS: u32 = 64;
/// How long a change whose requester is not waiting on it lets others join its record (see
/// [`Urgency::Batched`]). A worker completes a split after its consumers took it, off the data
/// path, so 20 ms more before the answer costs it nothing, while a worker completing hundreds
/// of small splits a second then writes at most about 50 records a second instead of one per
/// completion: fewer objects to create (each is a PUT on S3, and a new inode on a local disk),
/// and less of the dispatcher's CPU. Requests a client waits on are written at once, and take
/// what lingers along.
pub(crate) const LINGER: Duration = Duration::from_millis(20);

/// Whether a change is written as soon as it is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// Written at once (with whatever is queued): someone waits on the answer.
    Prompt,
    /// Lets other changes queue behind it for [`LINGER`] first, unless a prompt write takes it
    /// sooner: for changes reported off the data path, such as split completions.
    Batched,
}

/// Events waiting for the writer.
#[derive(Default)]
struct Queue {
    events: Vec<Event>,
    /// The ticket of the last batch queued.
    last: u64,
}

/// The one writer.
struct Writer {
    journal: Journal,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// Why writing stopped for good.
    failed: Option<String>,
}

/// A batch for the writer: the events queued, the last ticket among them, and the state's
/// events right after them when compacting.
pub(crate) struct Batch {
    /// The events, in state order.
    pub events: Vec<Event>,
    /// The last ticket they include.
    pub last: u64,
    /// A snapshot of the state as of these events, when asked for.
    pub snapshot: Option<Vec<Event>>,
}

/// The journal behind its queue.
pub(crate) struct Committer {
    queue: Mutex<Queue>,
    writer: tokio::sync::Mutex<Writer>,
    /// Record writes that succeeded, and attempts that failed.
    writes: [AtomicU64; 2],
    /// Set, with the reason, when the dispatcher must stop serving.
    halted: Arc<watch::Sender<Option<String>>>,
    retry_for: Duration,
}

impl Committer {
    /// Writes through `journal`; a fatal failure is reported on `halted`.
    pub(crate) fn new(
        journal: Journal,
        halted: Arc<watch::Sender<Option<String>>>,
        retry_for: Duration,
    ) -> Committer {
        Committer {
            queue: Mutex::default(),
            writer: tokio::sync::Mutex::new(Writer { journal, durable: 0, failed: None }),
            writes: Default::default(),
            halted,
            retry_for,
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `events` and returns the ticket to [`Committer::commit`]. Call it while holding
    /// the state lock, so that the journal's order is the state's.
    pub(crate) fn enqueue(&self, events: Vec<Event>) -> u64 {
        let mut queue = self.queue();
        queue.events.extend(events);
        queue.last += 1;
        queue.last
    }

    /// Takes everything queued, after `stray` (events the state produced outside a request);
    /// call it under the state lock.
    pub(crate) fn take(&self, stray: Vec<Event>, snapshot: Option<Vec<Event>>) -> Batch {
        let mut queue = self.queue();
        let mut events = stray;
        events.append(&mut queue.events);
        Batch { events, last: queue.last, snapshot }
    }

    /// Record writes so far: `(succeeded, failed attempts)`.
    pub(crate) fn writes(&self) -> (u64, u64) {
        let [ok, failed] = &self.writes;
        (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
    }

    /// Returns once `ticket`'s events are durable, writing them (and everything queued with
    /// them) if no other writer did; with [`Urgency::Batched`], only after [`LINGER`] (a prompt
    /// write meanwhile takes them along). `take` gets the batch (see [`Committer::take`]), with a
    /// snapshot of the state when its argument is true (compaction is due). An error is fatal:
    /// the dispatcher stops serving.
    pub(crate) async fn commit(
        &self,
        ticket: u64,
        urgency: Urgency,
        take: impl FnOnce(bool) -> Batch,
    ) -> Result<(), String> {
        if urgency == Urgency::Batched {
            tokio::time::sleep(LINGER).await;
        }
        let mut writer = self.writer.lock().await;
        if let Some(why) = &writer.failed {
            return Err(why.clone());
        }
        if writer.durable >= ticket {
            return Ok(());
        }
        let batch = take(writer.journal.wants_compaction());
        if let Err(e) = self.write(&mut writer.journal, &batch.events).await {
            return Err(self.fail(&mut writer, e));
        }
        writer.durable = batch.last;
        if let Some(state) = batch.snapshot {
            match writer.journal.compact(state).await {
                Ok(()) => tracing::debug!(sequence = writer.journal.next_sequence(), "journal compacted"),
                Err(e @ JournalError::Fenced { .. }) => {
                    // This batch is durable; nothing after it will be.
                    self.fail(&mut writer, e);
                }
                Err(e) => tracing::warn!("cannot compact the journal (its records are kept): {e}"),
            }
        }
        Ok(())
    }

    /// Appends `events`, retrying a failing store with backoff for `retry_for`.
    async fn write(&self, journal: &mut Journal, events: &[Event]) -> Result<(), JournalError> {
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            match journal.append(events).await {
                Ok(()) => {
                    self.writes[0].fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    self.writes[1].fetch_add(1, Ordering::Relaxed);
                    let out_of_time = started.elapsed() + pause > self.retry_for;
                    if matches!(e, JournalError::Fenced { .. }) || out_of_time || attempt >= MOST_ATTEMPTS {
                        return Err(e);
                    }
                    tracing::warn!(attempt, "journal append failed; retrying in {pause:?}: {e}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    attempt += 1;
                }
            }
        }
    }

    /// Stops writing for good, and the dispatcher serving; returns why.
    fn fail(&self, writer: &mut Writer, e: JournalError) -> String {
        let why = match e {
            JournalError::Fenced { .. } => e.to_string(),
            e => format!("the journal could not be written for {:?}: {e}", self.retry_for),
        };
        tracing::error!("the dispatcher stops serving: {why}");
        writer.failed = Some(why.clone());
        self.halted.send_if_modified(|halted| {
            let first = halted.is_none();
            if first {
                *halted = Some(why.clone());
            }
            first
        });
        why
    }
}
