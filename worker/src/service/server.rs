//! The `Worker` gRPC service: `StreamBatches` hands each consumer the parts queued for it.

use super::queues::{ConsumerKey, ConsumerStream, Queues};
use granary_proto::MAX_MESSAGE_BYTES;
use granary_proto::v1::StreamBatchesRequest;
use granary_proto::v1::worker_server::{Worker, WorkerServer};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// HTTP/2 flow-control windows: large, so that a batch part streams without waiting on window
/// updates.
const STREAM_WINDOW: u32 = 32 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

/// The `Worker` service implementation.
pub struct WorkerApi {
    queues: Arc<Queues>,
    /// The only pipeline served, when the worker is dedicated to one.
    pipeline: Option<String>,
}

impl WorkerApi {
    /// Serves the consumers of `queues`; with `pipeline`, only that pipeline's.
    pub fn new(queues: Arc<Queues>, pipeline: Option<String>) -> WorkerApi {
        WorkerApi { queues, pipeline }
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

/// Serves `api` on `listener` until `stop` fires or is dropped.
pub fn spawn(
    listener: TcpListener,
    api: WorkerApi,
    stop: oneshot::Receiver<()>,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = WorkerServer::new(api)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let server = Server::builder()
        .http2_adaptive_window(Some(true))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .tcp_nodelay(true)
        .add_service(service);
    tokio::spawn(server.serve_with_incoming_shutdown(incoming, async {
        let _ = stop.await;
    }))
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
