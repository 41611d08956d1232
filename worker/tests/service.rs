//! The worker service in process, against a stub dispatcher: it leases one split of a small
//! image dataset, and the test reads the parts over `StreamBatches` and compares them with the
//! engine's own batches of that split. Also: re-registration after a dispatcher restart, and a
//! drain that returns a lease its consumer never took.

mod support;

use granary_proto::v1::dispatcher_server::{Dispatcher, DispatcherServer};
use granary_proto::v1::worker_client::WorkerClient;
use granary_proto::v1::*;
use granary_worker::executor::{Output, Task};
use granary_worker::service::{WorkerConfig, WorkerService};
use granary_worker::{Engine, EngineOptions};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::dataset;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

const PIPELINE: &str = "test";
const JOB: &str = "job";
const BATCH: usize = 4;

fn manifest(name: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: {PIPELINE}}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 16}}
  stages:
    - op: image.decode
    - op: image.random_resized_crop
      size: 16
    - op: image.normalize
      mean: [0.5, 0.5, 0.5]
      std: [0.25, 0.25, 0.25]
  shuffle: {{buffer: 8}}
  batch: {{size: {BATCH}}}
  seed: 3
"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

/// What the stub dispatcher saw.
#[derive(Default)]
struct Seen {
    registrations: Vec<RegisterWorkerRequest>,
    heartbeats: Vec<WorkerHeartbeatRequest>,
    completed: Vec<CompleteSplitRequest>,
    returned: Vec<u64>,
    leased: bool,
}

/// A dispatcher that leases one split once, and forgets the worker at its first heartbeat when
/// `forget_once` is set.
struct Stub {
    info: PipelineInfo,
    lease: Lease,
    forget_once: bool,
    seen: Arc<Mutex<Seen>>,
    /// What RegisterWorker answers as the capability key (empty: none).
    capability_key: Vec<u8>,
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Dispatcher for Stub {
    async fn register_pipeline(
        &self,
        _: Request<RegisterPipelineRequest>,
    ) -> Reply<RegisterPipelineResponse> {
        Err(Status::unimplemented("stub"))
    }
    async fn get_pipeline(&self, request: Request<GetPipelineRequest>) -> Reply<PipelineInfo> {
        if request.get_ref().name != PIPELINE {
            return Err(Status::not_found("no such pipeline"));
        }
        Ok(Response::new(self.info.clone()))
    }
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Reply<RegisterWorkerResponse> {
        self.seen.lock().unwrap().registrations.push(request.into_inner());
        Ok(Response::new(RegisterWorkerResponse {
            worker_id: "w1".into(),
            heartbeat_interval_ms: 100,
            lease_duration_ms: 4000,
            revoked: vec![],
            capability_key: self.capability_key.clone(),
        }))
    }
    async fn worker_heartbeat(
        &self,
        request: Request<WorkerHeartbeatRequest>,
    ) -> Reply<WorkerHeartbeatResponse> {
        let mut seen = self.seen.lock().unwrap();
        let first = seen.heartbeats.is_empty();
        seen.heartbeats.push(request.into_inner());
        if first && self.forget_once {
            return Err(Status::not_found("unknown worker w1"));
        }
        Ok(Response::new(WorkerHeartbeatResponse::default()))
    }
    async fn lease_split(&self, _: Request<LeaseSplitRequest>) -> Reply<LeaseSplitResponse> {
        let mut seen = self.seen.lock().unwrap();
        if seen.leased {
            return Ok(Response::new(LeaseSplitResponse {
                lease: None,
                retry_after_ms: 50,
                more: Vec::new(),
            }));
        }
        seen.leased = true;
        Ok(Response::new(LeaseSplitResponse {
            lease: Some(self.lease.clone()),
            retry_after_ms: 0,
            more: Vec::new(),
        }))
    }
    async fn renew_lease(&self, _: Request<RenewLeaseRequest>) -> Reply<RenewLeaseResponse> {
        Ok(Response::new(RenewLeaseResponse::default()))
    }
    async fn complete_split(&self, request: Request<CompleteSplitRequest>) -> Reply<CompleteSplitResponse> {
        self.seen.lock().unwrap().completed.push(request.into_inner());
        Ok(Response::new(CompleteSplitResponse {}))
    }
    async fn count_split(&self, _: Request<CountSplitRequest>) -> Reply<CountSplitResponse> {
        Err(Status::unimplemented("the stub leases splits whose counts are known"))
    }
    async fn return_lease(&self, request: Request<ReturnLeaseRequest>) -> Reply<ReturnLeaseResponse> {
        self.seen.lock().unwrap().returned.push(request.into_inner().lease_id);
        Ok(Response::new(ReturnLeaseResponse {}))
    }
    async fn register_client(&self, _: Request<RegisterClientRequest>) -> Reply<RegisterClientResponse> {
        Err(Status::unimplemented("stub"))
    }
    async fn client_heartbeat(&self, _: Request<ClientHeartbeatRequest>) -> Reply<ClientHeartbeatResponse> {
        Err(Status::unimplemented("stub"))
    }
    async fn get_epoch_plan(&self, _: Request<GetEpochPlanRequest>) -> Reply<EpochPlan> {
        Err(Status::unimplemented("stub"))
    }
    async fn request_replay(&self, _: Request<RequestReplayRequest>) -> Reply<RequestReplayResponse> {
        Err(Status::unimplemented("stub"))
    }
    async fn list_workers(&self, _: Request<ListWorkersRequest>) -> Reply<ListWorkersResponse> {
        Err(Status::unimplemented("stub"))
    }
    async fn report_cache_profile(
        &self,
        _: Request<ReportCacheProfileRequest>,
    ) -> Reply<ReportCacheProfileResponse> {
        Ok(Response::new(ReportCacheProfileResponse {}))
    }
}

fn part(lo: u64, hi: u64, slot: u64, consumer: u32) -> Part {
    Part { lo, hi, slot, consumers: vec![consumer] }
}

/// Starts the stub; returns its address and what it sees.
async fn start_stub(
    manifest: &granary_crds::Manifest,
    parts: Vec<Part>,
    forget_once: bool,
    capability_key: Vec<u8>,
) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let info = PipelineInfo {
        name: PIPELINE.into(),
        manifest_json: serde_json::to_string(&manifest.pipeline).unwrap(),
        base_dir: "/".into(),
        generation: 1,
        splits: 2,
        elements: 20,
        epochs: 1,
        batch_size: BATCH as u32,
        cache_profile_wanted: false,
    };
    let lease = Lease {
        lease_id: 7,
        pipeline: PIPELINE.into(),
        generation: 1,
        job: JOB.into(),
        epoch: 0,
        split: 0,
        elements: 16,
        parts,
        duration_ms: 4000,
        only_consumer: None,
        cache: None,
        count_first: false,
        listed: 16,
        normalize_on_worker: false,
        images_on_client: false,
        client_image_share: 0.0,
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stub = Stub { info, lease, forget_once, seen: Arc::clone(&seen), capability_key };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DispatcherServer::new(stub))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    (addr, seen)
}

/// A tensor of a whole split: name, bytes of every row end to end, bytes per row.
type Column = (String, Vec<u8>, usize);

/// The engine's own batches of split 0, epoch 0, laid end to end: keys and per-tensor bytes.
fn expected(manifest: &granary_crds::Manifest) -> (Vec<String>, Vec<Column>) {
    let engine = Engine::open(manifest, EngineOptions { threads: 2, ..Default::default() }).unwrap();
    let mut keys = Vec::new();
    let mut tensors: Vec<Column> = Vec::new();
    for output in engine.run_tasks(Box::new(std::iter::once(Task::compute(0, 0)))) {
        if let Output::Batch { batch, .. } = output.unwrap() {
            keys.extend(batch.keys.iter().cloned());
            if tensors.is_empty() {
                tensors = batch.tensors.iter().map(|t| (t.name.clone(), Vec::new(), 0)).collect();
            }
            for (t, (_, data, row)) in batch.tensors.iter().zip(&mut tensors) {
                data.extend_from_slice(&t.data);
                *row = t.data.len() / t.shape[0];
            }
        }
    }
    (keys, tensors)
}

fn config(dispatcher: SocketAddr, drain: Duration) -> WorkerConfig {
    WorkerConfig {
        engine: EngineOptions { threads: 2, prefetch_bytes: 16 << 20, ..Default::default() },
        drain_timeout: drain,
        ..WorkerConfig::new(dispatcher.to_string())
    }
}

/// Reads one consumer's stream up to its split end.
async fn read_split(addr: SocketAddr, consumer: u32) -> Vec<BatchPart> {
    let mut stream = open_stream(addr, consumer, String::new()).await.unwrap();
    let mut parts = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), stream.message()).await.unwrap().unwrap();
        match message.and_then(|m| m.kind) {
            Some(stream_message::Kind::Part(p)) => parts.push(p),
            Some(stream_message::Kind::SplitEnd(end)) => {
                assert_eq!((end.epoch, end.split), (0, 0));
                return parts;
            }
            None => panic!("the stream ended before the split's end"),
        }
    }
}

/// Opens consumer `consumer`'s stream, presenting `capability`.
async fn open_stream(
    addr: SocketAddr,
    consumer: u32,
    capability: String,
) -> Result<tonic::Streaming<granary_proto::v1::StreamMessage>, Status> {
    let mut client = WorkerClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .max_decoding_message_size(granary_proto::MAX_MESSAGE_BYTES);
    let request = StreamBatchesRequest {
        pipeline: PIPELINE.into(),
        job: JOB.into(),
        consumer_index: consumer,
        client_id: "c".into(),
        capability,
    };
    client.stream_batches(request).await.map(|r| r.into_inner())
}

async fn wait_for(seen: &Mutex<Seen>, what: &str, done: impl Fn(&Seen) -> bool) {
    for _ in 0..600 {
        if done(&seen.lock().unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A runtime for a test body; the data and the expected batches are made before it, since
/// they block on runtimes of their own.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap()
}

#[test]
fn a_leased_split_streams_its_parts_to_each_consumer() {
    dataset("service-stream", 20);
    let manifest = manifest("service-stream");
    let (keys, tensors) = expected(&manifest);
    assert_eq!(keys.len(), 16);
    runtime().block_on(stream_and_check(manifest, keys, tensors));
}

async fn stream_and_check(manifest: granary_crds::Manifest, keys: Vec<String>, tensors: Vec<Column>) {
    // Whole batches, a part inside a batch, a part straddling two batches, dropped rows [15, 16).
    let parts = vec![part(0, 4, 0, 0), part(4, 8, 0, 1), part(8, 10, 1, 0), part(10, 15, 1, 1)];
    let (dispatcher, seen) = start_stub(&manifest, parts, true, Vec::new()).await;
    let service = WorkerService::bind(config(dispatcher, Duration::from_secs(5))).await.unwrap();
    let addr = service.local_addr();
    assert_eq!(service.advertised(), addr.to_string());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(service.run(async {
        let _ = stopped.await;
    }));

    let (zero, one) = tokio::join!(read_split(addr, 0), read_split(addr, 1));
    let ranges = |parts: &[BatchPart]| parts.iter().map(|p| (p.lo, p.hi, p.slot)).collect::<Vec<_>>();
    assert_eq!(ranges(&zero), vec![(0, 4, 0), (8, 10, 1)]);
    assert_eq!(ranges(&one), vec![(4, 8, 0), (10, 15, 1)]);
    for p in zero.iter().chain(&one) {
        let (lo, hi) = (p.lo as usize, p.hi as usize);
        assert_eq!(p.keys, keys[lo..hi], "keys of [{lo}, {hi})");
        assert_eq!(p.tensors.len(), tensors.len());
        for (t, (name, data, row)) in p.tensors.iter().zip(&tensors) {
            assert_eq!(&t.name, name);
            assert_eq!(t.shape[0], (hi - lo) as u64);
            assert_eq!(t.data.as_ref(), &data[lo * row..hi * row], "`{name}` of [{lo}, {hi})");
        }
    }
    assert_eq!(zero[0].tensors.iter().find(|t| t.name == "image").unwrap().shape, vec![4, 16, 16, 3]);

    wait_for(&seen, "CompleteSplit", |s| !s.completed.is_empty()).await;
    wait_for(&seen, "heartbeat metrics", |s| {
        s.heartbeats.iter().any(|h| h.metrics.as_ref().is_some_and(|m| m.elements_total == 16))
    })
    .await;
    {
        let seen = seen.lock().unwrap();
        let done = &seen.completed[0];
        assert_eq!((done.lease_id, done.worker_id.as_str(), done.elements, done.split), (7, "w1", 16, 0));
        assert!(seen.registrations.len() >= 2, "registered again after the NOT_FOUND heartbeat");
        assert_eq!(seen.registrations[0].worker_id, "");
        assert_eq!(seen.registrations[0].address, addr.to_string());
        assert_eq!(seen.registrations[1].worker_id, "w1", "the same id");
        assert!(seen.returned.is_empty());
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap().unwrap();
}

#[test]
fn a_drain_returns_the_lease_a_consumer_never_took() {
    dataset("service-drain", 20);
    runtime().block_on(drain_and_check(manifest("service-drain")));
}

async fn drain_and_check(manifest: granary_crds::Manifest) {
    let parts = vec![part(0, 4, 0, 0), part(4, 8, 1, 0), part(8, 12, 2, 0), part(12, 16, 3, 0)];
    let (dispatcher, seen) = start_stub(&manifest, parts, false, Vec::new()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker =
        tokio::spawn(granary_worker::service::serve(config(dispatcher, Duration::from_millis(500)), async {
            let _ = stopped.await;
        }));
    // The split is produced into the queue of a consumer that never connects.
    wait_for(&seen, "the split produced", |s| {
        s.heartbeats
            .iter()
            .any(|h| h.metrics.as_ref().is_some_and(|m| m.elements_total == 16 && m.buffered_parts == 4))
    })
    .await;
    assert!(seen.lock().unwrap().completed.is_empty(), "not complete while its consumer took nothing");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.returned, vec![7]);
    assert!(seen.completed.is_empty());
}

#[test]
fn a_worker_that_authenticates_streams_only_with_the_dispatchers_capability() {
    dataset("service-capability", 20);
    runtime().block_on(capabilities_and_check(manifest("service-capability")));
}

async fn capabilities_and_check(manifest: granary_crds::Manifest) {
    use granary_security::{Capability, CapabilitySigner, MasterKey};
    let signer = CapabilitySigner::new(&MasterKey::generate().unwrap());
    let parts = vec![part(0, 8, 0, 0), part(8, 16, 1, 0)];
    let (dispatcher, seen) = start_stub(&manifest, parts, false, signer.public_key()).await;
    let config =
        WorkerConfig { token: Some("gr1.worker.x.y".into()), ..config(dispatcher, Duration::from_secs(5)) };
    let service = WorkerService::bind(config).await.unwrap();
    let addr = service.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(service.run(async {
        let _ = stopped.await;
    }));
    wait_for(&seen, "RegisterWorker", |s| !s.registrations.is_empty()).await;
    let far = u64::MAX / 2;
    let capability = |consumer: u32, expires_ms: u64| Capability {
        pipeline: PIPELINE.into(),
        job: JOB.into(),
        consumer,
        expires_ms,
    };
    let code = |result: Result<_, Status>| result.err().map(|s| s.code());
    // Wait until the key arrived with the registration (the gate refuses with UNAVAILABLE before).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while code(open_stream(addr, 0, String::new()).await) == Some(tonic::Code::Unavailable) {
        assert!(std::time::Instant::now() < deadline, "the worker never got the capability key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(code(open_stream(addr, 0, String::new()).await), Some(tonic::Code::Unauthenticated), "none");
    let forged = CapabilitySigner::new(&MasterKey::generate().unwrap()).sign(&capability(0, far));
    assert_eq!(code(open_stream(addr, 0, forged).await), Some(tonic::Code::PermissionDenied), "forged");
    let expired = signer.sign(&capability(0, 1));
    assert_eq!(code(open_stream(addr, 0, expired).await), Some(tonic::Code::PermissionDenied), "expired");
    let other = signer.sign(&capability(1, far));
    assert_eq!(
        code(open_stream(addr, 0, other).await),
        Some(tonic::Code::PermissionDenied),
        "another consumer"
    );
    let wrong_pipeline = signer.sign(&Capability { pipeline: "other".into(), ..capability(0, far) });
    assert_eq!(code(open_stream(addr, 0, wrong_pipeline).await), Some(tonic::Code::PermissionDenied));
    // The dispatcher's own capability streams the split.
    let mut stream = open_stream(addr, 0, signer.sign(&capability(0, far))).await.unwrap();
    let mut rows = 0;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), stream.message()).await.unwrap().unwrap();
        match message.and_then(|m| m.kind) {
            Some(stream_message::Kind::Part(p)) => rows += p.hi - p.lo,
            Some(stream_message::Kind::SplitEnd(_)) => break,
            None => panic!("the stream ended before the split's end"),
        }
    }
    assert_eq!(rows, 16);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap().unwrap();
}
