//! The asynchronous client: registers as a consumer, streams from every worker, and delivers
//! each batch of each epoch exactly once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::mpsc;

use crate::assembler::{Accepted, Assembler};
use crate::batch::Batch;
use crate::dispatcher::{self, Dispatcher, PlanFetch};
use crate::endpoint::CALL_TIMEOUT;
use crate::error::ClientError;
use crate::finisher::Finisher;
use crate::heartbeat;
use crate::mode::Mode;
use crate::options::ClientOptions;
use crate::plan::Plan;
use crate::position::Position;
use crate::prefetch::Prefetch;
use crate::ranges::SlotRanges;
use crate::registration::Registration;
use crate::replay::{self, ReplayRequest};
use crate::session::Session;
use crate::streams::{StreamEvent, WorkerStreams};
use crate::task::TaskGuard;

/// Stream messages queued between the worker streams and `next()`. Small: a part can be a whole
/// batch of large tensors, and the HTTP/2 windows buffer more.
const EVENT_QUEUE: usize = 8;

/// Queued messages handled in one go before a ready batch is returned.
const DRAIN_LIMIT: usize = 64;

/// Without a new part for this long while batches are missing, the client asks for replays.
const STALL_AFTER: Duration = Duration::from_secs(2);

/// How often a partial plan (a pipeline that filters or packs) is extended while the client
/// waits: the slots after it are known once the splits before them are counted.
const PLAN_REFRESH: Duration = Duration::from_millis(50);

/// Heartbeat interval when the dispatcher names none.
const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(500);

/// A consumer of a Granary job: iterate [`Client::next`] for batches, [`Client::checkpoint`] to
/// save the position. Dropping it stops every background task.
pub struct Client {
    session: Arc<Session>,
    dispatcher: Dispatcher,
    epochs: u32,
    batch_size: u32,
    assembler: Assembler,
    /// Complete slots taken from the assembler, joined into batches off the trainer's thread.
    finisher: Finisher,
    /// How many complete batches to hold ahead of the trainer, tuned as it asks.
    prefetch: Prefetch,
    events: mpsc::Receiver<StreamEvent>,
    /// Keeps `events` open while no worker stream runs.
    _events_sender: mpsc::Sender<StreamEvent>,
    replays: mpsc::Sender<ReplayRequest>,
    next_plan: Option<PlanFetch>,
    errors: VecDeque<ClientError>,
    clock: Clock,
    finished: bool,
    tasks: Option<Tasks>,
}

/// Timestamps for step times and stall detection.
#[derive(Debug)]
struct Clock {
    /// When `next()` last returned.
    last_return: Option<Instant>,
    /// When the last part new to the client arrived (or the epoch started).
    last_new_part: Instant,
    /// When the stall check last asked for replays.
    last_stall_replay: Option<Instant>,
    /// When a partial plan was last extended.
    last_plan_refresh: Option<Instant>,
}

/// The background tasks; worker streams belong to the heartbeat task.
#[derive(Debug)]
struct Tasks {
    _heartbeat: TaskGuard<()>,
    _replay: TaskGuard<()>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("dispatcher", &self.session.address)
            .field("consumer", &self.session.consumer)
            .field("epochs", &self.epochs)
            .field("epoch", &self.assembler.epoch())
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Joins `pipeline` as a new distributed consumer. `dispatcher` is `host:port` or
    /// `http://host:port`; `None` reads `$GRANARY_DISPATCHER`.
    pub async fn connect(dispatcher: Option<&str>, pipeline: &str) -> Result<Client, ClientError> {
        let mut options = ClientOptions::new(pipeline);
        options.dispatcher = dispatcher.map(str::to_owned);
        Client::open(options).await
    }

    /// Registers with the dispatcher (resuming `options.resume` if set), fetches the epoch plan
    /// and starts streaming from the workers.
    pub async fn open(options: ClientOptions) -> Result<Client, ClientError> {
        let address = options.dispatcher_address()?;
        let registration = Registration::new(&options)?;
        let tls = options.tls()?;
        let token = options.token()?;
        let mut dispatcher = dispatcher::connect(&address, tls.as_ref(), token.as_deref()).await?;
        let response =
            dispatcher::register(&mut dispatcher, &address, tls.is_some(), registration.request.clone())
                .await?;
        let consumer = registration.consumer(&response)?;
        tracing::info!(
            dispatcher = %address,
            pipeline = %consumer.pipeline,
            job = %consumer.job,
            consumer = consumer.consumer_index,
            consumers = consumer.num_consumers,
            epochs = response.epochs,
            epoch = registration.epoch,
            workers = response.workers.len(),
            "registered as a consumer"
        );
        let session = Arc::new(Session::new(
            consumer,
            address,
            response.client_id.clone(),
            registration.epoch,
            registration.delivered.clone(),
        ));
        session.set_capability(response.capability.clone());
        session.set_max_part_bytes(response.max_part_bytes);
        // Workers are dialled by address; their certificates name the pipeline instead.
        let pipeline = &session.consumer.pipeline;
        session.set_tls(tls.map(|tls| tls.naming(granary_security::worker_server_name(pipeline))));
        let mut assembler = Assembler::new(response.epochs);
        if registration.epoch < response.epochs {
            let plan = dispatcher::fetch_plan(&mut dispatcher, &session, registration.epoch).await?;
            assembler.start_epoch(plan, &registration.delivered);
        }

        let (events_sender, events) = mpsc::channel(EVENT_QUEUE);
        let (replays, replay_requests) = mpsc::channel(replay::QUEUE);
        let mut streams = WorkerStreams::new(Arc::clone(&session), events_sender.clone());
        streams.update(&response.workers);
        let listed = !response.workers.is_empty();
        let interval = match response.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let tasks = Tasks {
            _heartbeat: TaskGuard::spawn(heartbeat::run(
                dispatcher.clone(),
                Arc::clone(&session),
                streams,
                interval,
                listed,
            )),
            _replay: TaskGuard::spawn(replay::run(dispatcher.clone(), Arc::clone(&session), replay_requests)),
        };
        let mut client = Client {
            session,
            dispatcher,
            epochs: response.epochs,
            batch_size: response.batch_size,
            assembler,
            finisher: Finisher::new(),
            prefetch: Prefetch::new(options.prefetch_bytes),
            events,
            _events_sender: events_sender,
            replays,
            next_plan: None,
            errors: VecDeque::new(),
            clock: Clock {
                last_return: None,
                last_new_part: Instant::now(),
                last_stall_replay: None,
                last_plan_refresh: None,
            },
            finished: false,
            tasks: Some(tasks),
        };
        client.finish_complete();
        client.prefetch_plan();
        Ok(client)
    }

    /// The next batch of the current epoch, in the order batches complete; `None` after the
    /// last epoch. An error leaves the client usable: call again to go on.
    pub async fn next(&mut self) -> Option<Result<Batch, ClientError>> {
        if self.finished {
            return None;
        }
        let entered = Instant::now();
        let step = self.clock.last_return.map(|at| entered.saturating_duration_since(at));
        self.drain();
        if let Some(depth) = self.prefetch.asked(self.ready()) {
            self.session.progress().prefetch = depth;
        }
        loop {
            if let Some(error) = self.errors.pop_front() {
                self.clock.last_return = Some(Instant::now());
                // Nothing follows a failed pipeline.
                self.finished |= matches!(error, ClientError::PipelineFailed { .. });
                return Some(Err(error));
            }
            self.drain();
            if !self.errors.is_empty() {
                continue;
            }
            if let Some(finished) = self.finisher.next().await {
                let (epoch, slot) = (finished.epoch, finished.slot);
                self.assembler.settle(epoch, slot, finished.batch.is_ok());
                match finished.batch {
                    Ok(batch) => {
                        let now = Instant::now();
                        self.delivered(&batch, step, now.saturating_duration_since(entered));
                        self.clock.last_return = Some(now);
                        return Some(Ok(batch));
                    }
                    Err(reason) => {
                        // The slot is open again: its splits are replayed like a lost part's.
                        let error = ClientError::Assembly { epoch, slot, reason };
                        tracing::warn!(%error, "dropped a batch");
                        self.errors.push_back(error);
                        continue;
                    }
                }
            }
            if self.assembler.epoch().is_none() || self.assembler.epoch_finished() {
                match self.advance().await {
                    Ok(true) => continue,
                    Ok(false) => {
                        self.finish().await;
                        return None;
                    }
                    Err(error) => {
                        self.clock.last_return = Some(Instant::now());
                        return Some(Err(error));
                    }
                }
            }
            if self.assembler.plan_partial() {
                self.extend_plan().await;
            }
            self.wait(entered).await;
        }
    }

    /// Asks for the slots a partial plan does not list yet, at most every [`PLAN_REFRESH`].
    async fn extend_plan(&mut self) {
        let now = Instant::now();
        if self.clock.last_plan_refresh.is_some_and(|at| now < at + PLAN_REFRESH) {
            return;
        }
        self.clock.last_plan_refresh = Some(now);
        let Some(epoch) = self.assembler.epoch() else { return };
        let from = self.assembler.planned_slots();
        let fetch = dispatcher::fetch_plan_from(&mut self.dispatcher, &self.session, epoch, from);
        match tokio::time::timeout(CALL_TIMEOUT, fetch).await {
            Ok(Ok(more)) => {
                match self.assembler.extend_plan(more) {
                    Ok(errors) => self.errors.extend(errors),
                    Err(error) => self.errors.push_back(error),
                }
                self.finish_complete();
            }
            Ok(Err(error)) => tracing::debug!(epoch, %error, "extending the plan failed, retrying"),
            Err(_) => tracing::debug!(epoch, "extending the plan timed out, retrying"),
        }
    }

    /// The batches as a stream.
    pub fn into_stream(self) -> impl Stream<Item = Result<Batch, ClientError>> + Send + 'static {
        futures::stream::unfold(
            self,
            |mut client| async move { client.next().await.map(|item| (item, client)) },
        )
    }

    /// The position after the last batch [`Client::next`] returned. Resume it with
    /// [`ClientOptions::resume`].
    pub fn checkpoint(&self) -> Position {
        let mut position = self.session.position();
        if let Ok(delivered) = position.delivered_slots() {
            position.sources =
                self.assembler.source_positions(position.epoch, |slot| delivered.contains(slot));
        }
        position
    }

    /// Epochs the job runs.
    pub fn epochs(&self) -> u32 {
        self.epochs
    }

    /// The epoch being delivered.
    pub fn epoch(&self) -> u32 {
        self.session.progress().epoch
    }

    /// Whether every batch of the current epoch was delivered: the next [`Client::next`] starts
    /// the following epoch (or ends the job). Lets a caller stop at an epoch's end without
    /// reading a batch of the next one.
    pub fn epoch_finished(&self) -> bool {
        self.assembler.epoch_finished()
    }

    /// This consumer's index in the job.
    pub fn consumer_index(&self) -> u32 {
        self.session.consumer.consumer_index
    }

    /// Consumers of the job.
    pub fn num_consumers(&self) -> u32 {
        self.session.consumer.num_consumers
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.session.consumer.job
    }

    /// The pipeline's name.
    pub fn pipeline(&self) -> &str {
        &self.session.consumer.pipeline
    }

    /// How the job's consumers share an epoch.
    pub fn mode(&self) -> Mode {
        self.session.consumer.mode
    }

    /// Rows in a full batch.
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    /// Complete batches the client holds ahead of the trainer at most now: its prefetch depth,
    /// tuned within [`ClientOptions::prefetch_bytes`].
    pub fn prefetch_batches(&self) -> u32 {
        self.prefetch.depth()
    }

    /// Batch parts dropped as duplicates so far (replays, re-sent parts).
    pub fn duplicates(&self) -> u64 {
        self.assembler.duplicates()
    }

    /// Handles queued stream messages while few batches are ready.
    fn drain(&mut self) {
        for _ in 0..DRAIN_LIMIT {
            if self.ready() >= self.prefetch.depth() as usize {
                return;
            }
            match self.events.try_recv() {
                Ok(event) => self.handle(event),
                Err(_) => return,
            }
        }
    }

    /// Complete batches ahead of the trainer: joined, being joined, or waiting to be.
    fn ready(&self) -> usize {
        self.assembler.ready() + self.finisher.len()
    }

    /// Hands the slots the assembler completed to the finisher, which joins them into batches
    /// in the background. Called after everything that can complete a slot.
    fn finish_complete(&mut self) {
        while let Some(complete) = self.assembler.take_complete() {
            self.finisher.push(complete);
        }
    }

    /// Waits for one stream message, or asks for replays when none new came for a while.
    async fn wait(&mut self, entered: Instant) {
        let mut stall = self.clock.last_new_part.max(entered) + STALL_AFTER;
        if let Some(at) = self.clock.last_stall_replay {
            stall = stall.max(at + STALL_AFTER);
        }
        let deadline = match self.clock.last_plan_refresh {
            Some(at) if self.assembler.plan_partial() => stall.min(at + PLAN_REFRESH),
            _ => stall,
        };
        match tokio::time::timeout_at(deadline.into(), self.events.recv()).await {
            Ok(Some(event)) => self.handle(event),
            Ok(None) => self.errors.push_back(ClientError::StreamsClosed),
            Err(_) if Instant::now() >= stall => self.stalled(),
            Err(_) => {}
        }
    }

    fn handle(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Part(part) => {
                let (epoch, split, lo, slot) = (part.epoch, part.split, part.lo, part.slot);
                match self.assembler.accept(part) {
                    Ok(outcome) if outcome.is_new() => self.clock.last_new_part = Instant::now(),
                    Ok(Accepted::Unplanned) => {
                        tracing::debug!(epoch, split, lo, slot, "dropped a part that is not in the plan");
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "dropped a batch part");
                        self.errors.push_back(error);
                    }
                }
                self.finish_complete();
            }
            StreamEvent::SplitEnd { epoch, split } => {
                if self.assembler.split_end(epoch, split) {
                    tracing::debug!(epoch, split, "split ended with parts missing, asking for a replay");
                    self.request_replay(epoch, vec![split]);
                }
            }
            StreamEvent::Failed(message) => {
                let pipeline = self.session.consumer.pipeline.clone();
                self.errors.push_back(ClientError::PipelineFailed { pipeline, message });
            }
        }
    }

    /// Nothing new arrived for [`STALL_AFTER`]: replay every split that holds a missing part.
    fn stalled(&mut self) {
        self.clock.last_stall_replay = Some(Instant::now());
        let Some(epoch) = self.assembler.epoch() else { return };
        if self.assembler.epoch_finished() {
            return;
        }
        let splits = self.assembler.missing_splits();
        if !splits.is_empty() {
            tracing::debug!(epoch, splits = splits.len(), "no new batch part for 2 s, asking for replays");
            self.request_replay(epoch, splits);
        }
    }

    fn request_replay(&self, epoch: u32, splits: Vec<u64>) {
        if self.replays.try_send(ReplayRequest { epoch, splits }).is_err() {
            tracing::debug!(epoch, "replay queue full, dropping a request");
        }
    }

    /// Records a delivered batch for checkpoints, heartbeats and metrics.
    fn delivered(&mut self, batch: &Batch, step: Option<Duration>, wait: Duration) {
        let resized = self.prefetch.delivered(batch.bytes());
        let mut progress = self.session.progress();
        if let Some(depth) = resized {
            progress.prefetch = depth;
        }
        progress.delivered.insert(batch.slot);
        progress.metrics.record(step, wait);
        progress.buffered = u32::try_from(self.ready()).unwrap_or(u32::MAX);
    }

    /// Starts the next epoch; false after the last one.
    async fn advance(&mut self) -> Result<bool, ClientError> {
        let Some(current) = self.assembler.epoch() else { return Ok(false) };
        let epoch = current + 1;
        if epoch >= self.epochs {
            return Ok(false);
        }
        let plan = self.plan(epoch).await?;
        let start = self.assembler.start_epoch(plan, &SlotRanges::default());
        self.finish_complete();
        {
            let mut progress = self.session.progress();
            progress.epoch = epoch;
            progress.delivered = SlotRanges::default();
        }
        self.errors.extend(start.errors);
        if !start.replay.is_empty() {
            self.request_replay(epoch, start.replay);
        }
        // The dispatcher leases at most one epoch ahead of the slowest consumer: tell it at once
        // that this one moved on, rather than at the next heartbeat, or a pipeline that runs an
        // epoch faster than the heartbeat interval (reading a cache) waits for it.
        let mut dispatcher = self.dispatcher.clone();
        let request = self.session.heartbeat();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CALL_TIMEOUT, dispatcher.client_heartbeat(request)).await;
        });
        self.clock.last_new_part = Instant::now();
        self.clock.last_stall_replay = None;
        tracing::debug!(epoch, "epoch started");
        self.prefetch_plan();
        Ok(true)
    }

    /// The plan for `epoch`, prefetched or fetched now.
    async fn plan(&mut self, epoch: u32) -> Result<Plan, ClientError> {
        let mut fetch = match self.next_plan.take() {
            Some(fetch) if fetch.epoch == epoch => fetch,
            _ => PlanFetch::spawn(self.dispatcher.clone(), Arc::clone(&self.session), epoch),
        };
        fetch.task.join().await.unwrap_or_else(|| {
            Err(ClientError::BadPlan { epoch, reason: "fetching the plan stopped unexpectedly".into() })
        })
    }

    /// Starts fetching the next epoch's plan.
    fn prefetch_plan(&mut self) {
        if let Some(current) = self.assembler.epoch()
            && current + 1 < self.epochs
        {
            self.next_plan =
                Some(PlanFetch::spawn(self.dispatcher.clone(), Arc::clone(&self.session), current + 1));
        }
    }

    /// Every epoch was delivered: stop the tasks and tell the dispatcher.
    async fn finish(&mut self) {
        self.finished = true;
        self.tasks = None;
        self.next_plan = None;
        self.session.progress().finished = true;
        let request = self.session.heartbeat();
        match tokio::time::timeout(CALL_TIMEOUT, self.dispatcher.client_heartbeat(request)).await {
            Ok(Ok(_)) => tracing::info!(epochs = self.epochs, "every epoch delivered"),
            Ok(Err(status)) => {
                tracing::warn!(code = ?status.code(), message = status.message(), "final heartbeat failed");
            }
            Err(_) => tracing::warn!("final heartbeat timed out"),
        }
    }
}
