//! The `Worker` gRPC service: `StreamBatches` hands each consumer the parts queued for it.

use super::queues::{ConsumerKey, ConsumerStream, Queues};
use futures::StreamExt;
use granary_crds::part_bound::PartBound;
use granary_proto::MAX_MESSAGE_BYTES;
use granary_proto::v1::StreamBatchesRequest;
use granary_proto::v1::worker_server::{Worker, WorkerServer};
use granary_security::CapabilityVerifier;
use prost::Message;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// Largest request a worker accepts: a `StreamBatchesRequest` is a few names and a capability.
const MAX_REQUEST_BYTES: usize = 64 << 10;
/// Requests one connection may have in flight at once (a `StreamBatches` call is in flight
/// until its stream is answered, not while it streams).
const MAX_CONCURRENT_PER_CONNECTION: usize = 64;
/// HTTP/2 streams one connection may hold open at once (a trainer opens one per consumer it
/// reads for); the peer's HTTP/2 stack refuses more.
const MAX_STREAMS_PER_CONNECTION: u32 = 128;
/// Batch streams the worker holds open at once, every connection together: past it a new
/// stream is refused with RESOURCE_EXHAUSTED, so idle streams cannot grow the worker's memory
/// without bound.
pub const MAX_OPEN_STREAMS: usize = 4096;
/// Longest the answer to a request may take (a `StreamBatches` call is answered at once; its
/// stream then lasts as long as the consumer reads).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest header block of a request: a capability and the gRPC headers fit many times over.
const MAX_HEADER_BYTES: u32 = 64 << 10;
/// Longest a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// HTTP/2 flow-control windows: large, so that a batch part streams without waiting on window
/// updates.
const STREAM_WINDOW: u32 = 32 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

/// Idle HTTP/2 connections are pinged this often, and closed when a ping goes unanswered for
/// [`KEEPALIVE_TIMEOUT`]: a consumer that vanished does not hold its stream forever.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The largest message each pipeline's streams may carry, from its spec (see
/// [`granary_crds::part_bound`]); a pipeline not yet known gets [`MAX_MESSAGE_BYTES`].
#[derive(Debug, Default)]
pub struct StreamLimits {
    limits: RwLock<HashMap<String, usize>>,
}

impl StreamLimits {
    /// Sizes `pipeline`'s messages to the largest batch part `spec` can produce.
    pub fn learn(&self, pipeline: &str, spec: &granary_crds::InputPipelineSpec) {
        self.set(pipeline, PartBound::of(spec));
    }

    fn set(&self, pipeline: &str, bound: PartBound) {
        let limit = bound.limit(MAX_MESSAGE_BYTES);
        tracing::debug!(%pipeline, ?bound, limit, "stream message limit");
        self.limits.write().unwrap_or_else(PoisonError::into_inner).insert(pipeline.to_string(), limit);
    }

    /// Sizes `pipeline`'s messages from its manifest as the dispatcher sends it (JSON); one that
    /// does not parse gets the cap, and its engine reports why.
    pub fn learn_json(&self, pipeline: &str, manifest_json: &str) {
        self.set(pipeline, PartBound::of_manifest_json(manifest_json));
    }

    /// The limit of `pipeline`'s messages.
    pub fn of(&self, pipeline: &str) -> usize {
        let limits = self.limits.read().unwrap_or_else(PoisonError::into_inner);
        limits.get(pipeline).copied().unwrap_or(MAX_MESSAGE_BYTES)
    }
}

/// Ends a stream with a clear error instead of sending a message over its pipeline's limit.
fn limited(stream: ConsumerStream, pipeline: String, limits: Arc<StreamLimits>) -> ConsumerStream {
    let mut failed = false;
    Box::pin(stream.map(move |message| {
        let message = message?;
        let size = message.encoded_len();
        let limit = limits.of(&pipeline);
        if size > limit {
            if !failed {
                tracing::error!(%pipeline, size, limit, "a batch part is larger than its pipeline's bound; not sent");
            }
            failed = true;
            return Err(Status::resource_exhausted(format!(
                "a batch part of pipeline `{pipeline}` is {size} bytes, more than the {limit} bytes its \
                 spec allows (spec.batch.size rows of its fixed output shape, plus framing): the \
                 worker's output does not match the spec; check the stages that fix the shape"
            )));
        }
        Ok(message)
    }))
}

/// Counts a worker's open streams: a [`StreamSlot`] is held by each.
#[derive(Debug, Default)]
struct OpenStreams(AtomicUsize);

/// One open stream's place in [`OpenStreams`], given back when the stream is dropped.
struct StreamSlot(Arc<OpenStreams>);

impl OpenStreams {
    /// A place for one more stream, unless [`MAX_OPEN_STREAMS`] are open.
    fn take(self: &Arc<Self>, limit: usize) -> Option<StreamSlot> {
        let mut open = self.0.load(Ordering::Relaxed);
        loop {
            if open >= limit {
                return None;
            }
            match self.0.compare_exchange_weak(open, open + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(StreamSlot(Arc::clone(self))),
                Err(now) => open = now,
            }
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Holds `slot` as long as `stream` lives.
fn counted(stream: ConsumerStream, slot: StreamSlot) -> ConsumerStream {
    Box::pin(stream.map(move |message| {
        let _held = &slot;
        message
    }))
}

/// Whether streams need a capability, and the dispatcher's key to check them with.
#[derive(Debug, Default)]
pub struct CapabilityGate {
    /// Streams need a capability (the worker authenticates to its dispatcher): until the key
    /// arrives with the registration, every stream is refused.
    required: bool,
    verifier: RwLock<Option<CapabilityVerifier>>,
}

impl CapabilityGate {
    /// A gate that requires capabilities when `required`.
    pub fn new(required: bool) -> CapabilityGate {
        CapabilityGate { required, verifier: RwLock::new(None) }
    }

    /// Keeps the dispatcher's public key (from RegisterWorker; empty: it checks none).
    pub fn set_key(&self, key: Vec<u8>) {
        if key.is_empty() && self.required {
            tracing::warn!(
                "this worker has a token but its dispatcher has authentication off (it sent no \
                 capability key): every stream is refused; drop --token-file, or give the \
                 dispatcher a master key"
            );
        }
        let verifier = (!key.is_empty()).then(|| CapabilityVerifier::new(key));
        *self.verifier.write().unwrap_or_else(PoisonError::into_inner) = verifier;
    }

    /// Checks the capability of `request`, when one is needed.
    fn check(&self, request: &StreamBatchesRequest) -> Result<(), Status> {
        let verifier = self.verifier.read().unwrap_or_else(PoisonError::into_inner);
        let Some(verifier) = verifier.as_ref() else {
            if self.required {
                return Err(Status::unavailable(
                    "this worker has not registered with its dispatcher yet, so it cannot check stream capabilities; retry",
                ));
            }
            return Ok(());
        };
        if request.capability.is_empty() {
            return Err(Status::unauthenticated(
                "StreamBatchesRequest.capability is empty: present the capability RegisterClient answered",
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let capability = verifier
            .allows(&request.capability, now, &request.job, request.consumer_index)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        if capability.pipeline != request.pipeline {
            return Err(Status::permission_denied(format!(
                "the stream capability is for pipeline `{}`, not this request's",
                capability.pipeline
            )));
        }
        Ok(())
    }
}

/// The `Worker` service implementation.
pub struct WorkerApi {
    queues: Arc<Queues>,
    /// The only pipeline served, when the worker is dedicated to one.
    pipeline: Option<String>,
    gate: Arc<CapabilityGate>,
    limits: Arc<StreamLimits>,
    open: Arc<OpenStreams>,
    max_open: usize,
}

impl WorkerApi {
    /// Serves the consumers of `queues`; with `pipeline`, only that pipeline's.
    pub fn new(queues: Arc<Queues>, pipeline: Option<String>) -> WorkerApi {
        WorkerApi {
            queues,
            pipeline,
            gate: Arc::new(CapabilityGate::default()),
            limits: Arc::new(StreamLimits::default()),
            open: Arc::default(),
            max_open: MAX_OPEN_STREAMS,
        }
    }

    /// Holds at most `max` streams open at once (default [`MAX_OPEN_STREAMS`]).
    pub fn with_max_open_streams(mut self, max: usize) -> WorkerApi {
        self.max_open = max;
        self
    }

    /// Sizes each pipeline's messages with `limits`.
    pub fn with_limits(mut self, limits: Arc<StreamLimits>) -> WorkerApi {
        self.limits = limits;
        self
    }

    /// Checks stream capabilities with `gate`.
    pub fn with_gate(mut self, gate: Arc<CapabilityGate>) -> WorkerApi {
        self.gate = gate;
        self
    }

    fn check(&self, request: &StreamBatchesRequest) -> Result<ConsumerKey, Status> {
        let empty = |field: &str, what: &str| {
            Status::invalid_argument(format!("StreamBatchesRequest.{field} is empty; set it to {what}"))
        };
        if request.pipeline.is_empty() {
            return Err(empty("pipeline", "the name of the pipeline to stream"));
        }
        if request.job.is_empty() {
            return Err(empty("job", "the job name RegisterClient answered"));
        }
        if request.client_id.is_empty() {
            return Err(empty("client_id", "the client id RegisterClient answered"));
        }
        if let Some(only) = &self.pipeline
            && *only != request.pipeline
        {
            return Err(Status::invalid_argument(format!(
                "StreamBatchesRequest.pipeline `{}` is not served here: this worker serves only \
                 pipeline `{only}`",
                request.pipeline
            )));
        }
        self.gate.check(request)?;
        Ok(ConsumerKey {
            pipeline: request.pipeline.clone(),
            job: request.job.clone(),
            consumer_index: request.consumer_index,
        })
    }
}

#[tonic::async_trait]
impl Worker for WorkerApi {
    type StreamBatchesStream = ConsumerStream;

    async fn stream_batches(
        &self,
        request: Request<StreamBatchesRequest>,
    ) -> Result<Response<Self::StreamBatchesStream>, Status> {
        let peer = request.remote_addr();
        let request = request.into_inner();
        let key = self.check(&request)?;
        let Some(slot) = self.open.take(self.max_open) else {
            tracing::warn!(consumer = %key, ?peer, limit = self.max_open, "too many open streams; one refused");
            return Err(Status::resource_exhausted(format!(
                "this worker holds {} batch streams open, its limit: close idle streams (one per \
                 consumer is enough), or add workers",
                self.max_open
            )));
        };
        tracing::info!(consumer = %key, client_id = %request.client_id, ?peer, "consumer stream opened");
        let limits = Arc::clone(&self.limits);
        let stream = limited(self.queues.open_stream(&key), key.pipeline.clone(), limits);
        Ok(Response::new(counted(stream, slot)))
    }
}

/// Serves `api` on `listener` (over TLS with `tls`) until `stop` fires or is dropped.
pub fn spawn(
    listener: TcpListener,
    api: WorkerApi,
    tls: Option<ServerTlsConfig>,
    stop: oneshot::Receiver<()>,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    // Clients only read from a worker: their requests are small. Each stream checks its own
    // pipeline's bound (`StreamLimits`); this is the cap over every pipeline.
    let service = WorkerServer::new(api)
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls.timeout(TLS_HANDSHAKE_TIMEOUT))?;
    }
    let server = builder
        .timeout(REQUEST_TIMEOUT)
        .concurrency_limit_per_connection(MAX_CONCURRENT_PER_CONNECTION)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .http2_adaptive_window(Some(true))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .tcp_nodelay(true)
        .add_service(service);
    Ok(tokio::spawn(server.serve_with_incoming_shutdown(incoming, async {
        let _ = stop.await;
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pipeline: &str, job: &str, client_id: &str) -> Request<StreamBatchesRequest> {
        Request::new(StreamBatchesRequest {
            pipeline: pipeline.into(),
            job: job.into(),
            consumer_index: 0,
            client_id: client_id.into(),
            capability: String::new(),
        })
    }

    fn spec(stages: &str) -> granary_crds::InputPipelineSpec {
        let yaml =
            format!("source: {{url: 'file:///d/', format: files}}\nbatch: {{size: 2}}\nstages: {stages}");
        serde_norway::from_str(&yaml).unwrap()
    }

    fn part_message(bytes: usize) -> granary_proto::v1::StreamMessage {
        use granary_proto::v1::{BatchPart, Tensor, stream_message::Kind};
        let tensor = Tensor {
            name: "image".into(),
            dtype: "uint8".into(),
            data: vec![7; bytes].into(),
            ..Tensor::default()
        };
        let part =
            BatchPart { keys: vec!["a".into(), "b".into()], tensors: vec![tensor], ..BatchPart::default() };
        granary_proto::v1::StreamMessage { kind: Some(Kind::Part(part)) }
    }

    #[test]
    fn a_fixed_shape_pipeline_gets_a_tight_limit_and_others_the_cap() {
        let limits = StreamLimits::default();
        assert_eq!(limits.of("p"), MAX_MESSAGE_BYTES, "unknown pipelines get the cap");
        limits.learn("p", &spec("[{op: image.decode}, {op: image.center_crop, size: 8}]"));
        let limit = limits.of("p");
        assert!((2 * (8 * 8 * 3 + 8)..1 << 20).contains(&limit), "{limit}");
        limits.learn("q", &spec("[{op: image.decode}, {op: image.resize, size: 8}]"));
        assert_eq!(limits.of("q"), MAX_MESSAGE_BYTES);
        limits.learn_json("r", "not json");
        assert_eq!(limits.of("r"), MAX_MESSAGE_BYTES);
    }

    #[tokio::test]
    async fn a_part_over_its_pipelines_limit_ends_the_stream_with_a_clear_error() {
        let limits = Arc::new(StreamLimits::default());
        limits.learn("p", &spec("[{op: image.decode}, {op: image.center_crop, size: 8}]"));
        let limit = limits.of("p");
        let messages = vec![Ok(part_message(100)), Ok(part_message(limit + 1))];
        let stream: ConsumerStream = Box::pin(futures::stream::iter(messages));
        let mut stream = limited(stream, "p".into(), limits);
        assert!(stream.next().await.unwrap().is_ok(), "a part within the bound is sent");
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("pipeline `p`") && status.message().contains(&limit.to_string()),
            "{}",
            status.message()
        );
    }

    #[tokio::test]
    async fn streams_past_the_limit_are_refused_until_one_closes() {
        let api = WorkerApi::new(Arc::new(Queues::new(crate::service::queues::Capacity::parts(4))), None)
            .with_max_open_streams(2);
        let first = api.stream_batches(request("p", "a", "c")).await.unwrap();
        let _second = api.stream_batches(request("p", "b", "c")).await.unwrap();
        let Err(status) = api.stream_batches(request("p", "c", "c")).await else { panic!("accepted") };
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("holds 2 batch streams open"), "{}", status.message());
        drop(first);
        assert!(api.stream_batches(request("p", "c", "c")).await.is_ok(), "a closed stream frees its place");
    }

    #[tokio::test]
    async fn empty_or_foreign_fields_are_refused_by_name() {
        let api = WorkerApi::new(
            Arc::new(Queues::new(crate::service::queues::Capacity::parts(4))),
            Some("p".into()),
        );
        for (req, field) in [
            (request("", "j", "c"), "pipeline"),
            (request("p", "", "c"), "job"),
            (request("p", "j", ""), "client_id"),
            (request("q", "j", "c"), "pipeline"),
        ] {
            let Err(status) = api.stream_batches(req).await else { panic!("accepted") };
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().contains(&format!("StreamBatchesRequest.{field}")),
                "{}",
                status.message()
            );
        }
        assert!(api.stream_batches(request("p", "j", "c")).await.is_ok());
    }
}
