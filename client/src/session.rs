//! State the client shares with its background tasks: who it is and how far it got.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use granary_proto::v1::{ClientHeartbeatRequest, ResumePoint, SlotRange};

use crate::host::HostSampler;
use crate::metrics::StepMetrics;
use crate::mode::Mode;
use crate::position::{POSITION_VERSION, Position};
use crate::ranges::SlotRanges;

/// The consumer, as the dispatcher registered it.
#[derive(Debug, Clone)]
pub(crate) struct Consumer {
    pub(crate) pipeline: String,
    pub(crate) job: String,
    pub(crate) consumer_index: u32,
    pub(crate) num_consumers: u32,
    pub(crate) mode: Mode,
    pub(crate) plan_fingerprint: u64,
    /// Where it wants the images made (`RegisterClientRequest.image_plans`).
    pub(crate) image_plans: i32,
}

/// How far the consumer got, updated by `next()` and read by the heartbeat.
#[derive(Debug)]
pub(crate) struct Progress {
    /// The epoch being delivered.
    pub(crate) epoch: u32,
    /// Its delivered slots.
    pub(crate) delivered: SlotRanges,
    /// Complete batches buffered in the client.
    pub(crate) buffered: u32,
    /// Complete batches the client assembles ahead at most (its tuned depth, see
    /// `crate::prefetch`): beyond, the streams are not read, and below, heartbeats ask for data.
    pub(crate) prefetch: u32,
    /// Every epoch was delivered.
    pub(crate) finished: bool,
    /// Step and wait times.
    pub(crate) metrics: StepMetrics,
    /// The host's idle cores and this client's finishing work, for placement.
    pub(crate) host: HostSampler,
}

/// The registered consumer, its dispatcher session and its progress.
#[derive(Debug)]
pub(crate) struct Session {
    /// The consumer.
    pub(crate) consumer: Consumer,
    /// The dispatcher address, for messages.
    pub(crate) address: String,
    client_id: Mutex<String>,
    /// The dispatcher's stream capability (empty when it has authentication off).
    capability: Mutex<String>,
    /// TLS to the workers, when the client dials TLS.
    tls: Mutex<Option<granary_security::TlsMaterial>>,
    /// The largest stream message accepted from a worker.
    max_part_bytes: AtomicUsize,
    progress: Mutex<Progress>,
    /// Every worker listed is on this host (a loopback address): see [`Session::heartbeat`].
    workers_here: AtomicBool,
}

impl Session {
    /// A session registered as `client_id`, starting at `epoch` with `delivered` slots.
    pub(crate) fn new(
        consumer: Consumer,
        address: String,
        client_id: String,
        epoch: u32,
        delivered: SlotRanges,
    ) -> Session {
        let progress = Progress {
            epoch,
            delivered,
            buffered: 0,
            prefetch: crate::prefetch::START,
            finished: false,
            metrics: StepMetrics::new(Instant::now()),
            host: HostSampler::new(Instant::now()),
        };
        Session {
            consumer,
            address,
            client_id: Mutex::new(client_id),
            capability: Mutex::new(String::new()),
            tls: Mutex::new(None),
            max_part_bytes: AtomicUsize::new(granary_proto::MAX_MESSAGE_BYTES),
            workers_here: AtomicBool::new(false),
            progress: Mutex::new(progress),
        }
    }

    /// The current dispatcher session id.
    pub(crate) fn client_id(&self) -> String {
        self.client_id.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the session id after registering again.
    pub(crate) fn set_client_id(&self, client_id: String) {
        *self.client_id.lock().unwrap_or_else(PoisonError::into_inner) = client_id;
    }

    /// The stream capability workers ask for (empty: none).
    pub(crate) fn capability(&self) -> String {
        self.capability.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Keeps the capability the dispatcher gave (at registration, renewed by heartbeats); an
    /// empty one (a dispatcher with authentication off) changes nothing.
    pub(crate) fn set_capability(&self, capability: String) {
        if !capability.is_empty() {
            *self.capability.lock().unwrap_or_else(PoisonError::into_inner) = capability;
        }
    }

    /// The largest stream message accepted from a worker: the pipeline's largest batch part
    /// when the dispatcher knows it, else the transport's cap.
    pub(crate) fn max_part_bytes(&self) -> usize {
        self.max_part_bytes.load(Ordering::Relaxed)
    }

    /// Accepts stream messages of up to `bytes` (the dispatcher's `max_part_bytes`; 0, unknown,
    /// keeps the cap), never above the transport's cap.
    pub(crate) fn set_max_part_bytes(&self, bytes: u64) {
        let cap = granary_proto::MAX_MESSAGE_BYTES;
        let limit = if bytes == 0 { cap } else { usize::try_from(bytes).map_or(cap, |b| b.min(cap)) };
        self.max_part_bytes.store(limit, Ordering::Relaxed);
    }

    /// TLS settings for worker streams (`None`: plaintext).
    pub(crate) fn tls(&self) -> Option<granary_security::TlsMaterial> {
        self.tls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Dials workers with `tls`.
    pub(crate) fn set_tls(&self, tls: Option<granary_security::TlsMaterial>) {
        *self.tls.lock().unwrap_or_else(PoisonError::into_inner) = tls;
    }

    /// The progress, locked.
    pub(crate) fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The position after the last delivered batch.
    pub(crate) fn position(&self) -> Position {
        let progress = self.progress();
        let consumer = &self.consumer;
        Position {
            pipeline: consumer.pipeline.clone(),
            job: consumer.job.clone(),
            consumer_index: consumer.consumer_index,
            num_consumers: consumer.num_consumers,
            mode: consumer.mode,
            epoch: progress.epoch,
            delivered: progress.delivered.ranges().to_vec(),
            plan_fingerprint: consumer.plan_fingerprint,
            sources: Vec::new(),
            version: POSITION_VERSION,
        }
    }

    /// The position as a resume point, for registering again.
    pub(crate) fn resume_point(&self) -> ResumePoint {
        let progress = self.progress();
        ResumePoint {
            epoch: progress.epoch,
            delivered: progress
                .delivered
                .ranges()
                .iter()
                .map(|&(start, end)| SlotRange { start, end })
                .collect(),
            plan_fingerprint: self.consumer.plan_fingerprint,
        }
    }

    /// Whether the consumer asks for data: it holds fewer complete batches than it assembles
    /// ahead and has epochs left. The dispatcher has the workers produce for a job only while
    /// one of its consumers asks or reads.
    pub(crate) fn wants_data(&self) -> bool {
        let progress = self.progress();
        !progress.finished && progress.buffered < progress.prefetch
    }

    /// The workers the consumer reads from now: whether all are on this host.
    pub(crate) fn note_workers<'a>(&self, addresses: impl IntoIterator<Item = &'a String>) {
        let mut any = false;
        let all_here = addresses.into_iter().all(|a| {
            any = true;
            crate::host::is_loopback(a)
        });
        self.workers_here.store(any && all_here, Ordering::Relaxed);
    }

    /// A heartbeat with the progress and the metrics since the last one; it asks for data as
    /// [`Session::wants_data`] says.
    pub(crate) fn heartbeat(&self) -> ClientHeartbeatRequest {
        let client_id = self.client_id();
        let mut progress = self.progress();
        let (buffered, prefetch) = (progress.buffered, progress.prefetch);
        let now = Instant::now();
        let metrics = progress.metrics.report(now, buffered, prefetch);
        let mut host = progress.host.sample(now);
        // Moving work to workers that share this host's cores would only add the wire's copies
        // on those cores: report no idle figure, which leaves the finishing here. (A stand-in
        // figure is a host of its own.)
        if self.workers_here.load(Ordering::Relaxed) && !host.stand_in {
            host.idle_cores = None;
        }
        ClientHeartbeatRequest {
            client_id,
            pipeline: self.consumer.pipeline.clone(),
            job: self.consumer.job.clone(),
            consumer_index: self.consumer.consumer_index,
            epoch: progress.epoch,
            delivered: progress.delivered.count(),
            metrics: Some(metrics),
            finished: progress.finished,
            wants_data: !progress.finished && buffered < prefetch,
            host_idle_cores: host.idle_cores,
            finish_cores: host.finish_cores,
            image_cores: Some(host.image_cores),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_messages_are_capped_at_the_pipelines_largest_part() {
        let consumer = Consumer {
            pipeline: "p".into(),
            job: "p".into(),
            consumer_index: 0,
            num_consumers: 1,
            mode: Mode::Distributed,
            plan_fingerprint: 0,
            image_plans: 0,
        };
        let session = Session::new(consumer, "d".into(), "c".into(), 0, SlotRanges::default());
        let cap = granary_proto::MAX_MESSAGE_BYTES;
        assert_eq!(session.max_part_bytes(), cap, "the cap until the dispatcher says");
        session.set_max_part_bytes(19_333_120);
        assert_eq!(session.max_part_bytes(), 19_333_120);
        session.set_max_part_bytes(0);
        assert_eq!(session.max_part_bytes(), cap, "unknown: the cap");
        session.set_max_part_bytes(u64::MAX);
        assert_eq!(session.max_part_bytes(), cap, "never above the cap");
    }
}
