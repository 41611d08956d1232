//! The dispatcher's gRPC face: the tonic service over [`Dispatcher`], each request's fields
//! checked at the edge, and the server that runs it with the liveness and eviction tickers.

use crate::access::Caller;
use crate::cache_io::EVICTION_PERIOD;
use crate::service::{Dispatcher, DispatcherError, status};
use granary_crds::Manifest;
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_server::{self, DispatcherServer};
use granary_security::Role;
use std::time::Duration;
use tonic::{Request, Response, Status};

impl Dispatcher {
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
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = &self.inner.tls {
            let config = tls.server().ok_or(DispatcherError::NoCertificate)?;
            server = server.tls_config(config.timeout(TLS_HANDSHAKE_TIMEOUT))?;
        }
        let ticker = {
            let me = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    // Through `mutate`: collecting a job is journaled.
                    let _ = me
                        .mutate(|s, now| {
                            s.expire(now);
                            Ok(())
                        })
                        .await;
                }
            })
        };
        let evictor = {
            let me = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(EVICTION_PERIOD);
                loop {
                    tick.tick().await;
                    if me.state().caching() {
                        me.evict_caches().await;
                    }
                }
            })
        };
        // TCP_NODELAY on the accepted sockets themselves: the builder's `tcp_nodelay` is ignored
        // with an incoming stream, and without it every answer written in two parts waited for
        // the client's delayed ACK (40 ms per call on Linux).
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let result = server
            .timeout(REQUEST_TIMEOUT)
            .concurrency_limit_per_connection(MAX_CONCURRENT_PER_CONNECTION)
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .http2_max_header_list_size(MAX_HEADER_BYTES)
            .http2_adaptive_window(Some(true))
            .add_service(self.service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        ticker.abort();
        evictor.abort();
        result.map_err(DispatcherError::from)
    }
}

/// Longest one request may take before it is answered DEADLINE_EXCEEDED: every dispatcher
/// request is short (none streams).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests one connection may have in flight at once; more wait.
pub const MAX_CONCURRENT_PER_CONNECTION: usize = 256;

/// HTTP/2 streams one connection may open at once: requests past
/// [`MAX_CONCURRENT_PER_CONNECTION`] wait in the server, streams past this are refused by the
/// peer's own HTTP/2 stack, so a client cannot make the server hold unbounded stream state.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 512;

/// Idle connections are pinged this often and closed when a ping goes unanswered for
/// [`KEEPALIVE_TIMEOUT`]: a client that vanished does not hold its connection forever.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest header block of a request: a bearer token and the gRPC headers fit many times over.
pub const MAX_HEADER_BYTES: u32 = 64 << 10;

/// Longest worker id or worker address the dispatcher keeps (addresses are `host:port`).
const MAX_WORKER_FIELD_BYTES: usize = 1024;

/// Longest a TLS handshake may take: a client that connects and stalls is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest request the dispatcher accepts; its requests are small.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// How long a worker waits before asking again for the parts of a split it counted while the
/// splits before it in the epoch are still being computed: short, because it holds the output.
const COUNT_RETRY_MS: u32 = 20;
/// The most splits one `LeaseSplit` call grants (`max_leases` above it is cut to it).
pub const MAX_LEASES_PER_CALL: u32 = 16;

impl Dispatcher {
    /// Who made `request`, with what it may do; UNAUTHENTICATED when authentication is on and
    /// it carries no valid credentials.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller<'_>, Status> {
        let access = self.inner.access.as_ref();
        let who = access.map(|a| a.principal(request)).transpose()?;
        Ok(Caller { access, who })
    }

    /// Drops the access bindings of workers, sessions and jobs gone from the state, once they
    /// grew large.
    fn prune_access(&self) {
        if let Some(access) = &self.inner.access
            && access.crowded()
        {
            let live = self.state().live_ids();
            access.prune(&live);
        }
    }
}

/// Refuses an empty required field, naming it.
fn require(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("`{field}` is empty")));
    }
    Ok(())
}

/// Refuses a field longer than `limit` bytes, naming it and the limit.
fn bounded(field: &str, value: &str, limit: usize) -> Result<(), Status> {
    if value.len() > limit {
        return Err(Status::invalid_argument(format!(
            "`{field}` is {} bytes long; at most {limit} are accepted: use a shorter one",
            value.len()
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl dispatcher_server::Dispatcher for Dispatcher {
    async fn register_pipeline(
        &self,
        request: Request<pb::RegisterPipelineRequest>,
    ) -> Result<Response<pb::RegisterPipelineResponse>, Status> {
        self.caller(&request)?.owner("registering a pipeline")?;
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
            DispatcherError::Halted(why) => {
                Status::unavailable(format!("the dispatcher stopped serving: {why}"))
            }
            other => Status::internal(other.to_string()),
        })?;
        Ok(Response::new(pb::RegisterPipelineResponse { pipeline: Some(info) }))
    }

    async fn get_pipeline(
        &self,
        request: Request<pb::GetPipelineRequest>,
    ) -> Result<Response<pb::PipelineInfo>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("name", &req.name)?;
        caller.covers(&req.name, &[Role::Worker, Role::Trainer], "reading this pipeline")?;
        self.state().pipeline_info(&req.name).map(Response::new).map_err(status)
    }

    async fn register_worker(
        &self,
        request: Request<pb::RegisterWorkerRequest>,
    ) -> Result<Response<pb::RegisterWorkerResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        bounded("worker_id", &req.worker_id, MAX_WORKER_FIELD_BYTES)?;
        bounded("address", &req.address, MAX_WORKER_FIELD_BYTES)?;
        bounded("metrics_address", &req.metrics_address, MAX_WORKER_FIELD_BYTES)?;
        bounded("pipeline", &req.pipeline, crate::state::MAX_JOB_NAME_BYTES)?;
        caller.register_worker(&req.worker_id, &req.pipeline)?;
        self.prune_access();
        let (worker_id, revoked) = self.mutate(|s, now| s.register_worker(&req, now)).await?;
        caller.bind_worker(&worker_id)?;
        let timing = self.state().timing();
        tracing::info!(worker = %worker_id, address = %req.address, "worker registered");
        Ok(Response::new(pb::RegisterWorkerResponse {
            worker_id,
            heartbeat_interval_ms: timing.heartbeat_ms,
            lease_duration_ms: timing.lease_ms as u32,
            revoked,
            capability_key: self.inner.access.as_ref().map(|a| a.capability_key()).unwrap_or_default(),
        }))
    }

    async fn worker_heartbeat(
        &self,
        request: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let caller = self.caller(&request)?;
        let mut req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        // Only the jobs of pipelines the caller may serve are answered for.
        req.queued.retain(|j| caller.covers(&j.pipeline, &[Role::Worker], "").is_ok());
        self.mutate(|s, now| s.worker_heartbeat(&req, now)).await.map(Response::new)
    }

    async fn lease_split(
        &self,
        request: Request<pb::LeaseSplitRequest>,
    ) -> Result<Response<pb::LeaseSplitResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        // With nothing to lease, the call waits up to `Timing::lease_wait_ms` for work to become
        // leasable (a consumer moving to a new epoch, asking for data, a split given back), so
        // that the worker hears of it at once rather than at its next try. A worker that reports
        // backed-up jobs is answered at once: it asks again when its queues drain.
        let wait = Duration::from_millis(self.state().timing.lease_wait_ms);
        let deadline = tokio::time::Instant::now() + wait;
        let wanted = req.max_leases.clamp(1, MAX_LEASES_PER_CALL) as usize;
        loop {
            let wake = self.inner.leasable.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            // Every split granted by one call is journaled as one group, and answered at once.
            let mut leases = self
                .mutate(|s, now| {
                    let mut leases = Vec::new();
                    while leases.len() < wanted {
                        match s.lease_avoiding(&req.worker_id, &req.backed_up, now) {
                            Ok(Some(lease)) => leases.push(lease),
                            Ok(None) => break,
                            Err(e) if leases.is_empty() => return Err(e),
                            // The leases granted already are answered, not dropped.
                            Err(_) => break,
                        }
                    }
                    Ok(leases)
                })
                .await?
                .into_iter();
            if let Some(lease) = leases.next() {
                let more = leases.collect();
                return Ok(Response::new(pb::LeaseSplitResponse {
                    lease: Some(lease),
                    retry_after_ms: 0,
                    more,
                }));
            }
            let none = |retry_after_ms| {
                Response::new(pb::LeaseSplitResponse { retry_after_ms, ..Default::default() })
            };
            if !req.backed_up.is_empty() {
                return Ok(none(50));
            }
            if tokio::time::timeout_at(deadline, wake).await.is_err() {
                return Ok(none(10));
            }
        }
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        let revoked = self.mutate(|s, now| s.renew(&req.worker_id, &req.leases, now)).await?;
        Ok(Response::new(pb::RenewLeaseResponse { revoked }))
    }

    async fn complete_split(
        &self,
        request: Request<pb::CompleteSplitRequest>,
    ) -> Result<Response<pb::CompleteSplitResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        caller.covers(&req.pipeline, &[Role::Worker], "completing a split")?;
        // The worker reports this after its consumers took the split: nothing waits on it.
        self.mutate_batched(|s, _| s.complete(&req)).await?;
        Ok(Response::new(pb::CompleteSplitResponse {}))
    }

    async fn count_split(
        &self,
        request: Request<pb::CountSplitRequest>,
    ) -> Result<Response<pb::CountSplitResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        let parts = self.mutate(|s, _| s.count_split(&req.worker_id, req.lease_id, req.elements)).await?;
        Ok(Response::new(match parts {
            Some(parts) => pb::CountSplitResponse { ready: true, parts, retry_after_ms: 0 },
            None => {
                pb::CountSplitResponse { ready: false, parts: Vec::new(), retry_after_ms: COUNT_RETRY_MS }
            }
        }))
    }

    async fn return_lease(
        &self,
        request: Request<pb::ReturnLeaseRequest>,
    ) -> Result<Response<pb::ReturnLeaseResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        let error = (!req.error.is_empty()).then_some(req.error.as_str());
        self.mutate(|s, _| s.give_back(&req.worker_id, req.lease_id, error)).await?;
        Ok(Response::new(pb::ReturnLeaseResponse {}))
    }

    async fn register_client(
        &self,
        request: Request<pb::RegisterClientRequest>,
    ) -> Result<Response<pb::RegisterClientResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let job = if req.job.is_empty() { &req.pipeline } else { &req.job };
        self.prune_access();
        caller.join_job(&req.pipeline, job)?;
        let mut response = self.mutate(|s, now| s.register_client(&req, now)).await?;
        self.inner.arrivals.arrived(&req.pipeline);
        caller.bind_client(&response.client_id)?;
        if let Some(access) = &self.inner.access {
            let (capability, expires) =
                access.capability(&req.pipeline, &response.job, response.consumer_index);
            response.capability = capability;
            response.capability_expires_ms = expires;
        }
        Ok(Response::new(response))
    }

    async fn client_heartbeat(
        &self,
        request: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("client_id", &req.client_id)?;
        caller.as_client(&req.client_id)?;
        caller.covers(&req.pipeline, &[Role::Trainer], "a trainer's heartbeat")?;
        let mut response = self.mutate(|s, now| s.client_heartbeat(&req, now)).await?;
        if let Some(access) = &self.inner.access {
            let (capability, expires) = access.capability(&req.pipeline, &req.job, req.consumer_index);
            response.capability = capability;
            response.capability_expires_ms = expires;
        }
        Ok(Response::new(response))
    }

    async fn get_epoch_plan(
        &self,
        request: Request<pb::GetEpochPlanRequest>,
    ) -> Result<Response<pb::EpochPlan>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("pipeline", &req.pipeline)?;
        caller.covers(&req.pipeline, &[Role::Trainer], "reading an epoch plan")?;
        self.mutate(|s, _| s.epoch_plan(&req)).await.map(Response::new)
    }

    async fn request_replay(
        &self,
        request: Request<pb::RequestReplayRequest>,
    ) -> Result<Response<pb::RequestReplayResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("client_id", &req.client_id)?;
        caller.as_client(&req.client_id)?;
        caller.covers(&req.pipeline, &[Role::Trainer], "asking for a replay")?;
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
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        caller.covers(&req.pipeline, &[Role::Worker, Role::Trainer], "listing this pipeline's workers")?;
        Ok(Response::new(pb::ListWorkersResponse { workers: self.state().workers_of(&req.pipeline) }))
    }

    async fn report_cache_profile(
        &self,
        request: Request<pb::ReportCacheProfileRequest>,
    ) -> Result<Response<pb::ReportCacheProfileResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        require("worker_id", &req.worker_id)?;
        caller.as_worker(&req.worker_id)?;
        require("pipeline", &req.pipeline)?;
        caller.covers(&req.pipeline, &[Role::Worker], "reporting a cache profile")?;
        let Some(profile) = req.profile else {
            return Err(Status::invalid_argument("`profile` is missing"));
        };
        self.cache_profile(req.pipeline, req.generation, profile).await?;
        Ok(Response::new(pb::ReportCacheProfileResponse {}))
    }
}
