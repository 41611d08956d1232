//! A fake worker that streams whatever the test queues for it.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use granary_proto::v1::stream_message::Kind;
use granary_proto::v1::worker_server::{Worker, WorkerServer};
use granary_proto::v1::{BatchPart, SplitEnd, StreamBatchesRequest, StreamMessage, Tensor};
use tokio::sync::{Mutex, mpsc};
use tonic::{Request, Response, Status};

/// The fake worker service: every stream reads from one shared queue.
#[derive(Debug, Clone)]
pub struct FakeWorker {
    queue: Arc<Mutex<mpsc::UnboundedReceiver<StreamMessage>>>,
}

impl FakeWorker {
    /// Serves a worker on a free port; returns its address and the sender of its messages.
    pub async fn serve() -> (String, mpsc::UnboundedSender<StreamMessage>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let worker = FakeWorker { queue: Arc::new(Mutex::new(receiver)) };
        let (listener, address) = super::listen().await;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServer::new(worker))
                .serve_with_incoming(super::incoming(listener)),
        );
        (address.to_string(), sender)
    }
}

#[tonic::async_trait]
impl Worker for FakeWorker {
    type StreamBatchesStream = Pin<Box<dyn Stream<Item = Result<StreamMessage, Status>> + Send>>;

    async fn stream_batches(
        &self,
        _: Request<StreamBatchesRequest>,
    ) -> Result<Response<Self::StreamBatchesStream>, Status> {
        let queue = Arc::clone(&self.queue);
        let stream = futures::stream::unfold(queue, |queue| async move {
            let message = queue.lock().await.recv().await?;
            Some((Ok(message), queue))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A part whose single `uint8` tensor `x` holds the positions `lo..hi` of the split.
pub fn part(epoch: u32, slot: u64, split: u64, lo: u64, hi: u64) -> StreamMessage {
    StreamMessage {
        kind: Some(Kind::Part(BatchPart {
            epoch,
            split,
            lo,
            hi,
            slot,
            keys: (lo..hi).map(|i| format!("{split}/{i}")).collect(),
            tensors: vec![Tensor {
                name: "x".into(),
                dtype: "uint8".into(),
                shape: vec![hi - lo],
                data: Bytes::from((lo..hi).map(|i| (split * 100 + i) as u8).collect::<Vec<u8>>()),
                normalize: None,
                padding: None,
                images: None,
            }],
        })),
    }
}

/// The end of a split.
pub fn split_end(epoch: u32, split: u64) -> StreamMessage {
    StreamMessage { kind: Some(Kind::SplitEnd(SplitEnd { epoch, split })) }
}
