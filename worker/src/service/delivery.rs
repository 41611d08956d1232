//! Handing a computed split to its consumers: each routed part into the queues of its
//! consumers, then the split's ends, then the report to the agent ([`Event`]).
//!
//! A split whose output count was known when it was leased is delivered as its batches come out
//! of the engine. A split of a pipeline that filters or packs is computed first and held
//! ([`CountedSplit`]): the agent reports its count to the dispatcher, and delivers it once the
//! dispatcher answers with its parts.

use super::finish::Deferred;
use super::metrics::Counters;
use super::queues::{ConsumerKey, Delivered, Pushed, Queues, delivery};
use super::router::{Routed, SplitRouter};
use crate::batch::Batch;
use crate::cache::CacheOutcome;
use crate::executor::{PlannedOutput, Skips};
use granary_proto::v1::{self as pb, Lease, SplitEnd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::sync::mpsc;

/// What a producer thread reports to the agent.
#[derive(Debug)]
pub enum Event {
    /// A leased split was computed and its parts and ends queued; `delivered` resolves once
    /// every consumer stream took the split's end (or the consumer was dropped).
    Produced {
        /// The lease.
        lease_id: u64,
        /// Elements the split produced.
        elements: u64,
        /// Resolves when the split was handed over.
        delivered: Delivered,
        /// What the cache did for the split.
        cache: pb::CacheOutcome,
        /// Elements a stage failed on that were dropped (`spec.errors.policy: skip`).
        skipped: Skips,
    },
    /// A split whose output count was unknown when leased was computed and is held: report its
    /// count, and deliver it by the parts the dispatcher answers with.
    Counted(CountedSplit),
    /// A split whose lease was revoked finished computing; nothing was routed.
    Abandoned {
        /// The lease.
        lease_id: u64,
    },
    /// The cache profile of a pipeline, measured beside its first splits.
    CacheProfile {
        /// Pipeline name.
        pipeline: String,
        /// Pipeline generation of the engine.
        generation: u64,
        /// What was measured.
        profile: pb::CacheProfile,
    },
    /// The execution failed; the engine is gone and these leases were not produced.
    Failed {
        /// Pipeline name.
        pipeline: String,
        /// Pipeline generation of the engine.
        generation: u64,
        /// Leases fed to the engine and not produced.
        leases: Vec<u64>,
        /// The lease whose split failed, when the failure was in its data (an element a stage
        /// could not take, a source read): the dispatcher counts it against the split.
        culprit: Option<u64>,
        /// What failed.
        error: String,
    },
}

/// What producers share with the rest of the worker.
#[derive(Clone)]
pub struct Sinks {
    /// Consumer queues.
    pub queues: Arc<Queues>,
    /// Counters for the metrics.
    pub counters: Arc<Counters>,
    /// Reports to the agent.
    pub events: mpsc::UnboundedSender<Event>,
}

/// A leased split on its way to its consumers.
pub(crate) struct Job {
    /// The lease.
    pub(crate) lease: Lease,
    /// Set when the lease is revoked: nothing more is routed.
    pub(crate) revoked: Arc<AtomicBool>,
}

/// What delivering needs: the queues and counters, and the pipeline's wire settings.
pub(crate) struct Delivery {
    /// Consumer queues, counters and the agent's events.
    pub(crate) sinks: Sinks,
    /// The final normalization the engine left out: the consumers finish it, or this worker
    /// does when the lease says so.
    pub(crate) deferred: Option<Deferred>,
    /// The images consumers make, for leases that say `images_on_client`.
    pub(crate) planned: Option<PlannedOutput>,
    /// Elements per batch.
    pub(crate) batch_size: usize,
}

impl Delivery {
    fn key(lease: &Lease, consumer_index: u32) -> ConsumerKey {
        ConsumerKey { pipeline: lease.pipeline.clone(), job: lease.job.clone(), consumer_index }
    }

    /// Queues a part for each of its consumers (never waiting for room: see [`super::queues`]).
    pub(crate) fn push(&self, job: &Job, routed: Routed) {
        let Routed { consumers, mut part } = routed;
        if let Some(output) = &self.planned {
            super::planned::to_wire(&mut part.tensors, output);
        }
        if let Some(deferred) = &self.deferred {
            let started = Instant::now();
            let finished = deferred.apply(&mut part.tensors, job.lease.normalize_on_worker);
            if finished > 0 {
                let counters = &self.sinks.counters;
                let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                counters.finish_nanos.fetch_add(nanos, Ordering::Relaxed);
                counters.finish_elements.fetch_add(finished, Ordering::Relaxed);
            }
        }
        let last = consumers.len().saturating_sub(1);
        let mut part = Some(part);
        for (i, consumer) in consumers.into_iter().enumerate() {
            let Some(message) = (if i == last { part.take() } else { part.clone() }) else { break };
            let key = Self::key(&job.lease, consumer);
            let (lo, hi) = (message.lo, message.hi);
            match self.sinks.queues.push_part(&key, message, &job.revoked) {
                Pushed::Queued => {}
                Pushed::Gone => tracing::debug!(consumer = %key, lo, hi, "consumer gone; part dropped"),
                Pushed::Cancelled => {
                    tracing::debug!(
                        lease = job.lease.lease_id,
                        "lease revoked; the rest of its parts are dropped"
                    );
                    return;
                }
                Pushed::Closed => return,
            }
        }
    }

    /// The split of `job` is complete: send what is left, then its ends, and report it.
    pub(crate) fn finish(
        &self,
        job: Job,
        mut router: SplitRouter,
        elements: u64,
        cache: CacheOutcome,
        skipped: Skips,
    ) {
        let lease = &job.lease;
        if job.revoked.load(Ordering::Acquire) {
            let _ = self.sinks.events.send(Event::Abandoned { lease_id: lease.lease_id });
            return;
        }
        let finished = router.finish();
        for routed in finished.routed {
            self.push(&job, routed);
        }
        if !lease.count_first && elements != lease.elements {
            tracing::error!(
                pipeline = %lease.pipeline,
                epoch = lease.epoch,
                split = lease.split,
                expected = lease.elements,
                produced = elements,
                "split {} of epoch {} produced {elements} elements but its lease expects {}; the source \
                 changed since it was listed",
                lease.split,
                lease.epoch,
                lease.elements,
            );
        }
        if finished.incomplete > 0 {
            tracing::warn!(
                pipeline = %lease.pipeline,
                epoch = lease.epoch,
                split = lease.split,
                parts = finished.incomplete,
                "the split ended short; its incomplete parts were not sent"
            );
        }
        let (token, delivered) = delivery();
        if !job.revoked.load(Ordering::Acquire) {
            for consumer in router.consumers() {
                let end = SplitEnd { epoch: lease.epoch, split: lease.split };
                self.sinks.queues.push_end(&Self::key(lease, consumer), end, token.clone());
            }
        }
        drop(token);
        let counters = &self.sinks.counters;
        counters.cache_bytes_read.fetch_add(cache.bytes_read, Ordering::Relaxed);
        counters.cache_bytes_written.fetch_add(cache.bytes_written, Ordering::Relaxed);
        counters.cache_recomputed.fetch_add(cache.recomputed, Ordering::Relaxed);
        counters.skipped.fetch_add(skipped.elements, Ordering::Relaxed);
        if cache.bad || cache.recomputed > 0 {
            counters.cache_fallback_splits.fetch_add(1, Ordering::Relaxed);
        }
        let cache = pb::CacheOutcome {
            bytes_read: cache.bytes_read,
            bytes_written: cache.bytes_written,
            written: cache.written,
            bad: cache.bad,
            problem: cache.problem.unwrap_or_default(),
            recomputed: cache.recomputed,
        };
        let produced = Event::Produced { lease_id: lease.lease_id, elements, delivered, cache, skipped };
        let _ = self.sinks.events.send(produced);
    }
}

/// A split computed before its parts were known: its batches, held until the dispatcher says
/// how they are routed.
///
/// Its batches no longer count against the engine's prefetch budget. A split waits here for the
/// counts of the splits before it in the epoch, and one of those may be computed next by this
/// very engine (a replay leased after it): holding budget would stall that computation, and
/// with it this split. The wait is short (the splits before it are leased before it), and a
/// worker holds few leases at once.
pub struct CountedSplit {
    job: Job,
    batches: Vec<(u64, Batch)>,
    elements: u64,
    cache: CacheOutcome,
    skipped: Skips,
    delivery: Arc<Delivery>,
}

impl std::fmt::Debug for CountedSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedSplit")
            .field("lease", &self.job.lease.lease_id)
            .field("elements", &self.elements)
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl CountedSplit {
    /// Holds a split's batches (by sequence) until its parts are known.
    pub(crate) fn new(
        job: Job,
        batches: Vec<(u64, Batch)>,
        elements: u64,
        cache: CacheOutcome,
        skipped: Skips,
        delivery: Arc<Delivery>,
    ) -> CountedSplit {
        CountedSplit { job, batches, elements, cache, skipped, delivery }
    }

    /// The lease.
    pub fn lease_id(&self) -> u64 {
        self.job.lease.lease_id
    }

    /// Elements the split produced.
    pub fn elements(&self) -> u64 {
        self.elements
    }

    /// Whether the lease was revoked meanwhile.
    pub fn revoked(&self) -> bool {
        self.job.revoked.load(Ordering::Acquire)
    }

    /// Routes the held batches by `parts` and delivers the split. Routing cuts and copies
    /// tensors: run it on a blocking thread, not on the async runtime.
    pub fn deliver(self, parts: Vec<pb::Part>) {
        let CountedSplit { mut job, batches, elements, cache, skipped, delivery } = self;
        job.lease.parts = parts;
        let mut router = SplitRouter::new(&job.lease, delivery.batch_size);
        for (sequence, batch) in batches {
            if job.revoked.load(Ordering::Acquire) {
                break;
            }
            for routed in router.route(sequence, batch) {
                delivery.push(&job, routed);
            }
        }
        delivery.finish(job, router, elements, cache, skipped);
    }

    /// Gives up on the split (its lease is gone): reports it abandoned.
    pub fn abandon(self) {
        let _ = self.delivery.sinks.events.send(Event::Abandoned { lease_id: self.job.lease.lease_id });
    }
}
