//! One engine per pipeline generation, on its own thread: leased splits go in as tasks, and the
//! batches that come out are cut into parts and queued for their consumers.
//!
//! The engine owns a Tokio runtime of its own, so it is opened, run and dropped on a dedicated
//! thread, never on the service's async runtime. Leases reach the thread in the order their
//! tasks are fed to the execution, which yields outputs in task order: the thread pairs each
//! split's outputs with the lease at the front.

use super::delivery::{CountedSplit, Delivery, Job};
use super::delivery::{Event, Sinks};
use super::finish::Deferred;
use super::metrics::StageSource;
use super::router::SplitRouter;
use crate::cache::EngineCache;
use crate::cache::profile::{Limits, Profiler};
use crate::contained::contained;
use crate::engine::{Engine, EngineError, EngineOptions};
use crate::executor::{CacheUse, ClientShare, Execution, Output, StageTimes, Task};
use crate::source::read_ahead::ReadAhead;
use crossbeam_channel::{Receiver, Sender, unbounded};
use granary_crds::{InputPipeline, Manifest};
use granary_proto::v1::{self as pb, CacheMode, Lease, PipelineInfo};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, oneshot};

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
    reads: Option<Arc<ReadAhead>>,
    cache: Option<Arc<EngineCache>>,
}

/// An engine running one generation of a pipeline. Dropping it closes its feed: the splits
/// already fed are finished, then the thread ends and drops the engine.
pub struct Producer {
    pipeline: String,
    generation: u64,
    splits: usize,
    stages: Vec<String>,
    times: Arc<StageTimes>,
    /// The source's tuned reads in flight, when it reads one object per sample.
    reads: Option<Arc<ReadAhead>>,
    /// The engine's legal cache cuts with their entries, and where each split's entry is.
    cache: Option<Arc<EngineCache>>,
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
            delivery: Arc::new(Delivery { sinks, deferred: None, planned: None, batch_size: 1 }),
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
                let cache = engine.shared_cache();
                let execution = engine.run_tasks(Box::new(feed_rx.into_iter()));
                let opened = Opened {
                    splits: engine.source().splits().len(),
                    stages: engine.stages().iter().map(|(_, name)| name.to_string()).collect(),
                    times: execution.stage_times(),
                    reads: engine.source().read_ahead(),
                    cache,
                };
                if info_wants_profile {
                    let events = runner.delivery.sinks.events.clone();
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
                let deferred = engine.deferred().map(Deferred::new);
                let sinks = runner.delivery.sinks.clone();
                let planned = engine.planned_output().cloned();
                let delivery =
                    Arc::new(Delivery { sinks, deferred, planned, batch_size: engine.batch_size() });
                let runner = Runner { delivery, ..runner };
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
            reads: opened.reads,
            cache: opened.cache,
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

    /// Reads its `format: files` source keeps in flight now; 0 for other formats.
    pub fn read_depth(&self) -> usize {
        self.reads.as_ref().map_or(0, |reads| reads.depth())
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
        // The entry of the split's source (a further pass of an upsampled source: of its base
        // split), as this engine fingerprints it.
        let entry = self.cache.as_ref().and_then(|c| {
            let at = c.cut(cut)?;
            c.entry(at, lease.split).map(|e| e.fingerprint.as_str() == task.fingerprint)
        });
        if entry != Some(true) {
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
            CacheMode::Read => CacheUse::Read { cut, elements: lease.listed },
            CacheMode::Compute => CacheUse::Compute,
        }
    }

    /// Feeds a leased split to the engine; false when the engine is closed or failed.
    pub fn submit(&self, lease: Lease, revoked: Arc<AtomicBool>) -> bool {
        let cache = self.cache_use(&lease);
        let inputs = lock(&self.inputs);
        let Some(inputs) = inputs.as_ref() else { return false };
        let Ok(split) = usize::try_from(lease.split) else { return false };
        let task = Task { epoch: lease.epoch, split, cache, images_on_client: client_share(&lease) };
        inputs.jobs.send(Job { lease, revoked }).is_ok() && inputs.feed.send(task).is_ok()
    }

    /// Stops at once: nothing more is routed and the engine is dropped.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.inputs).take();
    }
}

/// The share of a lease's images its consumers make: `client_image_share` of a lease that says
/// `images_on_client` (all of them where a dispatcher that predates shares leaves it 0), none
/// otherwise. The worker cannot normalize images it does not make: a lease that asks for both
/// has them made here (the dispatcher never asks).
fn client_share(lease: &Lease) -> ClientShare {
    if !lease.images_on_client || lease.normalize_on_worker {
        return ClientShare::NONE;
    }
    match lease.client_image_share {
        share if share > 0.0 => ClientShare::of(share),
        _ => ClientShare::ALL,
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
        let profile = match contained(|| profiler.measure(Limits::default())) {
            Ok(Some(profile)) => profile,
            Ok(None) => return,
            Err(why) => pb::CacheProfile {
                error: format!("measuring the cache profile panicked ({why})"),
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
    delivery: Arc<Delivery>,
    inputs: SharedInputs,
    stop: Arc<AtomicBool>,
}

/// Where the batches of the split being output go.
enum Route {
    /// Its parts are known: routed as they come.
    Now(SplitRouter),
    /// Its count is not known yet: held, by sequence, until the split is counted.
    Held(Vec<(u64, crate::batch::Batch)>),
}

impl Runner {
    fn run(&self, mut execution: Execution, jobs: &Receiver<Job>) {
        let mut current: Option<(Job, Route)> = None;
        loop {
            let output = execution.next();
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let Some(output) = output else { return };
            match output {
                Ok(Output::Batch { mut batch, .. }) => {
                    let counters = &self.delivery.sinks.counters;
                    counters.elements.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    if current.is_none() {
                        current = self.next_job(jobs);
                    }
                    let Some((job, route)) = current.as_mut() else {
                        return self.fail(None, jobs, "a batch came out of the engine with no lease for it");
                    };
                    let Some(origin) = batch.origin.filter(|o| o.split == job.lease.split) else {
                        let job = current.take().map(|(job, _)| job);
                        return self.fail(job, jobs, "a batch came out of the engine for another split");
                    };
                    if job.revoked.load(Ordering::Acquire) {
                        continue;
                    }
                    match route {
                        Route::Now(router) => {
                            for routed in router.route(origin.sequence, batch) {
                                self.delivery.push(job, routed);
                            }
                        }
                        Route::Held(batches) => {
                            batch.permit = None;
                            batches.push((origin.sequence, batch));
                        }
                    }
                }
                Ok(Output::SplitDone { task, elements, cache, skipped }) => {
                    let Some((job, route)) = current.take().or_else(|| self.next_job(jobs)) else {
                        return self.fail(None, jobs, "a split ended in the engine with no lease for it");
                    };
                    if task.epoch != job.lease.epoch || task.split as u64 != job.lease.split {
                        return self.fail(
                            Some(job),
                            jobs,
                            "the engine ended another split than the leased one",
                        );
                    }
                    match route {
                        Route::Now(router) => self.delivery.finish(job, router, elements, cache, skipped),
                        Route::Held(batches) => {
                            let delivery = Arc::clone(&self.delivery);
                            let counted = CountedSplit::new(job, batches, elements, cache, skipped, delivery);
                            let _ = self.delivery.sinks.events.send(Event::Counted(counted));
                        }
                    }
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

    fn next_job(&self, jobs: &Receiver<Job>) -> Option<(Job, Route)> {
        let job = jobs.recv().ok()?;
        let route = if job.lease.count_first {
            Route::Held(Vec::new())
        } else {
            Route::Now(SplitRouter::new(&job.lease, self.delivery.batch_size))
        };
        Some((job, route))
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
        let _ = self.delivery.sinks.events.send(Event::Failed {
            pipeline: self.pipeline.clone(),
            generation: self.generation,
            leases,
            culprit,
            error: error.to_string(),
        });
    }
}
