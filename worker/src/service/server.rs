//! The `Worker` gRPC service: `StreamBatches` hands each consumer the parts queued for it.

use super::queues::{ConsumerKey, ConsumerStream, Queues};
use granary_proto::MAX_MESSAGE_BYTES;
use granary_proto::v1::StreamBatchesRequest;
use granary_proto::v1::worker_server::{Worker, WorkerServer};
use granary_security::CapabilityVerifier;
use std::sync::Arc;
use std::sync::{PoisonError, RwLock};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// Largest request a worker accepts: a `StreamBatchesRequest` is a few names and a capability.
const MAX_REQUEST_BYTES: usize = 64 << 10;
/// Streams one connection may hold open at once (a trainer opens one per consumer).
const MAX_CONCURRENT_PER_CONNECTION: usize = 64;
/// Longest a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// HTTP/2 flow-control windows: large, so that a batch part streams without waiting on window
/// updates.
const STREAM_WINDOW: u32 = 32 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

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
}

impl WorkerApi {
    /// Serves the consumers of `queues`; with `pipeline`, only that pipeline's.
    pub fn new(queues: Arc<Queues>, pipeline: Option<String>) -> WorkerApi {
        WorkerApi { queues, pipeline, gate: Arc::new(CapabilityGate::default()) }
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
        tracing::info!(consumer = %key, client_id = %request.client_id, ?peer, "consumer stream opened");
        Ok(Response::new(self.queues.open_stream(&key)))
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
    // Clients only read from a worker: their requests are small.
    let service = WorkerServer::new(api)
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls.timeout(TLS_HANDSHAKE_TIMEOUT))?;
    }
    let server = builder
        .concurrency_limit_per_connection(MAX_CONCURRENT_PER_CONNECTION)
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

    #[tokio::test]
    async fn empty_or_foreign_fields_are_refused_by_name() {
        let api = WorkerApi::new(Arc::new(Queues::new(4)), Some("p".into()));
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
