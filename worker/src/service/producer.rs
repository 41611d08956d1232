//! One engine per pipeline generation, on its own thread: leased splits go in as tasks, and the
//! batches that come out are cut into parts and queued for their consumers.
//!
//! The engine owns a Tokio runtime of its own, so it is opened, run and dropped on a dedicated
//! thread, never on the service's async runtime. Leases reach the thread in the order their
//! tasks are fed to the execution, which yields outputs in task order: the thread pairs each
//! split's outputs with the lease at the front.

use super::metrics::{Counters, StageSource};
use super::queues::{ConsumerKey, Delivered, Pushed, Queues, delivery};
use super::router::{Routed, SplitRouter};
use crate::cache::CacheOutcome;
use crate::cache::profile::{Limits, Profiler};
use crate::engine::{DeferredNormalize, Engine, EngineError, EngineOptions};
use crate::executor::{CacheUse, Execution, Output, StageTimes, Task};
use crossbeam_channel::{Receiver, Sender, unbounded};
use granary_crds::{InputPipeline, Manifest};
use granary_proto::v1::{self as pb, CacheMode, Lease, Normalize, PipelineInfo, SplitEnd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, oneshot};

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
    },
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

/// Why a producer could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The manifest from the dispatcher is not an `InputPipeline`.
    #[error("pipeline `{pipeline}`: the manifest from the dispatcher does not parse: {error}")]
    Manifest {
        /// Pipeline name.
        pipeline: String,
        /// The parse error.
        error: serde_json::Error,
    },
    /// The engine could not open.
    #[error("pipeline `{pipeline}`: {error}")]
    Engine {
        /// Pipeline name.
        pipeline: String,
        /// What failed.
        error: EngineError,
    },
    /// The thread could not start.
    #[error("cannot start a producer thread: {0}")]
    Thread(std::io::Error),
    /// The thread ended before reporting.
    #[error("pipeline `{0}`: the producer thread stopped before its engine opened")]
    Stopped(String),
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

/// A leased split on its way through the engine.
struct Job {
    lease: Lease,
    revoked: Arc<AtomicBool>,
}

/// Where leases enter the thread: `None` once closed.
struct Inputs {
    jobs: Sender<Job>,
    feed: Sender<Task>,
}

type SharedInputs = Arc<Mutex<Option<Inputs>>>;

fn lock(inputs: &SharedInputs) -> MutexGuard<'_, Option<Inputs>> {
    inputs.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the thread reports once its engine is open.
struct Opened {
    splits: usize,
    stages: Vec<String>,
    times: Arc<StageTimes>,
    cuts: Vec<(usize, String)>,
}

/// An engine running one generation of a pipeline. Dropping it closes its feed: the splits
/// already fed are finished, then the thread ends and drops the engine.
pub struct Producer {
    pipeline: String,
    generation: u64,
    splits: usize,
    stages: Vec<String>,
    times: Arc<StageTimes>,
    /// The engine's legal cache cuts and their entries' fingerprints.
    cuts: Vec<(usize, String)>,
    inputs: SharedInputs,
    stop: Arc<AtomicBool>,
}

impl Producer {
    /// Opens the engine of `info` on a new thread and starts its execution.
    pub async fn open(
        info: &PipelineInfo,
        options: EngineOptions,
        sinks: Sinks,
    ) -> Result<Producer, ProducerError> {
        let pipeline: InputPipeline = serde_json::from_str(&info.manifest_json)
            .map_err(|error| ProducerError::Manifest { pipeline: info.name.clone(), error })?;
        let manifest = Manifest { pipeline, base_dir: PathBuf::from(&info.base_dir) };
        let (jobs, jobs_rx) = unbounded();
        let (feed, feed_rx) = unbounded::<Task>();
        let inputs: SharedInputs = Arc::new(Mutex::new(Some(Inputs { jobs, feed })));
        let stop = Arc::new(AtomicBool::new(false));
        let (opened_tx, opened_rx) = oneshot::channel();
        let info_wants_profile = info.cache_profile_wanted;
        let runner = Runner {
            pipeline: info.name.clone(),
            generation: info.generation,
            batch_size: 1,
            deferred: None,
            sinks,
            inputs: Arc::clone(&inputs),
            stop: Arc::clone(&stop),
        };
        std::thread::Builder::new()
            .name("granary-producer".to_string())
            .spawn(move || {
                let engine = match Engine::open(&manifest, options) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                let cuts = engine
                    .cache()
                    .map(|c| c.cuts.iter().map(|cut| (cut.index, cut.fingerprint.to_string())).collect())
                    .unwrap_or_default();
                let execution = engine.run_tasks(Box::new(feed_rx.into_iter()));
                let opened = Opened {
                    splits: engine.source().splits().len(),
                    stages: engine.stages().iter().map(|(_, name)| name.to_string()).collect(),
                    times: execution.stage_times(),
                    cuts,
                };
                if info_wants_profile {
                    let events = runner.sinks.events.clone();
                    if let Some(profiler) = engine.cache_profiler() {
                        profile_beside(profiler, &runner.pipeline, runner.generation, events);
                    } else if let Some(error) = engine.cache_error() {
                        let profile =
                            pb::CacheProfile { error: error.to_string(), ..pb::CacheProfile::default() };
                        let (pipeline, generation) = (runner.pipeline.clone(), runner.generation);
                        let _ = events.send(Event::CacheProfile { pipeline, generation, profile });
                    }
                }
                if opened_tx.send(Ok(opened)).is_err() {
                    return;
                }
                let deferred = engine.deferred().map(|d| (d.field.clone(), normalize_message(d)));
                let runner = Runner { batch_size: engine.batch_size(), deferred, ..runner };
                runner.run(execution, &jobs_rx);
                // The execution is dropped first, then the engine and its runtime, here.
            })
            .map_err(ProducerError::Thread)?;
        let opened = opened_rx
            .await
            .map_err(|_| ProducerError::Stopped(info.name.clone()))?
            .map_err(|error| ProducerError::Engine { pipeline: info.name.clone(), error })?;
        Ok(Producer {
            pipeline: info.name.clone(),
            generation: info.generation,
            splits: opened.splits,
            stages: opened.stages,
            times: opened.times,
            cuts: opened.cuts,
            inputs,
            stop,
        })
    }

    /// Pipeline generation of the engine.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Splits in the engine's listing.
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// The engine's stage timers, for the metrics.
    pub fn stage_source(&self) -> StageSource {
        StageSource {
            engine: format!("{}@{}", self.pipeline, self.generation),
            names: self.stages.clone(),
            times: Arc::clone(&self.times),
        }
    }

    /// What the lease asks of the cache, as this engine can do it: a cut this engine does not
    /// have, or an entry whose fingerprint differs from this engine's (the source or the stages
    /// changed), is computed instead.
    fn cache_use(&self, lease: &Lease) -> CacheUse {
        let Some(task) = &lease.cache else { return CacheUse::Compute };
        let mode = CacheMode::try_from(task.mode).unwrap_or(CacheMode::Compute);
        if mode == CacheMode::Compute {
            return CacheUse::Compute;
        }
        let cut = task.boundary as usize;
        if !self.cuts.iter().any(|(index, fp)| *index == cut && *fp == task.fingerprint) {
            tracing::warn!(
                pipeline = %lease.pipeline,
                split = lease.split,
                cut,
                fingerprint = %task.fingerprint,
                "the lease names a cache entry this worker's engine does not have (the source or the stages \
                 differ); computing the split instead"
            );
            return CacheUse::Compute;
        }
        match mode {
            CacheMode::Write => CacheUse::Write { cut },
            CacheMode::Read => CacheUse::Read { cut, elements: lease.elements },
            CacheMode::Compute => CacheUse::Compute,
        }
    }

    /// Feeds a leased split to the engine; false when the engine is closed or failed.
    pub fn submit(&self, lease: Lease, revoked: Arc<AtomicBool>) -> bool {
        let cache = self.cache_use(&lease);
        let inputs = lock(&self.inputs);
        let Some(inputs) = inputs.as_ref() else { return false };
        let Ok(split) = usize::try_from(lease.split) else { return false };
        let task = Task { epoch: lease.epoch, split, cache };
        inputs.jobs.send(Job { lease, revoked }).is_ok() && inputs.feed.send(task).is_ok()
    }

    /// Stops at once: nothing more is routed and the engine is dropped.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.inputs).take();
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        lock(&self.inputs).take();
    }
}

/// Measures the cache profile on a thread of its own, beside the splits the engine computes, and
/// reports it. A failure of the measurement (even a panic in a store client) is reported as the
/// profile's error: the pipeline then computes.
fn profile_beside(profiler: Profiler, pipeline: &str, generation: u64, events: mpsc::UnboundedSender<Event>) {
    let pipeline = pipeline.to_string();
    let spawned = std::thread::Builder::new().name("granary-cache-profile".to_string()).spawn(move || {
        let measured =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| profiler.measure(Limits::default())));
        let profile = match measured {
            Ok(Some(profile)) => profile,
            Ok(None) => return,
            Err(_) => pb::CacheProfile {
                error: "measuring the cache profile panicked".to_string(),
                ..pb::CacheProfile::default()
            },
        };
        let _ = events.send(Event::CacheProfile { pipeline, generation, profile });
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the cache profile thread: {e}; the pipeline will compute");
    }
}

/// The producer thread's side.
struct Runner {
    pipeline: String,
    generation: u64,
    batch_size: usize,
    /// The image field whose final normalization the consumers apply, and its parameters.
    deferred: Option<(String, Normalize)>,
    sinks: Sinks,
    inputs: SharedInputs,
    stop: Arc<AtomicBool>,
}

impl Runner {
    fn run(&self, mut execution: Execution, jobs: &Receiver<Job>) {
        let mut current: Option<(Job, SplitRouter)> = None;
        loop {
            let output = execution.next();
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(output) = output else { return };
            match output {
                Ok(Output::Batch { batch, .. }) => {
                    self.sinks.counters.elements.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if current.is_none() {
                        current = self.next_job(jobs);
                    }
                    let Some((job, router)) = current.as_mut() else {
                        return self.fail(None, jobs, "a batch came out of the engine with no lease for it");
                    };
                    let Some(origin) = batch.origin.filter(|o| o.split == job.lease.split) else {
                        let job = current.take().map(|(job, _)| job);
                        return self.fail(job, jobs, "a batch came out of the engine for another split");
                    };
                    if job.revoked.load(Ordering::Acquire) {
                        continue;
                    }
                    for routed in router.route(origin.sequence, batch) {
                        self.push(job, routed);
                    }
                }
                Ok(Output::SplitDone { task, elements, cache }) => {
                    let Some((job, router)) = current.take().or_else(|| self.next_job(jobs)) else {
                        return self.fail(None, jobs, "a split ended in the engine with no lease for it");
                    };
                    if task.epoch != job.lease.epoch || task.split as u64 != job.lease.split {
                        return self.fail(
                            Some(job),
                            jobs,
                            "the engine ended another split than the leased one",
                        );
                    }
                    self.finish(job, router, elements, cache);
                }
                Err(e) => {
                    // Outputs come in task order, so the failure belongs to the split being
                    // output, or, when none is yet, to the next one.
                    let job = current.take().map(|(job, _)| job).or_else(|| jobs.try_recv().ok());
                    let culprit = job.as_ref().map(|j| j.lease.lease_id);
                    return self.fail_with(job, jobs, &e.to_string(), culprit);
                }
            }
        }
    }

    fn next_job(&self, jobs: &Receiver<Job>) -> Option<(Job, SplitRouter)> {
        let job = jobs.recv().ok()?;
        let router = SplitRouter::new(&job.lease, self.batch_size);
        Some((job, router))
    }

    fn key(lease: &Lease, consumer_index: u32) -> ConsumerKey {
        ConsumerKey { pipeline: lease.pipeline.clone(), job: lease.job.clone(), consumer_index }
    }

    /// Queues a part for each of its consumers, waiting for room.
    fn push(&self, job: &Job, routed: Routed) {
        let Routed { consumers, mut part } = routed;
        if let Some((field, normalize)) = &self.deferred {
            for tensor in part.tensors.iter_mut().filter(|t| t.name == *field) {
                tensor.normalize = Some(normalize.clone());
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
                    tracing::debug!(lease = job.lease.lease_id, "lease revoked while waiting for room");
                    return;
                }
                Pushed::Closed => return,
            }
        }
    }

    /// The split of `job` is complete: send what is left, then its ends.
    fn finish(&self, job: Job, mut router: SplitRouter, elements: u64, cache: CacheOutcome) {
        let lease = &job.lease;
        if job.revoked.load(Ordering::Acquire) {
            let _ = self.sinks.events.send(Event::Abandoned { lease_id: lease.lease_id });
            return;
        }
        let finished = router.finish();
        for routed in finished.routed {
            self.push(&job, routed);
        }
        if elements != lease.elements {
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
        self.sinks.counters.cache_bytes_read.fetch_add(cache.bytes_read, Ordering::Relaxed);
        self.sinks.counters.cache_bytes_written.fetch_add(cache.bytes_written, Ordering::Relaxed);
        self.sinks.counters.cache_recomputed.fetch_add(cache.recomputed, Ordering::Relaxed);
        if cache.bad || cache.recomputed > 0 {
            self.sinks.counters.cache_fallback_splits.fetch_add(1, Ordering::Relaxed);
        }
        let cache = pb::CacheOutcome {
            bytes_read: cache.bytes_read,
            bytes_written: cache.bytes_written,
            written: cache.written,
            bad: cache.bad,
            problem: cache.problem.unwrap_or_default(),
            recomputed: cache.recomputed,
        };
        let _ =
            self.sinks.events.send(Event::Produced { lease_id: lease.lease_id, elements, delivered, cache });
    }

    /// Closes the feed and reports every lease the engine will not produce.
    fn fail(&self, current: Option<Job>, jobs: &Receiver<Job>, error: &str) {
        self.fail_with(current, jobs, error, None);
    }

    /// [`Self::fail`], naming the lease whose split caused it.
    fn fail_with(&self, current: Option<Job>, jobs: &Receiver<Job>, error: &str, culprit: Option<u64>) {
        // Nothing can be submitted once the inputs are gone, so the queue below is complete.
        lock(&self.inputs).take();
        let leases: Vec<u64> =
            current.into_iter().chain(jobs.try_iter()).map(|job| job.lease.lease_id).collect();
        let _ = self.sinks.events.send(Event::Failed {
            pipeline: self.pipeline.clone(),
            generation: self.generation,
            leases,
            culprit,
            error: error.to_string(),
        });
    }
}

/// The wire form of a normalization left to the consumers.
fn normalize_message(deferred: &DeferredNormalize) -> Normalize {
    Normalize {
        mean: deferred.mean.to_vec(),
        std: deferred.std.to_vec(),
        layout: match deferred.layout {
            granary_crds::ops::image::Layout::HWC => "HWC",
            granary_crds::ops::image::Layout::CHW => "CHW",
        }
        .to_string(),
    }
}
