//! The dispatcher as a process component: the state behind a lock, the journal, the catalog, the
//! gRPC service over them, and the liveness ticker.

use crate::catalog::Catalog;
use crate::journal::{Journal, JournalError};
use crate::state::{
    CacheReport, DispatchError, Event, JobProgress, MetricsSnapshot, PipelineFacts, State, Timing,
};
use granary_crds::Manifest;
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_server::{self, DispatcherServer};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// Dispatcher settings.
#[derive(Clone, Debug, Default)]
pub struct DispatcherConfig {
    /// Journal URL or local path; none keeps state in memory only.
    pub journal: Option<String>,
    /// Liveness timing.
    pub timing: Timing,
    /// Most bytes the entries of one cache store may take together (every pipeline's); the
    /// least recently used entries not in use are evicted past it. `None`: no store-wide budget.
    pub cache_max_bytes: Option<u64>,
}

/// A failure starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    /// The journal could not be opened or read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The gRPC server failed.
    #[error("dispatcher server: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// A pipeline could not be registered.
    #[error(transparent)]
    Refused(#[from] DispatchError),
}

pub(crate) struct Inner {
    state: Mutex<State>,
    journal: Option<tokio::sync::Mutex<Journal>>,
    catalog: Arc<dyn Catalog>,
    start: Instant,
    /// `DispatcherConfig::cache_max_bytes`.
    pub(crate) cache_max_bytes: Option<u64>,
    /// Journal appends that succeeded and that failed.
    journal_writes: [std::sync::atomic::AtomicU64; 2],
    /// Held by the eviction pass: one at a time.
    pub(crate) evicting: tokio::sync::Mutex<()>,
}

/// The dispatcher: cheap to clone, shared by the gRPC service and its host.
#[derive(Clone)]
pub struct Dispatcher {
    pub(crate) inner: Arc<Inner>,
}

impl Dispatcher {
    /// Opens the journal (replaying what it holds) and builds the dispatcher.
    pub async fn new(
        config: DispatcherConfig,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Dispatcher, DispatcherError> {
        let id_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64 & 0xffff_ffff_ffff);
        let mut state = State::new(config.timing, id_base);
        let journal = match &config.journal {
            Some(url) => {
                let (journal, events) = Journal::open(url).await?;
                for event in &events {
                    state.apply(event);
                }
                if !events.is_empty() {
                    tracing::info!(events = events.len(), "dispatcher state recovered from the journal");
                }
                Some(tokio::sync::Mutex::new(journal))
            }
            None => None,
        };
        Ok(Dispatcher {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                journal,
                catalog,
                start: Instant::now(),
                cache_max_bytes: config.cache_max_bytes,
                journal_writes: Default::default(),
                evicting: tokio::sync::Mutex::new(()),
            }),
        })
    }

    fn now(&self) -> u64 {
        self.inner.start.elapsed().as_millis() as u64
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a state that is still consistent per request.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the state and journals the events it produced before returning; touches the
    /// cache entries pipelines started reading.
    pub(crate) async fn mutate<T>(
        &self,
        f: impl FnOnce(&mut State, u64) -> Result<T, DispatchError>,
    ) -> Result<T, Status> {
        let now = self.now();
        let (result, events, touches) = {
            let mut state = self.state();
            let result = f(&mut state, now);
            (result, state.take_events(), state.take_cache_touches())
        };
        self.touch_entries(touches);
        self.persist(events).await;
        result.map_err(status)
    }

    async fn persist(&self, events: Vec<Event>) {
        let Some(journal) = &self.inner.journal else { return };
        if events.is_empty() {
            return;
        }
        let mut journal = journal.lock().await;
        let appended = journal.append(&events).await;
        let outcome = usize::from(appended.is_err());
        self.inner.journal_writes[outcome].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = appended {
            tracing::error!("cannot journal dispatcher state: {e}");
            return;
        }
        if journal.wants_compaction() {
            let all = self.state().snapshot_events();
            if let Err(e) = journal.compact(all).await {
                tracing::error!("cannot compact the journal: {e}");
            }
        }
    }

    /// Registers `manifest` under `name` (counting its splits' elements through the catalog).
    pub async fn register(
        &self,
        name: &str,
        manifest: &Manifest,
    ) -> Result<pb::PipelineInfo, DispatcherError> {
        let catalog = Arc::clone(&self.inner.catalog);
        let m = manifest.clone();
        let counts = tokio::task::spawn_blocking(move || catalog.describe(&m))
            .await
            .map_err(|e| DispatchError::FailedPrecondition(format!("listing the source failed: {e}")))?
            .map_err(|e| DispatchError::InvalidArgument(format!("pipeline `{name}`: {e}")))?;
        let spec = &manifest.pipeline.spec;
        let manifest_json = serde_json::to_string(&manifest.pipeline)
            .map_err(|e| DispatchError::InvalidArgument(format!("pipeline `{name}`: {e}")))?;
        let facts = PipelineFacts {
            manifest_json,
            base_dir: manifest.base_dir.display().to_string(),
            counts,
            batch: u64::from(spec.batch.size.max(1)),
            epochs: spec.epochs,
            drop_remainder: spec.batch.drop_remainder,
            shuffle: spec.shuffle.as_ref().is_some_and(|s| s.buffer > 0),
            seed: spec.seed,
        };
        self.mutate(|s, _| s.register_pipeline(name, facts))
            .await
            .map_err(|st| DispatchError::InvalidArgument(st.message().to_string()))?;
        Ok(self.state().pipeline_info(name)?)
    }

    /// Removes a pipeline and its progress (journaled); unknown names are ignored.
    pub async fn unregister(&self, name: &str) {
        let _ = self
            .mutate(|s, _| {
                s.unregister_pipeline(name);
                Ok(())
            })
            .await;
    }

    /// Journal appends so far: `(succeeded, failed)`; `None` without a journal.
    pub fn journal_writes(&self) -> Option<(u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let [ok, failed] = &self.inner.journal_writes;
        self.inner.journal.as_ref().map(|_| (ok.load(Relaxed), failed.load(Relaxed)))
    }

    /// Lease outcomes of `pipeline` since this dispatcher started.
    pub fn split_counts(&self, pipeline: &str) -> crate::SplitCounts {
        self.state().split_counts(pipeline)
    }

    /// Worker registrations and losses of `pipeline` since this dispatcher started.
    pub fn worker_counts(&self, pipeline: &str) -> crate::WorkerCounts {
        self.state().worker_counts(pipeline)
    }

    /// What the trainers of each job of `pipeline` reported: `(job, totals)`.
    pub fn trainer_totals(&self, pipeline: &str) -> Vec<(String, crate::TrainerTotals)> {
        self.state().trainer_totals(pipeline)
    }

    /// The metrics endpoints (`host:port`) of the registered workers, for service discovery.
    pub fn metrics_targets(&self) -> Vec<String> {
        self.state().metrics_targets()
    }

    /// Names of the registered pipelines.
    pub fn pipelines(&self) -> Vec<String> {
        self.state().pipeline_names()
    }

    /// Jobs of a pipeline and how far they are.
    pub fn progress(&self, pipeline: &str) -> Vec<JobProgress> {
        self.state().progress(pipeline)
    }

    /// Why a pipeline failed, if it did.
    pub fn failure(&self, pipeline: &str) -> Option<String> {
        self.state().failure(pipeline)
    }

    /// Latest worker and consumer metrics of a pipeline.
    pub fn snapshot(&self, pipeline: &str) -> MetricsSnapshot {
        self.state().snapshot(pipeline)
    }

    /// Workers registered for a pipeline.
    pub fn workers(&self, pipeline: &str) -> Vec<pb::WorkerInfo> {
        self.state().workers_of(pipeline)
    }

    /// How many splits and epochs a registered pipeline has.
    pub fn shape(&self, pipeline: &str) -> Option<(u64, u32)> {
        self.state().pipeline_info(pipeline).ok().map(|info| (info.splits, info.epochs))
    }

    /// What the autocacher decided for a pipeline and what the cache did in each epoch.
    pub fn cache_report(&self, pipeline: &str) -> Option<CacheReport> {
        self.state().cache_report(pipeline)
    }

    /// The gRPC service, to add to a tonic server.
    pub fn service(&self) -> DispatcherServer<Dispatcher> {
        DispatcherServer::new(self.clone())
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(granary_proto::MAX_MESSAGE_BYTES)
    }

    /// Serves the gRPC API on `listener` until `shutdown` resolves, expiring silent workers and
    /// consumers as time passes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), DispatcherError> {
        let ticker = {
            let me = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    let now = me.now();
                    me.state().expire(now);
                }
            })
        };
        let evictor = {
            let me = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(crate::cache_io::EVICTION_PERIOD);
                loop {
                    tick.tick().await;
                    if me.state().caching() {
                        me.evict_caches().await;
                    }
                }
            })
        };
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let result = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_adaptive_window(Some(true))
            .add_service(self.service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        ticker.abort();
        evictor.abort();
        result.map_err(DispatcherError::from)
    }
}

/// Largest request the dispatcher accepts; its requests are small.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

pub(crate) fn status(e: DispatchError) -> Status {
    match e {
        DispatchError::NotFound(m) => Status::not_found(m),
        DispatchError::InvalidArgument(m) => Status::invalid_argument(m),
        DispatchError::FailedPrecondition(m) => Status::failed_precondition(m),
        DispatchError::ResourceExhausted(m) => Status::resource_exhausted(m),
    }
}

pub(crate) fn require(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("`{field}` is empty")));
    }
    Ok(())
}

#[tonic::async_trait]
impl dispatcher_server::Dispatcher for Dispatcher {
    async fn register_pipeline(
        &self,
        request: Request<pb::RegisterPipelineRequest>,
    ) -> Result<Response<pb::RegisterPipelineResponse>, Status> {
        let req = request.into_inner();
        require("name", &req.name)?;
        let pipeline: granary_crds::InputPipeline = serde_json::from_str(&req.manifest_json)
            .map_err(|e| Status::invalid_argument(format!("`manifest_json` is not an InputPipeline: {e}")))?;
        let problems = granary_crds::validate(&pipeline.spec);
        if !problems.is_empty() {
            return Err(Status::invalid_argument(format!(
                "invalid spec:\n{}",
                granary_crds::Problems(problems)
            )));
        }
        let manifest = Manifest { pipeline, base_dir: req.base_dir.into() };
        let info = self.register(&req.name, &manifest).await.map_err(|e| match e {
            DispatcherError::Refused(d) => status(d),
            other => Status::internal(other.to_string()),
        })?;
        Ok(Response::new(pb::RegisterPipelineResponse { pipeline: Some(info) }))
    }

    async fn get_pipeline(
        &self,
        request: Request<pb::GetPipelineRequest>,
    ) -> Result<Response<pb::PipelineInfo>, Status> {
        let req = request.into_inner();
        require("name", &req.name)?;
        self.state().pipeline_info(&req.name).map(Response::new).map_err(status)
    }

    async fn register_worker(
        &self,
        request: Request<pb::RegisterWorkerRequest>,
    ) -> Result<Response<pb::RegisterWorkerResponse>, Status> {
        let req = request.into_inner();
        let (worker_id, revoked) = self.mutate(|s, now| s.register_worker(&req, now)).await?;
        let timing = self.state().timing();
        tracing::info!(worker = %worker_id, address = %req.address, "worker registered");
        Ok(Response::new(pb::RegisterWorkerResponse {
            worker_id,
            heartbeat_interval_ms: timing.heartbeat_ms,
            lease_duration_ms: timing.lease_ms as u32,
            revoked,
        }))
    }

    async fn worker_heartbeat(
        &self,
        request: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        self.mutate(|s, now| s.worker_heartbeat(&req, now)).await.map(Response::new)
    }

    async fn lease_split(
        &self,
        request: Request<pb::LeaseSplitRequest>,
    ) -> Result<Response<pb::LeaseSplitResponse>, Status> {
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        let lease = self.mutate(|s, now| s.lease(&req.worker_id, now)).await?;
        let retry_after_ms = if lease.is_some() { 0 } else { 50 };
        Ok(Response::new(pb::LeaseSplitResponse { lease, retry_after_ms }))
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        let revoked = self.mutate(|s, now| s.renew(&req.worker_id, &req.leases, now)).await?;
        Ok(Response::new(pb::RenewLeaseResponse { revoked }))
    }

    async fn complete_split(
        &self,
        request: Request<pb::CompleteSplitRequest>,
    ) -> Result<Response<pb::CompleteSplitResponse>, Status> {
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        self.mutate(|s, _| s.complete(&req)).await?;
        Ok(Response::new(pb::CompleteSplitResponse {}))
    }

    async fn return_lease(
        &self,
        request: Request<pb::ReturnLeaseRequest>,
    ) -> Result<Response<pb::ReturnLeaseResponse>, Status> {
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        self.mutate(|s, _| s.give_back(&req.worker_id, req.lease_id)).await?;
        Ok(Response::new(pb::ReturnLeaseResponse {}))
    }

    async fn register_client(
        &self,
        request: Request<pb::RegisterClientRequest>,
    ) -> Result<Response<pb::RegisterClientResponse>, Status> {
        let req = request.into_inner();
        self.mutate(|s, now| s.register_client(&req, now)).await.map(Response::new)
    }

    async fn client_heartbeat(
        &self,
        request: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        let req = request.into_inner();
        require("client_id", &req.client_id)?;
        self.mutate(|s, now| s.client_heartbeat(&req, now)).await.map(Response::new)
    }

    async fn get_epoch_plan(
        &self,
        request: Request<pb::GetEpochPlanRequest>,
    ) -> Result<Response<pb::EpochPlan>, Status> {
        let req = request.into_inner();
        require("pipeline", &req.pipeline)?;
        self.mutate(|s, _| s.epoch_plan(&req)).await.map(Response::new)
    }

    async fn request_replay(
        &self,
        request: Request<pb::RequestReplayRequest>,
    ) -> Result<Response<pb::RequestReplayResponse>, Status> {
        let req = request.into_inner();
        require("client_id", &req.client_id)?;
        let queued = self.mutate(|s, _| s.request_replay(&req)).await?;
        if !queued.is_empty() {
            tracing::info!(job = %req.job, consumer = req.consumer_index, epoch = req.epoch, ?queued, "replaying splits for a consumer");
        }
        Ok(Response::new(pb::RequestReplayResponse { queued }))
    }

    async fn list_workers(
        &self,
        request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let req = request.into_inner();
        Ok(Response::new(pb::ListWorkersResponse { workers: self.state().workers_of(&req.pipeline) }))
    }

    async fn report_cache_profile(
        &self,
        request: Request<pb::ReportCacheProfileRequest>,
    ) -> Result<Response<pb::ReportCacheProfileResponse>, Status> {
        self.cache_profile(request.into_inner()).await?;
        Ok(Response::new(pb::ReportCacheProfileResponse {}))
    }
}
