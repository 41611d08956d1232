//! The worker's side of the conversation with the dispatcher: registration, heartbeats, split
//! leases, completions, and the drain on shutdown.
//!
//! The dispatcher may be down or restart at any time: every call is retried with a backoff
//! (100 ms doubling to 2 s) while the worker keeps serving its streams, and a heartbeat answered
//! with `NOT_FOUND` (a restarted dispatcher that forgot the worker) registers again with the same
//! id and the leases held.

use super::delivery::CountedSplit;
use super::delivery::{Event, Sinks};
use super::exposition::{Exposition, Totals};
use super::leases::Leases;
use super::metrics::{Counters, Inputs, Sampler};
use super::pacing::Pacer;
use super::producer::{Producer, ProducerError};
use super::queues::{ConsumerKey, Delivered, Queues};
use crate::engine::{EngineError, EngineOptions};
use granary_proto::v1::{
    CacheOutcome, CacheProfile, CompleteSplitRequest, CountSplitRequest, GetPipelineRequest, JobRef, Lease,
    LeaseSplitRequest, RegisterWorkerRequest, ReportCacheProfileRequest, ReturnLeaseRequest,
    WorkerHeartbeatRequest, WorkerHeartbeatResponse, WorkerMetrics,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

/// Heartbeat interval until the dispatcher tells another.
const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(500);
/// Wait before asking for a lease again when the dispatcher names none.
const DEFAULT_RETRY: Duration = Duration::from_millis(200);
/// Completion attempts answered `NOT_FOUND` before giving up (a restarted dispatcher may need a
/// re-registration first).
const COMPLETE_NOT_FOUND_ATTEMPTS: u32 = 20;
/// Most jobs with queued parts a heartbeat names (the dispatcher answers with their gone
/// consumers); past it, the held leases' jobs still are.
const MAX_QUEUED_JOBS: usize = 256;

/// Settings of the agent.
pub struct AgentConfig {
    /// Address clients connect to.
    pub advertise: String,
    /// Serve only this pipeline; empty serves any.
    pub pipeline: String,
    /// Where the worker serves its metrics (`host:port`), empty when it does not.
    pub metrics_address: String,
    /// Cores the engines compute with.
    pub cores: u32,
    /// Engine settings.
    pub engine: EngineOptions,
    /// Splits leased ahead of the engine, at least (more while it runs dry waiting for leases;
    /// see [`Pacer`]).
    pub leases_ahead: usize,
    /// How long a drain waits for held leases.
    pub drain_timeout: Duration,
}

/// Retry delays: 100 ms, doubling up to 2 s.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(2);

    fn new() -> Backoff {
        Backoff(Self::FIRST)
    }

    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

/// Who the dispatcher knows this worker as.
struct Identity {
    worker_id: String,
    heartbeat: Duration,
}

/// Why a lease could not start.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot get pipeline `{pipeline}` from the dispatcher: {status}")]
    Pipeline { pipeline: String, status: Status },
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error("split {split} is not in the listing of pipeline `{pipeline}` ({splits} splits)")]
    NoSplit { pipeline: String, split: u64, splits: usize },
    #[error("the engine of pipeline `{0}` stopped")]
    Closed(String),
}

/// The agent.
pub struct Agent {
    config: AgentConfig,
    client: super::Dispatcher,
    /// Where the dispatcher's capability key goes once registered.
    gate: Arc<super::server::CapabilityGate>,
    /// Where each pipeline's stream message limit goes once its spec is known.
    limits: Arc<super::server::StreamLimits>,
    queues: Arc<Queues>,
    leases: Leases,
    counters: Arc<Counters>,
    producers: Mutex<HashMap<String, Arc<Producer>>>,
    events: mpsc::UnboundedSender<Event>,
    identity: RwLock<Identity>,
    exposition: Option<Arc<Exposition>>,
}

impl Agent {
    /// An agent talking to the dispatcher through `client`; returns it and the receiver its
    /// producers report to (hand it to [`Agent::run`]).
    pub fn new(
        config: AgentConfig,
        client: super::Dispatcher,
        queues: Arc<Queues>,
        exposition: Option<Arc<Exposition>>,
        gate: Arc<super::server::CapabilityGate>,
        limits: Arc<super::server::StreamLimits>,
    ) -> (Arc<Agent>, mpsc::UnboundedReceiver<Event>) {
        let (events, events_rx) = mpsc::unbounded_channel();
        let agent = Agent {
            config,
            client,
            gate,
            limits,
            queues,
            leases: Leases::default(),
            counters: Arc::new(Counters::default()),
            producers: Mutex::new(HashMap::new()),
            events,
            identity: RwLock::new(Identity { worker_id: String::new(), heartbeat: DEFAULT_HEARTBEAT }),
            exposition,
        };
        (Arc::new(agent), events_rx)
    }

    /// Registers, then leases and produces splits until `shutdown`, then drains.
    pub async fn run(
        self: Arc<Self>,
        events: mpsc::UnboundedReceiver<Event>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        tokio::select! {
            () = self.register_until_done() => {}
            () = &mut shutdown => {
                tracing::info!("stopping before the dispatcher answered");
                return;
            }
        }
        let heartbeat = tokio::spawn(Arc::clone(&self).heartbeats());
        let handler = tokio::spawn(Arc::clone(&self).handle_events(events));
        let stop = CancellationToken::new();
        let leasing = tokio::spawn({
            let (agent, stop) = (Arc::clone(&self), stop.clone());
            async move { agent.lease_splits(stop).await }
        });
        shutdown.await;
        tracing::info!("draining: no new leases");
        stop.cancel();
        if let Err(e) = leasing.await {
            tracing::error!("the lease loop failed: {e}");
        }
        self.drain().await;
        heartbeat.abort();
        handler.abort();
        let producers: Vec<Arc<Producer>> = self.producers().drain().map(|(_, p)| p).collect();
        for producer in producers {
            producer.stop();
        }
    }

    fn client(&self) -> super::Dispatcher {
        self.client.clone()
    }

    fn producers(&self) -> MutexGuard<'_, HashMap<String, Arc<Producer>>> {
        self.producers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn worker_id(&self) -> String {
        self.identity.read().unwrap_or_else(PoisonError::into_inner).worker_id.clone()
    }

    fn heartbeat_interval(&self) -> Duration {
        self.identity.read().unwrap_or_else(PoisonError::into_inner).heartbeat
    }

    /// Registers (again, with the same id and the held leases, when it has one).
    async fn register(&self) -> Result<(), Status> {
        let request = RegisterWorkerRequest {
            address: self.config.advertise.clone(),
            worker_id: self.worker_id(),
            leases: self.leases.held(),
            pipeline: self.config.pipeline.clone(),
            cores: self.config.cores,
            metrics_address: self.config.metrics_address.clone(),
            plans_image_shares: true,
        };
        let again = !request.worker_id.is_empty();
        let response = self.client().register_worker(request).await?.into_inner();
        if response.worker_id.is_empty() {
            return Err(Status::internal("the dispatcher answered RegisterWorker with an empty worker_id"));
        }
        let heartbeat = match response.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        {
            let mut identity = self.identity.write().unwrap_or_else(PoisonError::into_inner);
            identity.worker_id = response.worker_id.clone();
            identity.heartbeat = heartbeat;
        }
        if let Some(exposition) = &self.exposition {
            exposition.set_worker(&response.worker_id);
        }
        self.gate.set_key(response.capability_key);
        let revoked = self.leases.revoke(&response.revoked);
        tracing::info!(
            worker_id = %response.worker_id,
            address = %self.config.advertise,
            heartbeat_ms = heartbeat.as_millis() as u64,
            lease_duration_ms = response.lease_duration_ms,
            revoked = revoked.len(),
            "{} with the dispatcher",
            if again { "registered again" } else { "registered" }
        );
        Ok(())
    }

    async fn register_until_done(&self) {
        let mut backoff = Backoff::new();
        let mut attempts = 0u32;
        loop {
            match self.register().await {
                Ok(()) => return,
                Err(status) => {
                    attempts += 1;
                    if attempts == 1 || attempts.is_multiple_of(50) {
                        tracing::warn!(
                            code = ?status.code(),
                            "cannot register with the dispatcher (retrying): {}",
                            status.message(),
                        );
                    }
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
    }

    /// Heartbeats forever: renews the held leases, sends the metrics, applies revocations and
    /// gone consumers, and registers again when the dispatcher forgot this worker.
    async fn heartbeats(self: Arc<Self>) {
        let mut sampler = Sampler::new();
        let mut backoff = Backoff::new();
        let mut failing = false;
        let mut wait = self.heartbeat_interval();
        loop {
            tokio::time::sleep(wait).await;
            let queued = self.queues.queued_jobs(MAX_QUEUED_JOBS);
            let request = WorkerHeartbeatRequest {
                worker_id: self.worker_id(),
                leases: self.leases.ids(),
                metrics: Some(self.metrics(&mut sampler)),
                queued: queued.into_iter().map(|(pipeline, job)| JobRef { pipeline, job }).collect(),
            };
            wait = match self.client().worker_heartbeat(request).await {
                Ok(response) => {
                    if failing {
                        tracing::info!("the dispatcher answers heartbeats again");
                    }
                    failing = false;
                    backoff.reset();
                    self.apply(response.into_inner());
                    self.heartbeat_interval()
                }
                Err(status) if status.code() == Code::NotFound => {
                    tracing::warn!(
                        "the dispatcher does not know this worker (it restarted?); registering again"
                    );
                    match self.register().await {
                        Ok(()) => {
                            backoff.reset();
                            self.heartbeat_interval()
                        }
                        Err(status) => {
                            tracing::warn!(
                                code = ?status.code(),
                                "cannot register again: {}",
                                status.message(),
                            );
                            backoff.next()
                        }
                    }
                }
                Err(status) => {
                    if !failing {
                        tracing::warn!(
                            code = ?status.code(),
                            "heartbeat failed (retrying): {}",
                            status.message(),
                        );
                    }
                    failing = true;
                    backoff.next()
                }
            };
        }
    }

    fn apply(&self, response: WorkerHeartbeatResponse) {
        let revoked = self.leases.revoke(&response.revoked);
        for lease in &revoked {
            tracing::info!(lease = lease.lease_id, epoch = lease.epoch, split = lease.split, "lease revoked");
        }
        let mut gone = HashSet::with_capacity(response.gone.len());
        for consumer in response.gone {
            let key = ConsumerKey {
                pipeline: consumer.pipeline,
                job: consumer.job,
                consumer_index: consumer.consumer_index,
            };
            self.queues.mark_gone(&key);
            gone.insert(key);
        }
        // The dispatcher names only the gone consumers of the jobs this worker produces for:
        // the other empty queues without a stream are no longer needed.
        let dropped = self.queues.sweep(&gone);
        if dropped > 0 {
            tracing::debug!(dropped, "idle consumer queues dropped");
        }
    }

    fn metrics(&self, sampler: &mut Sampler) -> WorkerMetrics {
        let stages: Vec<_> = self.producers().values().map(|p| p.stage_source()).collect();
        let compute_threads = stages.iter().map(|s| s.times.threads() as u64).sum();
        let read_depth = self.producers().values().map(|p| p.read_depth() as u64).sum();
        let taken = self.queues.taken();
        let totals = Totals {
            elements: self.counters.elements.load(Ordering::Relaxed),
            parts: taken.parts.load(Ordering::Relaxed),
            bytes: taken.bytes.load(Ordering::Relaxed),
            cache_read: self.counters.cache_bytes_read.load(Ordering::Relaxed),
            cache_written: self.counters.cache_bytes_written.load(Ordering::Relaxed),
            cache_fallbacks: self.counters.cache_fallback_splits.load(Ordering::Relaxed),
            cache_recomputed: self.counters.cache_recomputed.load(Ordering::Relaxed),
            skipped: self.counters.skipped.load(Ordering::Relaxed),
            ..Totals::default()
        };
        let sample = sampler.sample(Inputs {
            elements_total: totals.elements,
            parts_total: totals.parts,
            bytes_total: totals.bytes,
            buffered: self.queues.buffered(),
            active_leases: self.leases.len(),
            cores: self.config.cores,
            stages,
            finished: (
                self.counters.finish_nanos.load(Ordering::Relaxed),
                self.counters.finish_elements.load(Ordering::Relaxed),
            ),
        });
        if let Some(exposition) = &self.exposition {
            let totals = Totals {
                cpu_seconds: sampler.cpu_seconds(),
                stages: sampler.stage_totals().to_vec(),
                compute_threads,
                read_depth,
                ..totals
            };
            exposition.observe(&totals, &sample);
        }
        sample
    }

    /// Keeps the pacer's target of splits leased and computing until `stop`.
    async fn lease_splits(&self, stop: CancellationToken) {
        let mut backoff = Backoff::new();
        let mut pacer = Pacer::new(self.config.leases_ahead);
        while !stop.is_cancelled() {
            let asked_with = self.leases.producing();
            if asked_with >= pacer.target() {
                tokio::select! {
                    () = self.leases.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                    () = stop.cancelled() => {}
                }
                continue;
            }
            // Enabled before the backed-up jobs are read: a queue that drains after the request
            // wakes the wait below at once.
            let room = self.queues.room();
            tokio::pin!(room);
            room.as_mut().enable();
            let backed_up = self
                .queues
                .backed_up_jobs(MAX_QUEUED_JOBS)
                .into_iter()
                .map(|(pipeline, job)| JobRef { pipeline, job })
                .collect();
            // All the leases the target lacks, in one call: short splits then need a round trip
            // each only when the dispatcher has fewer to give.
            let max_leases = u32::try_from(pacer.target() - asked_with).unwrap_or(u32::MAX);
            let request = LeaseSplitRequest { worker_id: self.worker_id(), backed_up, max_leases };
            let wait = match self.client().lease_split(request).await {
                Ok(response) => {
                    backoff.reset();
                    let response = response.into_inner();
                    let leases: Vec<Lease> = response.lease.into_iter().chain(response.more).collect();
                    if leases.is_empty() {
                        match response.retry_after_ms {
                            0 => DEFAULT_RETRY,
                            ms => Duration::from_millis(u64::from(ms).clamp(10, 5_000)),
                        }
                    } else if stop.is_cancelled() {
                        for lease in leases {
                            self.leases.insert(lease.clone());
                            self.give_back(lease.lease_id).await;
                        }
                        return;
                    } else {
                        pacer.granted(asked_with, self.leases.producing());
                        let mut started = true;
                        for lease in leases {
                            started &= self.start(lease).await.is_ok();
                        }
                        if started {
                            continue;
                        }
                        backoff.next()
                    }
                }
                Err(status) => {
                    if status.code() != Code::NotFound {
                        tracing::debug!(code = ?status.code(), "LeaseSplit failed: {}", status.message());
                    }
                    backoff.next()
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = &mut room => {}
                () = stop.cancelled() => {}
            }
        }
    }

    /// Feeds a new lease to its pipeline's engine, opening the engine first when needed; gives
    /// the lease back when it cannot.
    async fn start(&self, lease: Lease) -> Result<(), ()> {
        let id = lease.lease_id;
        tracing::debug!(
            lease = id,
            pipeline = %lease.pipeline,
            job = %lease.job,
            epoch = lease.epoch,
            split = lease.split,
            parts = lease.parts.len(),
            "leased a split"
        );
        let revoked = self.leases.insert(lease.clone());
        let result = match self.producer_for(&lease).await {
            // Ids past the listing are further passes over it (see the executor).
            Ok(producer) if producer.splits() == 0 => Err(StartError::NoSplit {
                pipeline: lease.pipeline.clone(),
                split: lease.split,
                splits: producer.splits(),
            }),
            Ok(producer) => {
                if producer.submit(lease.clone(), revoked) {
                    Ok(())
                } else {
                    Err(StartError::Closed(lease.pipeline.clone()))
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::error!(
                    lease = id,
                    epoch = lease.epoch,
                    split = lease.split,
                    "cannot produce the split: {e}"
                );
                // An engine that cannot be built from the spec (a Python function that does not
                // import, a tokenizer file that is missing) will not build next time either: the
                // dispatcher counts it against the split, and fails the pipeline at the limit.
                // Anything else (the dispatcher unreachable) is given back without a cause.
                let permanent = matches!(
                    &e,
                    StartError::Producer(
                        ProducerError::Manifest { .. }
                            | ProducerError::Engine {
                                error: EngineError::Build { .. } | EngineError::Spec(_),
                                ..
                            }
                    )
                );
                self.return_lease(id, if permanent { e.to_string() } else { String::new() }).await;
                Err(())
            }
        }
    }

    /// The engine for the lease's pipeline, at the lease's generation or newer.
    async fn producer_for(&self, lease: &Lease) -> Result<Arc<Producer>, StartError> {
        self.producer_of(&lease.pipeline, lease.generation).await
    }

    /// The engine of `pipeline`, at `generation` or newer.
    async fn producer_of(&self, pipeline: &str, generation: u64) -> Result<Arc<Producer>, StartError> {
        let existing = self.producers().get(pipeline).cloned();
        if let Some(producer) = &existing
            && producer.generation() >= generation
        {
            return Ok(Arc::clone(producer));
        }
        let request = GetPipelineRequest { name: pipeline.to_string() };
        let info = self
            .client()
            .get_pipeline(request)
            .await
            .map_err(|status| StartError::Pipeline { pipeline: pipeline.to_string(), status })?
            .into_inner();
        if let Some(producer) = existing
            && producer.generation() >= info.generation
        {
            return Ok(producer);
        }
        self.limits.learn_json(&info.name, &info.manifest_json);
        let started = Instant::now();
        let sinks = Sinks {
            queues: Arc::clone(&self.queues),
            counters: Arc::clone(&self.counters),
            events: self.events.clone(),
        };
        let producer = Arc::new(Producer::open(&info, self.config.engine.clone(), sinks).await?);
        tracing::info!(
            pipeline = %info.name,
            generation = info.generation,
            splits = producer.splits(),
            seconds = started.elapsed().as_secs_f64(),
            "engine ready"
        );
        // A replaced engine finishes the splits it was fed, then ends.
        self.producers().insert(pipeline.to_string(), Arc::clone(&producer));
        Ok(producer)
    }

    /// Sends the autocacher's input (best effort: without it the dispatcher decides to compute).
    async fn report_cache_profile(&self, pipeline: String, generation: u64, profile: CacheProfile) {
        tracing::info!(
            %pipeline,
            elements = profile.sampled_elements,
            cuts = profile.boundaries.len(),
            read_mb_s = profile.read_bytes_per_second / 1e6,
            write_mb_s = profile.write_bytes_per_second / 1e6,
            error = %profile.error,
            "measured the cache profile"
        );
        let request = ReportCacheProfileRequest {
            worker_id: self.worker_id(),
            pipeline: pipeline.clone(),
            generation,
            profile: Some(profile),
        };
        if let Err(status) = self.client().report_cache_profile(request).await {
            tracing::warn!(%pipeline, "ReportCacheProfile failed: {}", status.message());
        }
    }

    /// Stops holding `id` and gives it back to the dispatcher (best effort: an unreturned lease
    /// expires).
    async fn give_back(&self, id: u64) {
        self.return_lease(id, String::new()).await;
    }

    /// Gives `id` back with why producing its split failed, which the dispatcher counts.
    async fn return_lease(&self, id: u64, error: String) {
        self.leases.produced(id);
        if self.leases.release(id).is_none() {
            return;
        }
        let request = ReturnLeaseRequest { worker_id: self.worker_id(), lease_id: id, error };
        if let Err(status) = self.client().return_lease(request).await {
            tracing::warn!(
                lease = id,
                code = ?status.code(),
                "cannot return the lease (it will expire): {}",
                status.message(),
            );
        }
    }

    async fn handle_events(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<Event>) {
        let mut completions = JoinSet::new();
        loop {
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else { return };
                    self.handle(event, &mut completions);
                }
                Some(_) = completions.join_next(), if !completions.is_empty() => {}
            }
        }
    }

    fn handle(self: &Arc<Self>, event: Event, completions: &mut JoinSet<()>) {
        match event {
            Event::Produced { lease_id, elements, delivered, cache, skipped } => {
                if let (Some(took), Some(exposition)) = (self.leases.produced(lease_id), &self.exposition) {
                    exposition.split_produced(took);
                }
                let agent = Arc::clone(self);
                completions.spawn(async move {
                    agent.complete(lease_id, elements, delivered, cache, skipped).await
                });
            }
            Event::Counted(counted) => {
                if let (Some(took), Some(exposition)) =
                    (self.leases.produced(counted.lease_id()), &self.exposition)
                {
                    exposition.split_produced(took);
                }
                let agent = Arc::clone(self);
                completions.spawn(async move { agent.count(counted).await });
            }
            Event::Abandoned { lease_id } => {
                self.leases.produced(lease_id);
            }
            Event::CacheProfile { pipeline, generation, profile } => {
                let agent = Arc::clone(self);
                completions
                    .spawn(async move { agent.report_cache_profile(pipeline, generation, profile).await });
            }
            Event::Failed { pipeline, generation, leases, culprit, error } => {
                tracing::error!(%pipeline, generation, leases = leases.len(), "the engine failed: {error}");
                {
                    let mut producers = self.producers();
                    if producers.get(&pipeline).is_some_and(|p| p.generation() == generation) {
                        producers.remove(&pipeline);
                    }
                }
                for id in leases {
                    let agent = Arc::clone(self);
                    // The split that failed is reported with its cause; the others only
                    // go back with the engine.
                    let error = if culprit == Some(id) { error.clone() } else { String::new() };
                    completions.spawn(async move { agent.return_lease(id, error).await });
                }
            }
        }
    }

    /// Reports a held split's count until the dispatcher answers with its parts, then delivers it
    /// on a blocking thread (routing copies tensors). A lease revoked or unknown meanwhile ends it.
    async fn count(&self, counted: CountedSplit) {
        let id = counted.lease_id();
        let mut backoff = Backoff::new();
        let mut not_found = 0;
        loop {
            if counted.revoked() || self.leases.get(id).is_none() {
                return counted.abandon();
            }
            let request =
                CountSplitRequest { worker_id: self.worker_id(), lease_id: id, elements: counted.elements() };
            let wait = match self.client().count_split(request).await {
                Ok(response) => {
                    let response = response.into_inner();
                    if response.ready {
                        let parts = response.parts;
                        if let Err(e) = tokio::task::spawn_blocking(move || counted.deliver(parts)).await {
                            tracing::error!(lease = id, "delivering a counted split failed: {e}");
                        }
                        return;
                    }
                    backoff.reset();
                    Duration::from_millis(u64::from(response.retry_after_ms).clamp(5, 1_000))
                }
                Err(status)
                    if retryable(&status)
                        || (status.code() == Code::NotFound && not_found < COMPLETE_NOT_FOUND_ATTEMPTS) =>
                {
                    if status.code() == Code::NotFound {
                        not_found += 1;
                    }
                    tracing::debug!(lease = id, code = ?status.code(), "CountSplit failed (retrying): {}", status.message());
                    backoff.next()
                }
                Err(status) => {
                    tracing::warn!(lease = id, code = ?status.code(), "CountSplit refused: {}", status.message());
                    self.leases.release(id);
                    return counted.abandon();
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Once the split's ends were taken by every consumer stream, tells the dispatcher.
    async fn complete(
        &self,
        id: u64,
        elements: u64,
        delivered: Delivered,
        cache: CacheOutcome,
        skipped: crate::executor::Skips,
    ) {
        delivered.wait().await;
        let mut backoff = Backoff::new();
        let mut not_found = 0;
        loop {
            let Some(lease) = self.leases.get(id) else {
                return; // revoked or returned meanwhile
            };
            let request = CompleteSplitRequest {
                worker_id: self.worker_id(),
                lease_id: id,
                pipeline: lease.pipeline.clone(),
                job: lease.job.clone(),
                epoch: lease.epoch,
                split: lease.split,
                elements,
                cache: Some(cache.clone()),
                skipped: skipped.elements,
                skip_error: skipped.first.clone().unwrap_or_default(),
            };
            match self.client().complete_split(request).await {
                Ok(_) => {
                    self.leases.release(id);
                    tracing::debug!(
                        lease = id,
                        epoch = lease.epoch,
                        split = lease.split,
                        elements,
                        "split complete"
                    );
                    return;
                }
                Err(status)
                    if retryable(&status)
                        || (status.code() == Code::NotFound && not_found < COMPLETE_NOT_FOUND_ATTEMPTS) =>
                {
                    if status.code() == Code::NotFound {
                        not_found += 1;
                    }
                    tracing::debug!(
                        lease = id,
                        code = ?status.code(),
                        "CompleteSplit failed (retrying): {}",
                        status.message(),
                    );
                    tokio::time::sleep(backoff.next()).await;
                }
                Err(status) => {
                    tracing::warn!(
                        lease = id,
                        split = lease.split,
                        code = ?status.code(),
                        "CompleteSplit refused: {}",
                        status.message(),
                    );
                    self.leases.release(id);
                    return;
                }
            }
        }
    }

    /// Waits up to the drain timeout for the held leases to complete, then returns the rest.
    async fn drain(&self) {
        let held = self.leases.len();
        if held > 0 {
            tracing::info!(
                leases = held,
                timeout_s = self.config.drain_timeout.as_secs_f64(),
                "finishing the held leases"
            );
        }
        let deadline = tokio::time::Instant::now() + self.config.drain_timeout;
        while !self.leases.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::select! {
                () = self.leases.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
        let rest = self.leases.revoke(&self.leases.ids());
        if !rest.is_empty() {
            tracing::warn!(leases = rest.len(), "drain timed out; returning the unfinished leases");
        }
        for lease in rest {
            self.leases.produced(lease.lease_id);
            let request = ReturnLeaseRequest {
                worker_id: self.worker_id(),
                lease_id: lease.lease_id,
                error: String::new(),
            };
            if let Err(status) = self.client().return_lease(request).await {
                tracing::warn!(
                    lease = lease.lease_id,
                    code = ?status.code(),
                    "cannot return the lease: {}",
                    status.message(),
                );
            }
        }
    }
}

/// Failures worth retrying: the dispatcher is unreachable, restarting or overloaded.
fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
    )
}
