//! Replay requests, sent from a background task so that `next()` never waits on the dispatcher.

use std::sync::Arc;

use granary_proto::v1::RequestReplayRequest;
use tokio::sync::mpsc;

use crate::dispatcher::Dispatcher;
use crate::session::Session;

/// Requests queued for the dispatcher at most; more are dropped (the stall check asks again).
pub(crate) const QUEUE: usize = 32;

/// Splits of an epoch to produce again for this consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayRequest {
    /// The epoch.
    pub(crate) epoch: u32,
    /// The splits.
    pub(crate) splits: Vec<u64>,
}

/// Sends every queued request to the dispatcher, until the client is dropped.
pub(crate) async fn run(
    mut dispatcher: Dispatcher,
    session: Arc<Session>,
    mut requests: mpsc::Receiver<ReplayRequest>,
) {
    while let Some(request) = requests.recv().await {
        let consumer = &session.consumer;
        let call = RequestReplayRequest {
            client_id: session.client_id(),
            pipeline: consumer.pipeline.clone(),
            job: consumer.job.clone(),
            consumer_index: consumer.consumer_index,
            epoch: request.epoch,
            splits: request.splits,
        };
        match dispatcher.request_replay(call).await {
            Ok(response) => {
                let queued = response.into_inner().queued;
                tracing::debug!(epoch = request.epoch, ?queued, "replay requested");
            }
            Err(status) => {
                tracing::warn!(epoch = request.epoch, code = ?status.code(), message = status.message(),
                    "replay request failed");
            }
        }
    }
}
