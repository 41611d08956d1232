//! A fake dispatcher: one pipeline, the same plan every epoch, and a record of every call.

use std::sync::{Arc, Mutex};

use granary_proto::v1::dispatcher_server::{Dispatcher, DispatcherServer};
use granary_proto::v1::*;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

/// `(split, lo, hi)`: one part of a slot.
pub type SplitRange = (u64, u64, u64);

/// What the fake dispatcher knows and what it was told.
#[derive(Debug, Default)]
pub struct State {
    pub pipeline: String,
    pub epochs: u32,
    /// Slots of every epoch.
    pub plan: Vec<(u64, Vec<SplitRange>)>,
    pub workers: Vec<String>,
    pub heartbeat_ms: u32,
    pub registrations: Vec<RegisterClientRequest>,
    pub heartbeats: Vec<ClientHeartbeatRequest>,
    pub replays: Vec<RequestReplayRequest>,
    /// Answer the next heartbeat with NOT_FOUND, as a restarted dispatcher does.
    pub forget: bool,
    /// Told about every replay request.
    pub on_replay: Option<mpsc::UnboundedSender<RequestReplayRequest>>,
}

/// The fake dispatcher service.
#[derive(Debug, Clone)]
pub struct FakeDispatcher(pub Arc<Mutex<State>>);

impl FakeDispatcher {
    /// Serves `state` on a free port; returns the address, the shared state, and a sender
    /// that stops the server.
    pub async fn serve(state: State) -> (String, Arc<Mutex<State>>, oneshot::Sender<()>) {
        let state = Arc::new(Mutex::new(state));
        let (listener, address) = super::listen().await;
        let service = DispatcherServer::new(FakeDispatcher(Arc::clone(&state)));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
            super::incoming(listener),
            async move {
                let _ = stopped.await;
            },
        ));
        (address.to_string(), state, stop)
    }

    fn workers(&self) -> Vec<WorkerInfo> {
        let state = self.0.lock().unwrap();
        state
            .workers
            .iter()
            .enumerate()
            .map(|(i, address)| WorkerInfo { worker_id: format!("w{i}"), address: address.clone() })
            .collect()
    }
}

#[tonic::async_trait]
impl Dispatcher for FakeDispatcher {
    async fn register_pipeline(
        &self,
        _: Request<RegisterPipelineRequest>,
    ) -> Result<Response<RegisterPipelineResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_pipeline(&self, _: Request<GetPipelineRequest>) -> Result<Response<PipelineInfo>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn register_worker(
        &self,
        _: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn worker_heartbeat(
        &self,
        _: Request<WorkerHeartbeatRequest>,
    ) -> Result<Response<WorkerHeartbeatResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease_split(
        &self,
        _: Request<LeaseSplitRequest>,
    ) -> Result<Response<LeaseSplitResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn renew_lease(
        &self,
        _: Request<RenewLeaseRequest>,
    ) -> Result<Response<RenewLeaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn complete_split(
        &self,
        _: Request<CompleteSplitRequest>,
    ) -> Result<Response<CompleteSplitResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn count_split(
        &self,
        _: Request<CountSplitRequest>,
    ) -> Result<Response<CountSplitResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn return_lease(
        &self,
        _: Request<ReturnLeaseRequest>,
    ) -> Result<Response<ReturnLeaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn register_client(
        &self,
        request: Request<RegisterClientRequest>,
    ) -> Result<Response<RegisterClientResponse>, Status> {
        let request = request.into_inner();
        let workers = self.workers();
        let mut state = self.0.lock().unwrap();
        if request.pipeline != state.pipeline {
            return Err(Status::not_found(format!("unknown pipeline `{}`", request.pipeline)));
        }
        state.forget = false;
        state.registrations.push(request.clone());
        let job = if request.job.is_empty() { request.pipeline.clone() } else { request.job.clone() };
        Ok(Response::new(RegisterClientResponse {
            client_id: format!("client-{}", state.registrations.len()),
            job,
            consumer_index: request.consumer_index.unwrap_or(0),
            num_consumers: request.num_consumers.max(1),
            mode: request.mode,
            epochs: state.epochs,
            batch_size: 4,
            heartbeat_interval_ms: state.heartbeat_ms,
            plan_fingerprint: 42,
            workers,
            ..Default::default()
        }))
    }

    async fn client_heartbeat(
        &self,
        request: Request<ClientHeartbeatRequest>,
    ) -> Result<Response<ClientHeartbeatResponse>, Status> {
        let workers = self.workers();
        let mut state = self.0.lock().unwrap();
        if state.forget {
            return Err(Status::not_found("unknown client"));
        }
        state.heartbeats.push(request.into_inner());
        Ok(Response::new(ClientHeartbeatResponse { workers, ..Default::default() }))
    }

    async fn get_epoch_plan(
        &self,
        request: Request<GetEpochPlanRequest>,
    ) -> Result<Response<EpochPlan>, Status> {
        let request = request.into_inner();
        let state = self.0.lock().unwrap();
        if request.epoch >= state.epochs {
            return Err(Status::invalid_argument("no such epoch"));
        }
        let slots = state
            .plan
            .iter()
            .map(|(slot, parts)| Slot {
                slot: *slot,
                parts: parts.iter().map(|&(split, lo, hi)| SlotPart { split, lo, hi }).collect(),
            })
            .collect();
        Ok(Response::new(EpochPlan {
            epoch: request.epoch,
            slots,
            plan_fingerprint: 42,
            partial: false,
            sources: vec![],
        }))
    }

    async fn request_replay(
        &self,
        request: Request<RequestReplayRequest>,
    ) -> Result<Response<RequestReplayResponse>, Status> {
        let request = request.into_inner();
        let mut state = self.0.lock().unwrap();
        state.replays.push(request.clone());
        if let Some(on_replay) = state.on_replay.as_ref() {
            let _ = on_replay.send(request.clone());
        }
        Ok(Response::new(RequestReplayResponse { queued: request.splits }))
    }

    async fn list_workers(
        &self,
        _: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        Ok(Response::new(ListWorkersResponse { workers: self.workers() }))
    }
    async fn report_cache_profile(
        &self,
        _: Request<ReportCacheProfileRequest>,
    ) -> Result<Response<ReportCacheProfileResponse>, Status> {
        Ok(Response::new(ReportCacheProfileResponse {}))
    }
}
