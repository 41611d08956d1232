//! One task per worker reads the consumer's batch parts and forwards them to the client.
//!
//! A task reconnects with backoff when its stream fails or ends, for as long as the dispatcher
//! lists its worker. Tasks are keyed by address: a worker that comes back at the same address
//! under a new id keeps its stream instead of getting a second one that would replace it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use granary_proto::v1::stream_message::Kind;
use granary_proto::v1::worker_client::WorkerClient;
use granary_proto::v1::{BatchPart, StreamBatchesRequest, WorkerInfo};
use tokio::sync::{mpsc, watch};
use tonic::transport::Endpoint;

use crate::backoff::Backoff;
use crate::batch::Arrived;
use crate::endpoint;
use crate::images;
use crate::session::Session;
use crate::task::TaskGuard;

/// What a worker stream delivers to the client.
#[derive(Debug)]
pub(crate) enum StreamEvent {
    /// A batch part, its images made when the workers left them to this host.
    Part(Arrived),
    /// Every part of `split` in `epoch` for this consumer was sent before.
    SplitEnd {
        /// The epoch.
        epoch: u32,
        /// The split.
        split: u64,
    },
    /// The dispatcher says the pipeline failed, and why; or an image left to this host could
    /// not be made.
    Failed(String),
}

/// The worker stream tasks, following the dispatcher's list of workers.
#[derive(Debug)]
pub(crate) struct WorkerStreams {
    session: Arc<Session>,
    events: mpsc::Sender<StreamEvent>,
    listed: watch::Sender<HashSet<String>>,
    tasks: HashMap<String, TaskGuard<()>>,
}

impl WorkerStreams {
    /// No streams yet; parts will be sent to `events`.
    pub(crate) fn new(session: Arc<Session>, events: mpsc::Sender<StreamEvent>) -> WorkerStreams {
        let (listed, _) = watch::channel(HashSet::new());
        WorkerStreams { session, events, listed, tasks: HashMap::new() }
    }

    /// The dispatcher lists `workers` now: start streams from the new ones. Streams from workers
    /// no longer listed keep flowing until they end.
    /// Tells the consumer that the pipeline failed (once is enough: it ends the iteration).
    pub(crate) fn fail(&self, message: String) {
        let _ = self.events.try_send(StreamEvent::Failed(message));
    }

    pub(crate) fn update(&mut self, workers: &[WorkerInfo]) {
        let addresses: HashSet<String> = workers
            .iter()
            .map(|worker| worker.address.trim().to_owned())
            .filter(|address| !address.is_empty())
            .collect();
        self.session.note_workers(&addresses);
        self.listed.send_replace(addresses.clone());
        self.tasks.retain(|_, task| !task.is_finished());
        for address in addresses {
            if self.tasks.contains_key(&address) {
                continue;
            }
            let endpoint = match endpoint::endpoint(&address, self.session.tls().as_ref()) {
                Ok(endpoint) => endpoint,
                Err(error) => {
                    tracing::warn!(%error, "skipping a worker");
                    continue;
                }
            };
            tracing::debug!(worker = %address, "streaming from a worker");
            let stream = WorkerStream {
                address: address.clone(),
                endpoint,
                session: Arc::clone(&self.session),
                events: self.events.clone(),
                listed: self.listed.subscribe(),
            };
            self.tasks.insert(address, TaskGuard::spawn(stream.run()));
        }
    }
}

/// How one stream ended.
enum Ended {
    /// The worker ended it or it failed, after `received` messages.
    Closed { received: u64 },
    /// The client is gone.
    ClientGone,
}

/// Reads one worker's stream for this consumer, reconnecting while the worker is listed.
struct WorkerStream {
    address: String,
    endpoint: Endpoint,
    session: Arc<Session>,
    events: mpsc::Sender<StreamEvent>,
    listed: watch::Receiver<HashSet<String>>,
}

impl WorkerStream {
    async fn run(self) {
        let mut backoff = Backoff::reconnect();
        loop {
            if !self.listed.borrow().contains(&self.address) {
                tracing::debug!(worker = %self.address, "worker no longer listed, stream stopped");
                return;
            }
            match self.read().await {
                Ended::ClientGone => return,
                Ended::Closed { received } if received > 0 => backoff.reset(),
                Ended::Closed { .. } => {}
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// Opens the stream and forwards its messages until it ends.
    async fn read(&self) -> Ended {
        let channel = match endpoint::connect(&self.endpoint).await {
            Ok(channel) => channel,
            Err(reason) => {
                tracing::debug!(worker = %self.address, %reason, "cannot connect to worker");
                return Ended::Closed { received: 0 };
            }
        };
        let mut worker = WorkerClient::new(channel).max_decoding_message_size(self.session.max_part_bytes());
        let consumer = &self.session.consumer;
        let request = StreamBatchesRequest {
            pipeline: consumer.pipeline.clone(),
            job: consumer.job.clone(),
            consumer_index: consumer.consumer_index,
            client_id: self.session.client_id(),
            capability: self.session.capability(),
        };
        let mut stream = match worker.stream_batches(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tracing::debug!(worker = %self.address, code = ?status.code(), message = status.message(),
                    "worker refused the stream");
                return Ended::Closed { received: 0 };
            }
        };
        let mut received = 0;
        loop {
            let event = match stream.message().await {
                Ok(Some(message)) => match message.kind {
                    Some(Kind::Part(part)) if images::has_plans(&part) => made(part).await,
                    Some(Kind::Part(part)) => StreamEvent::Part(part.into()),
                    Some(Kind::SplitEnd(end)) => StreamEvent::SplitEnd { epoch: end.epoch, split: end.split },
                    None => continue,
                },
                Ok(None) => {
                    tracing::debug!(worker = %self.address, received, "worker stream ended");
                    return Ended::Closed { received };
                }
                Err(status) => {
                    tracing::info!(worker = %self.address, received, code = ?status.code(),
                        message = status.message(), "worker stream failed, reconnecting");
                    return Ended::Closed { received };
                }
            };
            received += 1;
            if self.events.send(event).await.is_err() {
                return Ended::ClientGone;
            }
        }
    }
}

/// `part` with the images left to this host made, on blocking threads: the stream reads its next
/// message once they are, so a part and the split's end keep their order.
async fn made(mut part: BatchPart) -> StreamEvent {
    let wire_bytes = part.tensors.iter().map(|t| t.data.len() as u64).sum();
    let made = tokio::task::spawn_blocking(move || images::make(&mut part, images::threads()).map(|()| part));
    match made.await {
        Ok(Ok(part)) => StreamEvent::Part(Arrived { part, wire_bytes }),
        Ok(Err(why)) => StreamEvent::Failed(why),
        Err(error) => StreamEvent::Failed(format!("making the images of a part failed: {error}")),
    }
}
