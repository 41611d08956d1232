//! Per-consumer queues between the producers and the `StreamBatches` streams.
//!
//! Each consumer `(pipeline, job, consumer_index)` has one queue of batch parts (and the
//! `SplitEnd` markers that follow a split's parts). Pushing never waits: a producer serves every
//! job of its pipeline in lease order, and waiting for room in one consumer's queue would hold
//! every other job's splits behind it. Backpressure comes before the lease instead: a queue
//! holding its capacity of parts is *backed up* ([`Queues::backed_up_jobs`]), the agent names its
//! job when it asks for a lease, and the dispatcher leases this worker none of that job's splits
//! until the queue drains ([`Queues::room`] wakes the agent then). So a queue holds at most its
//! capacity plus the parts of the splits already leased when it filled. The capacity counts
//! parts and bytes together ([`Capacity`]): a few large parts, or more small ones. A queue outlives its
//! streams: a new stream for the same consumer replaces the previous one and drains what is
//! left. When the dispatcher reports a consumer gone, its queue is emptied and everything routed
//! to it is dropped until a new stream for it arrives.
//!
//! The map of queues shrinks: [`Queues::sweep`] (after each heartbeat) drops the queues with
//! nothing queued and no stream, except those of consumers the dispatcher just reported gone
//! (their marker keeps dropping what is routed to them), and releases the map's spare capacity.
//! A queue is looked up and locked under the map's lock, so one being swept is never pushed to.

use futures::Stream;
use granary_proto::v1::{BatchPart, SplitEnd, StreamMessage, stream_message};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{Notify, mpsc};

mod capacity;
pub use capacity::Capacity;

/// One consumer of a job.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerKey {
    /// Pipeline name.
    pub pipeline: String,
    /// Job name.
    pub job: String,
    /// Index of the consumer in its job.
    pub consumer_index: u32,
}

impl std::fmt::Display for ConsumerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}#{}", self.pipeline, self.job, self.consumer_index)
    }
}

/// Held by queued messages; [`Delivered::wait`] returns once every token is gone, i.e. once every
/// message carrying one was taken by a stream or dropped.
#[derive(Clone, Debug)]
pub struct DeliveryToken(#[allow(dead_code)] mpsc::Sender<()>);

/// The waiting side of [`DeliveryToken`]s.
#[derive(Debug)]
pub struct Delivered(mpsc::Receiver<()>);

impl Delivered {
    /// Waits until every token was dropped.
    pub async fn wait(mut self) {
        while self.0.recv().await.is_some() {}
    }
}

/// A token and the handle that waits for it and all its clones to be dropped.
pub fn delivery() -> (DeliveryToken, Delivered) {
    let (tx, rx) = mpsc::channel(1);
    (DeliveryToken(tx), Delivered(rx))
}

/// What happened to a pushed part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued for the consumer.
    Queued,
    /// Dropped: the consumer is gone.
    Gone,
    /// Dropped: the queues are closed (the worker is stopping).
    Closed,
    /// Not queued: the caller's lease was revoked.
    Cancelled,
}

/// One queued message.
struct Entry {
    message: StreamMessage,
    /// Payload bytes (tensor data) of a part; `None` for a `SplitEnd`.
    part_bytes: Option<usize>,
    _token: Option<DeliveryToken>,
}

#[derive(Default)]
struct State {
    entries: VecDeque<Entry>,
    /// Parts among `entries` (a `SplitEnd` takes no room).
    parts: usize,
    /// Their payload bytes.
    bytes: usize,
    /// Counted in the backlog as backed up: it was full ([`Capacity::full`]) when last changed.
    backed_up: bool,
    /// The stream allowed to drain the queue; 0 when none.
    stream: u64,
    /// The dispatcher reported the consumer gone and no stream came since.
    gone: bool,
    closed: bool,
}

impl State {
    /// Empties the queue; true when it was backed up.
    fn clear(&mut self) -> bool {
        self.entries.clear();
        self.parts = 0;
        self.bytes = 0;
        std::mem::take(&mut self.backed_up)
    }
}

/// One consumer's queue.
#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    /// Streams waiting for a message (or for being replaced).
    ready: Notify,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Totals of what streams took, for the metrics.
#[derive(Debug, Default)]
pub struct Taken {
    /// Parts taken by streams.
    pub parts: AtomicU64,
    /// Payload bytes of those parts.
    pub bytes: AtomicU64,
}

/// Every consumer's queue.
pub struct Queues {
    queues: Mutex<HashMap<ConsumerKey, Arc<Queue>>>,
    capacity: Capacity,
    next_stream: AtomicU64,
    closed: AtomicBool,
    taken: Arc<Taken>,
    backlog: Arc<Backlog>,
}

/// Where the queues tell that they backed up or drained.
#[derive(Default)]
struct Backlog {
    /// Queues at their capacity or past it, counted as they cross it (under their own lock):
    /// while none is, asking which jobs are backed up looks at no queue.
    queues: AtomicUsize,
    /// Woken when a backed-up queue drains below its capacity, or is emptied.
    room: Notify,
}

impl Backlog {
    /// A queue reached its capacity.
    fn filled(&self) {
        self.queues.fetch_add(1, Ordering::AcqRel);
    }

    /// A backed-up queue drained below its capacity or was emptied.
    fn drained(&self) {
        self.queues.fetch_sub(1, Ordering::AcqRel);
        self.room.notify_waiters();
    }
}

/// The messages of one `StreamBatches` call.
pub type ConsumerStream = Pin<Box<dyn Stream<Item = Result<StreamMessage, tonic::Status>> + Send>>;

impl Queues {
    /// Queues that back up at `capacity`.
    pub fn new(capacity: Capacity) -> Queues {
        Queues {
            queues: Mutex::new(HashMap::new()),
            capacity: capacity.normalized(),
            next_stream: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            taken: Arc::new(Taken::default()),
            backlog: Arc::default(),
        }
    }

    /// When a queue's job counts as backed up.
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Resolves when a backed-up queue drains below its capacity or is emptied: the agent asks
    /// for a lease again then. Enable it before reading [`Queues::backed_up_jobs`], so that no
    /// drain in between is missed.
    pub fn room(&self) -> tokio::sync::futures::Notified<'_> {
        self.backlog.room.notified()
    }

    /// What streams took so far.
    pub fn taken(&self) -> &Taken {
        &self.taken
    }

    fn map(&self) -> MutexGuard<'_, HashMap<ConsumerKey, Arc<Queue>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on `key`'s queue (made if missing), locked before the map is released: a sweep
    /// cannot remove it between the lookup and `f`.
    fn with_queue<R>(&self, key: &ConsumerKey, f: impl FnOnce(&Queue, MutexGuard<'_, State>) -> R) -> R {
        let mut queues = self.map();
        let queue = match queues.get(key) {
            Some(q) => Arc::clone(q),
            None => {
                let q = Arc::new(Queue::default());
                if self.closed.load(Ordering::Acquire) {
                    q.lock().closed = true;
                }
                queues.insert(key.clone(), Arc::clone(&q));
                q
            }
        };
        let state = queue.lock();
        drop(queues);
        f(&queue, state)
    }

    /// Drops the queues with nothing queued and no stream, but those of `gone` marked gone,
    /// and releases the map's spare room; returns how many were dropped.
    pub fn sweep(&self, gone: &HashSet<ConsumerKey>) -> usize {
        let mut queues = self.map();
        let before = queues.len();
        queues.retain(|key, queue| {
            let state = queue.lock();
            !state.entries.is_empty() || state.stream != 0 || (state.gone && gone.contains(key))
        });
        if queues.capacity() > 64 && queues.len() * 4 < queues.capacity() {
            queues.shrink_to_fit();
        }
        before - queues.len()
    }

    /// Consumer queues held.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// True when no queue is held.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// `(pipeline, job)` of the queues holding messages, at most `limit`: the jobs the
    /// dispatcher is asked about besides those of the held leases.
    pub fn queued_jobs(&self, limit: usize) -> Vec<(String, String)> {
        self.jobs_where(limit, |state| !state.entries.is_empty())
    }

    /// `(pipeline, job)` of the queues at their capacity or past it, at most
    /// `limit`: the dispatcher leases this worker none of their splits until they drain. A
    /// consumer reported gone drops what is routed to it, so its queue never backs up.
    pub fn backed_up_jobs(&self, limit: usize) -> Vec<(String, String)> {
        if self.backlog.queues.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.jobs_where(limit, |state| state.backed_up)
    }

    /// `(pipeline, job)` of the queues whose state passes `keep`, at most `limit`, in order.
    fn jobs_where(&self, limit: usize, keep: impl Fn(&State) -> bool) -> Vec<(String, String)> {
        let queues = self.map();
        let mut jobs = BTreeSet::new();
        for (key, queue) in queues.iter() {
            if jobs.len() >= limit {
                break;
            }
            if keep(&queue.lock()) {
                jobs.insert((key.pipeline.clone(), key.job.clone()));
            }
        }
        jobs.into_iter().collect()
    }

    fn all(&self) -> Vec<Arc<Queue>> {
        self.map().values().cloned().collect()
    }

    /// Queues `part` for `key`, full or not (see the module's note on backpressure); nothing is
    /// queued once `cancel` (the lease's revocation) is set.
    pub fn push_part(&self, key: &ConsumerKey, part: BatchPart, cancel: &AtomicBool) -> Pushed {
        let bytes = part.tensors.iter().map(|t| t.data.len()).sum();
        self.with_queue(key, |queue, mut state| {
            if state.closed {
                return Pushed::Closed;
            }
            if state.gone {
                return Pushed::Gone;
            }
            if cancel.load(Ordering::Acquire) {
                return Pushed::Cancelled;
            }
            state.entries.push_back(Entry {
                message: StreamMessage { kind: Some(stream_message::Kind::Part(part)) },
                part_bytes: Some(bytes),
                _token: None,
            });
            state.parts += 1;
            state.bytes += bytes;
            if !state.backed_up && self.capacity.full(state.parts, state.bytes) {
                state.backed_up = true;
                self.backlog.filled();
            }
            drop(state);
            queue.ready.notify_waiters();
            Pushed::Queued
        })
    }

    /// Queues the end of a split for `key` (never waits). `token` is dropped once the message was
    /// taken by a stream or dropped with the queue's contents.
    pub fn push_end(&self, key: &ConsumerKey, end: SplitEnd, token: DeliveryToken) -> Pushed {
        self.with_queue(key, |queue, mut state| {
            if state.closed {
                return Pushed::Closed;
            }
            if state.gone {
                return Pushed::Gone;
            }
            state.entries.push_back(Entry {
                message: StreamMessage { kind: Some(stream_message::Kind::SplitEnd(end)) },
                part_bytes: None,
                _token: Some(token),
            });
            drop(state);
            queue.ready.notify_waiters();
            Pushed::Queued
        })
    }

    /// Starts a stream of `key`'s messages; the previous stream of that consumer ends, and a
    /// consumer reported gone is taken back.
    pub fn open_stream(&self, key: &ConsumerKey) -> ConsumerStream {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let queue = {
            let mut queues = self.map();
            let queue = Arc::clone(queues.entry(key.clone()).or_insert_with(|| {
                let q = Arc::new(Queue::default());
                q.lock().closed = self.closed.load(Ordering::Acquire);
                q
            }));
            drop(queues);
            queue
        };
        {
            let mut state = queue.lock();
            state.stream = id;
            state.gone = false;
        }
        // Wake the previous stream so that it sees it was replaced.
        queue.ready.notify_waiters();
        let attached = Attached {
            queue,
            id,
            taken: Arc::clone(&self.taken),
            capacity: self.capacity,
            backlog: Arc::clone(&self.backlog),
        };
        Box::pin(futures::stream::unfold(attached, |attached| async move {
            let message = next_message(&attached).await?;
            Some((Ok(message), attached))
        }))
    }

    /// Drops everything queued for `key` and everything routed to it until a new stream for it
    /// arrives; ends its current stream.
    pub fn mark_gone(&self, key: &ConsumerKey) {
        let dropped = self.with_queue(key, |queue, mut state| {
            let dropped = state.parts;
            state.gone = true;
            state.stream = 0;
            if state.clear() {
                self.backlog.drained();
            }
            drop(state);
            queue.ready.notify_waiters();
            dropped
        });
        if dropped > 0 {
            tracing::info!(consumer = %key, parts = dropped, "consumer gone; dropped its queued parts");
        }
    }

    /// Ends every stream and drops everything queued or pushed from now on.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for queue in self.all() {
            {
                let mut state = queue.lock();
                state.closed = true;
                if state.clear() {
                    self.backlog.queues.fetch_sub(1, Ordering::AcqRel);
                }
            }
            queue.ready.notify_waiters();
        }
        self.backlog.room.notify_waiters();
    }

    /// Parts queued, all queues together, and their capacity in parts (each queue's for parts
    /// of the size it holds: [`Capacity::parts_for`]).
    pub fn buffered(&self) -> (usize, usize) {
        self.all().iter().fold((0, 0), |(parts, capacity), q| {
            let state = q.lock();
            (parts + state.parts, capacity + self.capacity.parts_for(state.parts, state.bytes))
        })
    }
}

/// A stream's hold on its queue: when the stream ends or its caller drops it, the queue has no
/// stream any more (unless a newer one replaced it), so a sweep may drop it once empty.
struct Attached {
    queue: Arc<Queue>,
    id: u64,
    taken: Arc<Taken>,
    /// The queues' capacity, and where to say that a backed-up queue drained below it.
    capacity: Capacity,
    backlog: Arc<Backlog>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        if state.stream == self.id {
            state.stream = 0;
        }
    }
}

/// The next message for the stream, or `None` once the stream was replaced or the queues closed.
async fn next_message(attached: &Attached) -> Option<StreamMessage> {
    let Attached { queue, id, taken, capacity, backlog } = attached;
    let id = *id;
    loop {
        let notified = queue.ready.notified();
        tokio::pin!(notified);
        // Register before looking, so that a push between the look and the wait is not missed.
        notified.as_mut().enable();
        {
            let mut state = queue.lock();
            if state.closed || state.stream != id {
                return None;
            }
            if let Some(entry) = state.entries.pop_front() {
                if let Some(bytes) = entry.part_bytes {
                    state.parts -= 1;
                    state.bytes -= bytes;
                    taken.parts.fetch_add(1, Ordering::Relaxed);
                    taken.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    if state.backed_up && !capacity.full(state.parts, state.bytes) {
                        state.backed_up = false;
                        backlog.drained();
                    }
                }
                drop(state);
                return Some(entry.message);
            }
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use granary_proto::v1::Tensor;
    use std::time::Duration;

    fn key(i: u32) -> ConsumerKey {
        ConsumerKey { pipeline: "p".into(), job: "j".into(), consumer_index: i }
    }

    fn part(lo: u64) -> BatchPart {
        BatchPart {
            epoch: 0,
            split: 1,
            lo,
            hi: lo + 1,
            slot: lo,
            keys: vec![format!("k{lo}")],
            tensors: vec![Tensor {
                name: "x".into(),
                dtype: "uint8".into(),
                shape: vec![1, 3],
                data: bytes::Bytes::from_static(&[1, 2, 3]),
                normalize: None,
                padding: None,
                images: None,
            }],
        }
    }

    fn lo_of(message: &StreamMessage) -> Option<u64> {
        match &message.kind {
            Some(stream_message::Kind::Part(p)) => Some(p.lo),
            _ => None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_backs_up_its_job_without_making_the_producer_wait() {
        let queues = Arc::new(Queues::new(Capacity::parts(2)));
        let never = AtomicBool::new(false);
        let pushed: Vec<Pushed> = (0..5).map(|lo| queues.push_part(&key(0), part(lo), &never)).collect();
        assert_eq!(pushed, vec![Pushed::Queued; 5], "pushing never waits for room");
        assert_eq!(queues.buffered(), (5, 2));
        assert_eq!(queues.backed_up_jobs(10), vec![("p".to_string(), "j".to_string())]);
        let room = {
            let queues = Arc::clone(&queues);
            let (ready, waiting) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move {
                let room = queues.room();
                tokio::pin!(room);
                room.as_mut().enable();
                let _ = ready.send(());
                room.await;
            });
            let _ = waiting.await;
            task
        };
        let mut stream = queues.open_stream(&key(0));
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(lo_of(&stream.next().await.unwrap().unwrap()).unwrap());
        }
        assert_eq!(queues.backed_up_jobs(10), vec![("p".to_string(), "j".to_string())], "2 parts left");
        assert!(!room.is_finished(), "no room until the queue drains below its capacity");
        got.push(lo_of(&stream.next().await.unwrap().unwrap()).unwrap());
        tokio::time::timeout(Duration::from_secs(1), room).await.unwrap().unwrap();
        assert!(queues.backed_up_jobs(10).is_empty());
        got.push(lo_of(&stream.next().await.unwrap().unwrap()).unwrap());
        assert_eq!(got, vec![0, 1, 2, 3, 4], "in order");
        assert_eq!(queues.taken().parts.load(Ordering::Relaxed), 5);
        assert_eq!(queues.taken().bytes.load(Ordering::Relaxed), 15);
        // Backed up again, then emptied as its consumer goes: counted in and out each time.
        for lo in 5..8 {
            queues.push_part(&key(0), part(lo), &never);
        }
        assert_eq!(queues.backed_up_jobs(10).len(), 1);
        queues.mark_gone(&key(0));
        assert!(queues.backed_up_jobs(10).is_empty());
        assert_eq!(queues.backlog.queues.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_parts_queue_up_to_the_byte_allowance_before_backing_up() {
        // Parts of 3 bytes: backed up at 10 of them (30 bytes), not at the minimum of 2.
        let queues = Queues::new(Capacity { min_parts: 2, max_parts: 100, bytes: 30 });
        let never = AtomicBool::new(false);
        for lo in 0..9 {
            queues.push_part(&key(0), part(lo), &never);
        }
        assert!(queues.backed_up_jobs(10).is_empty(), "27 bytes in 9 parts");
        assert_eq!(queues.buffered(), (9, 10));
        queues.push_part(&key(0), part(9), &never);
        assert_eq!(queues.backed_up_jobs(10).len(), 1, "30 bytes");
        let mut stream = queues.open_stream(&key(0));
        assert_eq!(lo_of(&stream.next().await.unwrap().unwrap()), Some(0));
        assert!(queues.backed_up_jobs(10).is_empty(), "below the allowance again");
        assert_eq!(queues.backlog.queues.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_stream_replaces_the_old_one_and_keeps_the_queue() {
        let queues = Queues::new(Capacity::parts(4));
        let never = AtomicBool::new(false);
        let mut first = queues.open_stream(&key(0));
        queues.push_part(&key(0), part(0), &never);
        assert_eq!(lo_of(&first.next().await.unwrap().unwrap()), Some(0));
        queues.push_part(&key(0), part(1), &never);
        let mut second = queues.open_stream(&key(0));
        assert!(first.next().await.is_none(), "the replaced stream ends");
        assert_eq!(lo_of(&second.next().await.unwrap().unwrap()), Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gone_consumers_drop_their_parts_and_what_is_routed_to_them() {
        let queues = Queues::new(Capacity::parts(1));
        let never = AtomicBool::new(false);
        for lo in 0..3 {
            assert_eq!(queues.push_part(&key(3), part(lo), &never), Pushed::Queued);
        }
        assert_eq!(queues.backed_up_jobs(10).len(), 1);
        queues.mark_gone(&key(3));
        assert_eq!(queues.buffered().0, 0);
        assert!(queues.backed_up_jobs(10).is_empty(), "a gone consumer's job is not backed up");
        assert_eq!(queues.push_part(&key(3), part(3), &never), Pushed::Gone);
        let (token, delivered) = delivery();
        assert_eq!(queues.push_end(&key(3), SplitEnd { epoch: 0, split: 1 }, token), Pushed::Gone);
        tokio::time::timeout(Duration::from_secs(1), delivered.wait()).await.unwrap();
        // A new stream takes the consumer back.
        let mut stream = queues.open_stream(&key(3));
        assert_eq!(queues.push_part(&key(3), part(7), &never), Pushed::Queued);
        assert_eq!(lo_of(&stream.next().await.unwrap().unwrap()), Some(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_map_drops_the_queues_of_consumers_that_left() {
        let queues = Queues::new(Capacity::parts(2));
        let never = AtomicBool::new(false);
        // 500 consumers that opened a stream and left without reading.
        for i in 0..500 {
            drop(queues.open_stream(&key(i)));
        }
        // One with a part waiting for it, one reading, one reported gone.
        assert_eq!(queues.push_part(&key(1000), part(0), &never), Pushed::Queued);
        let mut reading = queues.open_stream(&key(1001));
        queues.mark_gone(&key(1002));
        assert_eq!(queues.len(), 503);
        assert_eq!(queues.queued_jobs(10), vec![("p".to_string(), "j".to_string())]);
        let gone: HashSet<ConsumerKey> = [key(1002)].into();
        assert_eq!(queues.sweep(&gone), 500);
        assert_eq!(queues.len(), 3);
        assert!(queues.map().capacity() < 64, "the spare room is released: {}", queues.map().capacity());
        // The gone marker still drops what is routed to it; once not reported, it goes too.
        assert_eq!(queues.push_part(&key(1002), part(1), &never), Pushed::Gone);
        assert_eq!(queues.sweep(&HashSet::new()), 1);
        // The waiting part is still there for its consumer, the reading stream still reads.
        let mut late = queues.open_stream(&key(1000));
        assert_eq!(lo_of(&late.next().await.unwrap().unwrap()), Some(0));
        assert_eq!(queues.push_part(&key(1001), part(5), &never), Pushed::Queued);
        assert_eq!(lo_of(&reading.next().await.unwrap().unwrap()), Some(5));
        assert_eq!(queues.sweep(&HashSet::new()), 0, "both have a stream");
        drop((late, reading));
        assert_eq!(queues.sweep(&HashSet::new()), 2);
        assert!(queues.is_empty());
        // A swept consumer's queue comes back on demand.
        assert_eq!(queues.push_part(&key(3), part(9), &never), Pushed::Queued);
        let mut back = queues.open_stream(&key(3));
        assert_eq!(lo_of(&back.next().await.unwrap().unwrap()), Some(9));
    }

    #[test]
    fn a_revoked_lease_queues_nothing() {
        let queues = Queues::new(Capacity::parts(1));
        let revoked = AtomicBool::new(true);
        assert_eq!(queues.push_part(&key(0), part(0), &revoked), Pushed::Cancelled);
        assert_eq!(queues.buffered().0, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn split_end_is_delivered_once_taken() {
        let queues = Queues::new(Capacity::parts(2));
        let never = AtomicBool::new(false);
        queues.push_part(&key(0), part(0), &never);
        let (token, delivered) = delivery();
        queues.push_end(&key(0), SplitEnd { epoch: 0, split: 1 }, token.clone());
        queues.push_end(&key(1), SplitEnd { epoch: 0, split: 1 }, token);
        let waiting = tokio::spawn(delivered.wait());
        let mut a = queues.open_stream(&key(0));
        let mut b = queues.open_stream(&key(1));
        a.next().await.unwrap().unwrap();
        a.next().await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "consumer 1 has not taken its end yet");
        let end = b.next().await.unwrap().unwrap();
        assert!(matches!(end.kind, Some(stream_message::Kind::SplitEnd(_))));
        tokio::time::timeout(Duration::from_secs(1), waiting).await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn close_ends_streams() {
        let queues = Queues::new(Capacity::parts(2));
        let mut stream = queues.open_stream(&key(0));
        let next = tokio::spawn(async move { stream.next().await.is_none() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        queues.close();
        assert!(tokio::time::timeout(Duration::from_secs(1), next).await.unwrap().unwrap());
        let never = AtomicBool::new(false);
        assert_eq!(queues.push_part(&key(0), part(0), &never), Pushed::Closed);
    }
}
