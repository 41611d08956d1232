//! The heartbeat: progress and metrics to the dispatcher, the list of workers back.
//!
//! A dispatcher that restarted and forgot this consumer answers `NOT_FOUND`; the consumer then
//! registers again at its current position. While the dispatcher is unreachable the heartbeat
//! retries with backoff and the worker streams keep delivering.
//!
//! While the dispatcher lists no worker (the trainer registered before any worker did: at the
//! start of a run, or while its pipeline is scaled to zero), heartbeats come sooner, from
//! [`DISCOVERY_FIRST`] doubling up to the interval, so that streaming starts as soon as a worker
//! registers rather than a whole interval later.

use std::sync::Arc;
use std::time::Duration;

use granary_proto::v1::RegisterClientRequest;

use crate::backoff::Backoff;
use crate::dispatcher::{self, Dispatcher};
use crate::session::Session;
use crate::streams::WorkerStreams;

/// The first delay between heartbeats while no worker is listed.
pub(crate) const DISCOVERY_FIRST: Duration = Duration::from_millis(20);

/// Sends heartbeats every `interval` until dropped, keeping `streams` on the listed workers;
/// `listed` says whether the registration listed any.
pub(crate) async fn run(
    mut dispatcher: Dispatcher,
    session: Arc<Session>,
    mut streams: WorkerStreams,
    interval: Duration,
    mut listed: bool,
) {
    let mut backoff = Backoff::reconnect();
    let mut discovery = Backoff::new(DISCOVERY_FIRST.min(interval), interval);
    let mut failing = false;
    loop {
        let delay = match (failing, listed) {
            (true, _) => backoff.next_delay(),
            (false, true) => interval,
            (false, false) => discovery.next_delay(),
        };
        tokio::time::sleep(delay).await;
        let request = session.heartbeat();
        match dispatcher.client_heartbeat(request).await {
            Ok(response) => {
                if failing {
                    tracing::info!(dispatcher = %session.address, "dispatcher reachable again");
                }
                failing = false;
                backoff.reset();
                let response = response.into_inner();
                if !response.failed.is_empty() {
                    streams.fail(response.failed);
                    return;
                }
                session.set_capability(response.capability);
                listed = !response.workers.is_empty();
                if listed {
                    discovery.reset();
                }
                streams.update(&response.workers);
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                tracing::info!(dispatcher = %session.address, message = status.message(),
                    "the dispatcher forgot this consumer, registering again");
                failing = !register_again(&mut dispatcher, &session, &mut streams).await;
            }
            Err(status) => {
                if !failing {
                    tracing::warn!(dispatcher = %session.address, code = ?status.code(),
                        message = status.message(), "heartbeat failed, retrying; worker streams keep flowing");
                }
                failing = true;
            }
        }
    }
}

/// Registers the consumer again at its current position; true on success.
async fn register_again(dispatcher: &mut Dispatcher, session: &Session, streams: &mut WorkerStreams) -> bool {
    let consumer = &session.consumer;
    let request = RegisterClientRequest {
        pipeline: consumer.pipeline.clone(),
        job: consumer.job.clone(),
        mode: consumer.mode.to_proto().into(),
        consumer_index: Some(consumer.consumer_index),
        num_consumers: consumer.num_consumers,
        resume: Some(session.resume_point()),
        wants_data: session.wants_data(),
        image_plans: consumer.image_plans,
    };
    match dispatcher::register(dispatcher, &session.address, session.tls().is_some(), request).await {
        Ok(response) => {
            if response.consumer_index != consumer.consumer_index {
                tracing::warn!(
                    expected = consumer.consumer_index,
                    got = response.consumer_index,
                    "registered again under another consumer index"
                );
            }
            session.set_client_id(response.client_id);
            session.set_capability(response.capability);
            streams.update(&response.workers);
            true
        }
        Err(error) => {
            tracing::warn!(%error, "registering again failed, retrying");
            false
        }
    }
}
