//! The dispatcher's state as a pure state machine: requests and the time (milliseconds since
//! start, as data) in, answers and journal events out. No I/O and no clock here, so every rule is
//! tested directly.

mod attached;
mod cache;
mod collect;
mod consumers;
mod demand;
mod events;
mod leases;
mod placement;
mod skips;
mod tallies;

pub(crate) use cache::boundary_entries;
pub use cache::{
    CACHE_STATES, CacheConfig, CacheReport, DEFAULT_RETENTION_HOURS, EpochCache, EpochCheck, PROFILE_WAIT_MS,
    STORAGE_PER_GB_MONTH, SourceEntry, StoreUse,
};
pub use consumers::{MAX_CONSUMERS, MAX_JOB_NAME_BYTES, MAX_JOBS_PER_PIPELINE};
pub use events::Event;
pub use leases::MIN_SPLITS_AHEAD;
pub use tallies::{BucketTotals, TrainerTotals, WorkerCounts};

use crate::plan::{EpochPlan, MixPlan, MixStop, Mode, PlanSettings};
use granary_policies::image_placement::{ImageWish, ShareMarks};
use granary_policies::placement::{HostLoad, Place};
use granary_proto::v1 as pb;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Timing of liveness.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How often workers and clients heartbeat.
    pub heartbeat_ms: u32,
    /// How long a lease lives without a renewal; a worker silent this long is dead.
    pub lease_ms: u64,
    /// How long a silent consumer keeps its place before workers drop its parts.
    pub client_timeout_ms: u64,
    /// How long a job with no consumer reading it (none registered, every one gone or finished,
    /// and no heartbeat) is kept before it is collected with its progress, as tf.data's job GC.
    pub job_gc_ms: u64,
    /// Longest a `LeaseSplit` call with nothing to lease waits for work to become leasable
    /// before it answers with none. About as long as a worker used to wait between tries, so an
    /// idle worker asks no more often than before, while one that waits on its consumers' next
    /// epoch (a dataset of few splits) hears of it at once.
    pub lease_wait_ms: u64,
    /// The fewest splits a job may run ahead of the epoch its slowest consumer is in: an epoch of
    /// fewer runs as many epochs ahead as hold this many ([`MIN_SPLITS_AHEAD`] by default); 0
    /// leases exactly one epoch ahead, whatever its size.
    pub min_splits_ahead: usize,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_ms: 500,
            lease_ms: 4000,
            client_timeout_ms: 10_000,
            job_gc_ms: 600_000,
            lease_wait_ms: 50,
            min_splits_ahead: leases::MIN_SPLITS_AHEAD,
        }
    }
}

#[cfg(test)]
impl Timing {
    /// The defaults, but leasing exactly one epoch ahead, whatever its size: for tests that step
    /// a consumer through epochs of a few splits.
    pub(crate) fn one_epoch_ahead() -> Timing {
        Timing { min_splits_ahead: 0, ..Timing::default() }
    }
}

/// Why a request was refused; each maps to a gRPC status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// Something named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A field is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request does not fit the current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// No room (e.g. every consumer place of a job is taken).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller may not do this (e.g. complete a lease another worker holds).
    #[error("{0}")]
    PermissionDenied(String),
}

/// The ids the state holds, see [`State::live_ids`].
#[derive(Debug, Default)]
pub struct LiveIds {
    /// Registered workers.
    pub workers: std::collections::HashSet<String>,
    /// Client sessions of every consumer.
    pub clients: std::collections::HashSet<String>,
    /// `(pipeline, job)`.
    pub jobs: std::collections::HashSet<(String, String)>,
}

/// Attempts at producing one split of one epoch that may fail (the worker reports an error)
/// before its pipeline fails. Leases that expire (a worker that died) do not count.
pub const MAX_SPLIT_ATTEMPTS: u32 = 3;

/// Facts about a registered pipeline's source and spec that plans need.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineFacts {
    /// The manifest as JSON (relative paths resolved).
    pub manifest_json: String,
    /// Folder relative paths resolve from.
    pub base_dir: String,
    /// Elements of each split, as listed.
    pub counts: Vec<u64>,
    /// Whether each split's output count is its listed count (no stage filters or packs).
    /// Journals written before the field existed had only such pipelines.
    #[serde(default = "counts_known_default")]
    pub counts_known: bool,
    /// Elements per batch.
    pub batch: u64,
    /// Epochs to run.
    pub epochs: u32,
    /// `dropRemainder`.
    pub drop_remainder: bool,
    /// Whether splits are visited in a seeded random order.
    pub shuffle: bool,
    /// Pipeline seed.
    pub seed: u64,
    /// How `spec.sources` are mixed; absent for a single source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixing: Option<MixFacts>,
}

/// How a pipeline's inputs are mixed, as the plan needs it (see [`crate::plan::MixPlan`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MixFacts {
    /// Name of each input, in order.
    #[serde(default)]
    pub names: Vec<String>,
    /// Listed splits of each input, in order.
    pub splits: Vec<u64>,
    /// Weights, as integer shares summing to 2^32.
    pub weights: Vec<u64>,
    /// Elements drawn from one input at a time.
    pub block: u64,
    /// Elements per epoch (`stop: elements`); absent: the epoch ends when a draw finds its
    /// input exhausted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<u64>,
}

impl MixFacts {
    /// The mixing of `spec` over inputs of `splits` listed splits each; `None` for one source.
    pub fn of(spec: &granary_crds::InputPipelineSpec, splits: &[u64]) -> Option<MixFacts> {
        if !spec.is_mixed() {
            return None;
        }
        let mixing = spec.mixing.clone().unwrap_or_default();
        let weights: Vec<f64> = spec.sources.iter().map(|s| s.weight).collect();
        Some(MixFacts {
            names: spec.sources.iter().map(|s| s.name.clone()).collect(),
            splits: splits.to_vec(),
            weights: MixPlan::weights(&weights),
            block: u64::from(mixing.block()),
            elements: match mixing.stop {
                granary_crds::MixStop::Elements => mixing.elements,
                granary_crds::MixStop::FirstExhausted => None,
            },
        })
    }

    /// The sources as a consumer's plan names them.
    pub fn plan_sources(&self) -> Vec<pb::PlanSource> {
        self.splits
            .iter()
            .enumerate()
            .map(|(i, &splits)| pb::PlanSource {
                name: self.names.get(i).cloned().unwrap_or_default(),
                splits,
            })
            .collect()
    }

    /// The plan's view.
    pub fn plan(&self) -> MixPlan {
        MixPlan {
            splits: self.splits.clone(),
            weights: self.weights.clone(),
            block: self.block.max(1),
            stop: match self.elements {
                Some(n) => MixStop::Elements(n),
                None => MixStop::FirstExhausted,
            },
        }
    }
}

use granary_crds::part_bound::PartBound;

impl PipelineFacts {
    /// The largest batch part the pipeline's workers send, in bytes, when its output shape is
    /// static (never above the transport's cap); 0 when it is not known.
    pub fn max_part_bytes(&self) -> u64 {
        let bound = PartBound::of_manifest_json(&self.manifest_json);
        match bound {
            PartBound::Static { .. } => bound.limit(granary_proto::MAX_MESSAGE_BYTES) as u64,
            PartBound::Capped => 0,
        }
    }

    /// Sources of the pipeline: those of `spec.sources`, or 1.
    pub fn inputs(&self) -> usize {
        self.mixing.as_ref().map_or(1, |m| m.splits.len().max(1))
    }

    /// Where split id `split` keeps its cache entries: `(source, split of that source's
    /// listing)`. Each source has entries of its own, shared with single-source pipelines that
    /// read it, so a split's entry split is its index in its own source's listing. A split id
    /// past the listing (a further pass of an upsampled source, `pass × splits + id`) reads
    /// listed split `id` and shares its entry split: the stages before a cut are deterministic,
    /// so a pass's elements there do not depend on the seeds that differ between passes.
    /// `None` for an id no source lists.
    pub fn entry_split(&self, split: u64) -> Option<(usize, u64)> {
        let base = split.checked_rem(self.counts.len() as u64)?;
        let Some(mixing) = &self.mixing else { return Some((0, base)) };
        let mut first = 0u64;
        for (input, &splits) in mixing.splits.iter().enumerate() {
            if base < first.saturating_add(splits) {
                return Some((input, base - first));
            }
            first = first.saturating_add(splits);
        }
        None
    }
}

fn counts_known_default() -> bool {
    true
}

/// A split's progress in one epoch of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SplitStatus {
    Pending,
    Leased(u64),
    Done,
}

pub(crate) struct EpochState {
    pub(crate) plan: EpochPlan,
    /// Next index in the plan's order to look at for a pending split.
    pub(crate) cursor: usize,
    pub(crate) status: Statuses,
}

/// Each split's progress in an epoch, by split id; ids past the listing (passes over a mixed
/// source) are added as the plan hands them out. A split never seen is pending.
#[derive(Clone, Debug, Default)]
pub(crate) struct Statuses(Vec<SplitStatus>);

impl Statuses {
    pub(crate) fn new(splits: usize) -> Statuses {
        Statuses(vec![SplitStatus::Pending; splits])
    }

    pub(crate) fn get(&self, split: u64) -> SplitStatus {
        self.0.get(split as usize).copied().unwrap_or(SplitStatus::Pending)
    }

    pub(crate) fn set(&mut self, split: u64, status: SplitStatus) {
        let i = split as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, SplitStatus::Pending);
        }
        self.0[i] = status;
    }

    /// `(split, status)` of every split seen.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, SplitStatus)> + '_ {
        self.0.iter().enumerate().map(|(i, s)| (i as u64, *s))
    }
}

/// Work queued ahead of the epoch order: re-leases and replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replay {
    pub(crate) epoch: u32,
    pub(crate) split: u64,
    /// Only this consumer's parts; `None` re-produces the whole split.
    pub(crate) only: Option<u32>,
}

pub(crate) struct Consumer {
    pub(crate) client_id: String,
    pub(crate) last_seen: u64,
    pub(crate) epoch: u32,
    pub(crate) delivered: u64,
    pub(crate) finished: bool,
    pub(crate) gone: bool,
    pub(crate) metrics: Option<pb::ClientMetrics>,
    /// This session's cumulative figures so far, for the job's totals.
    pub(crate) seen: tallies::SessionSeen,
    /// Whether it asks for data (see [`demand`]).
    pub(crate) demand: demand::Demand,
    /// What its host reported, for placement.
    pub(crate) host: HostLoad,
    /// Where it wants the images of the pipeline's fused image run made.
    pub(crate) images: ImageWish,
}

/// The failed attempts at one split of one epoch, and the last one's worker and error.
#[derive(Clone, Debug, Default)]
pub(crate) struct Attempts {
    pub(crate) count: u32,
    pub(crate) worker: String,
    pub(crate) error: String,
}

pub(crate) struct Job {
    pub(crate) mode: Mode,
    pub(crate) settings: PlanSettings,
    pub(crate) consumers: BTreeMap<u32, Consumer>,
    pub(crate) epochs: BTreeMap<u32, EpochState>,
    pub(crate) replays: VecDeque<Replay>,
    /// What the job's trainers reported, for metrics.
    pub(crate) trainer: TrainerTotals,
    /// Failed attempts per (epoch, split).
    pub(crate) failures: BTreeMap<(u32, u64), Attempts>,
    /// When a consumer last registered or heartbeat (the state's clock; 0 on replay, so a
    /// restarted dispatcher gives every job a full [`Timing::job_gc_ms`] to be claimed again).
    pub(crate) last_alive: u64,
    /// Whether the job's record is in the journal. It is written with the job's first lease:
    /// until then nothing was produced for the job, so it holds nothing a restarted dispatcher
    /// must keep (its consumers register again and make it anew), and a job that is joined and
    /// never read costs no journal write, neither made nor collected.
    pub(crate) journaled: bool,
    /// Where the final normalization runs for the job's next leases ([`placement`]).
    pub(crate) place: Place,
    /// The share of its images the consumers' hosts make, and which leases carry it
    /// ([`placement`]).
    pub(crate) images: ImagePlacement,
}

/// A job's placement of its image run: the share of its images the consumers make.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ImagePlacement {
    /// The share (0 to 1).
    pub(crate) share: f64,
    /// When it last moved (the state's clock); `None` before it ever did.
    pub(crate) moved_at: Option<u64>,
    /// Which leases are marked for workers that take whole leases, not shares.
    pub(crate) marks: ShareMarks,
}

impl Job {
    pub(crate) fn epoch(&mut self, epoch: u32) -> &mut EpochState {
        let settings = &self.settings;
        self.epochs.entry(epoch).or_insert_with(|| {
            let plan = settings.plan(epoch);
            EpochState { plan, cursor: 0, status: Statuses::new(settings.counts.len()) }
        })
    }

    /// The epoch the slowest consumer is in (epochs are leased ahead of it: one, or more when an
    /// epoch holds fewer than [`Timing::min_splits_ahead`] splits).
    pub(crate) fn slowest_epoch(&self, epochs: u32) -> u32 {
        self.consumers.values().map(|c| if c.finished { epochs } else { c.epoch }).min().unwrap_or(0)
    }
}

pub(crate) struct Pipeline {
    pub(crate) facts: PipelineFacts,
    pub(crate) generation: u64,
    pub(crate) jobs: BTreeMap<String, Job>,
    /// Set when the source no longer matches the plan.
    pub(crate) failed: Option<String>,
    /// Cache settings, profile, decision and figures.
    pub(crate) cache: cache::PipelineCache,
    /// `spec.errors`, and the elements skipped under it (see [`skips`]).
    pub(crate) skips: skips::Skips,
    /// The jobs a consumer asked data of lately: the only ones leasing looks at (see
    /// [`demand`]).
    pub(crate) asking: BTreeSet<String>,
    /// Whether the last job collected had delivered every epoch: with no job left, the
    /// pipeline stays complete (see [`State::completed`]).
    pub(crate) last_collected_complete: bool,
}

impl Pipeline {
    pub(crate) fn new(facts: PipelineFacts, generation: u64) -> Pipeline {
        let cache = cache::PipelineCache::new(&facts.manifest_json);
        let skips = skips::Skips::new(&facts.manifest_json);
        Pipeline {
            facts,
            generation,
            jobs: BTreeMap::new(),
            failed: None,
            cache,
            skips,
            asking: BTreeSet::new(),
            last_collected_complete: false,
        }
    }
}

pub(crate) struct WorkerEntry {
    pub(crate) address: String,
    /// Where the worker serves its metrics, if it does.
    pub(crate) metrics_address: Option<String>,
    pub(crate) pipeline: Option<String>,
    pub(crate) last_seen: u64,
    pub(crate) leases: BTreeSet<u64>,
    pub(crate) metrics: Option<pb::WorkerMetrics>,
    /// It plans a share of a split's images (`Lease.client_image_share`); an older worker gets
    /// whole splits marked instead.
    pub(crate) plans_image_shares: bool,
}

pub(crate) struct LeaseEntry {
    pub(crate) worker: String,
    pub(crate) pipeline: String,
    pub(crate) job: String,
    pub(crate) replay: Replay,
    pub(crate) deadline: u64,
    /// The cache task the lease was given.
    pub(crate) cache: Option<pb::CacheTask>,
}

/// Metrics of one pipeline, latest report of each worker and consumer, for the policies.
#[derive(Clone, Debug, Default)]
pub struct MetricsSnapshot {
    /// Per worker (id, metrics).
    pub workers: Vec<(String, pb::WorkerMetrics)>,
    /// Per consumer (job, index, metrics).
    pub consumers: Vec<(String, u32, pb::ClientMetrics)>,
    /// What each of those consumers' hosts last reported (job, index, load), for placement and
    /// the autoscaler's count of trainer-host cores.
    pub hosts: Vec<(String, u32, HostLoad)>,
}

/// Progress of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobProgress {
    /// Job name.
    pub job: String,
    /// Consumers registered.
    pub consumers: u32,
    /// Consumers the job was declared with.
    pub declared: u32,
    /// Consumers that delivered every epoch.
    pub finished: u32,
    /// The slowest consumer's epoch.
    pub epoch: u32,
    /// Distributed or replicated.
    pub mode: Mode,
    /// Batches each consumer gets per epoch (about: the last round may be split).
    pub batches_per_epoch: u64,
    /// Whether the workers apply the final normalization for it now (placement), rather than
    /// its clients.
    pub normalize_on_worker: bool,
    /// The share of its images its consumers' hosts make now (placement), 0 to 1.
    pub image_share: f64,
}

/// How many times a pipeline's splits were leased, completed, and put back in the queue (given
/// back by a draining worker, or taken from a dead or late one), since this dispatcher started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitCounts {
    /// Leases granted.
    pub leased: u64,
    /// Splits reported complete.
    pub completed: u64,
    /// Leases that ended without completion; their splits went back to the queue.
    pub requeued: u64,
}

/// The whole dispatcher state.
pub struct State {
    pub(crate) timing: Timing,
    pub(crate) pipelines: BTreeMap<String, Pipeline>,
    pub(crate) workers: BTreeMap<String, WorkerEntry>,
    pub(crate) leases: BTreeMap<u64, LeaseEntry>,
    pub(crate) next_lease: u64,
    pub(crate) next_id: u64,
    /// Events to journal, drained by the caller after each request.
    pub(crate) events: Vec<Event>,
    /// Round-robin position over (pipeline, job) for leasing.
    pub(crate) turn: usize,
    /// Cache entries by (store URL, fingerprint), shared by the pipelines that choose them.
    pub(crate) cache_entries: BTreeMap<cache::EntryKey, cache::EntryState>,
    /// Entries pipelines started reading, for the service to touch.
    pub(crate) cache_touches: Vec<cache::EntryKey>,
    /// Lease outcomes per pipeline, for metrics (not journaled).
    pub(crate) split_counts: BTreeMap<String, SplitCounts>,
    /// Worker registrations and losses per pipeline, for metrics (not journaled).
    pub(crate) worker_counts: BTreeMap<String, WorkerCounts>,
    /// Errors never name other pipelines (authentication is on: callers see only their own).
    pub(crate) private: bool,
    /// Set when work may have become leasable (a consumer moved to a new epoch or asked for
    /// data, a split went back to be leased again): the service wakes the workers waiting for a
    /// lease. Taken by [`State::take_leasable`].
    pub(crate) leasable: bool,
}

impl State {
    /// An empty state. `id_base` makes lease and session ids of this run distinct from those
    /// of earlier runs (use the wall clock).
    pub fn new(timing: Timing, id_base: u64) -> State {
        State {
            timing,
            pipelines: BTreeMap::new(),
            workers: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: id_base << 16,
            next_id: id_base,
            events: Vec::new(),
            turn: 0,
            cache_entries: BTreeMap::new(),
            cache_touches: Vec::new(),
            split_counts: BTreeMap::new(),
            worker_counts: BTreeMap::new(),
            private: false,
            leasable: false,
        }
    }

    /// The ids of the registered workers, the open client sessions and the jobs: what access
    /// bindings may refer to.
    pub fn live_ids(&self) -> LiveIds {
        let mut live = LiveIds { workers: self.workers.keys().cloned().collect(), ..LiveIds::default() };
        for (name, p) in &self.pipelines {
            for (job_name, job) in &p.jobs {
                live.jobs.insert((name.clone(), job_name.clone()));
                live.clients.extend(job.consumers.values().map(|c| c.client_id.clone()));
            }
        }
        live
    }

    /// Keeps other pipelines' names out of error messages (authentication is on).
    pub fn set_private(&mut self, private: bool) {
        self.private = private;
    }

    /// Lease outcomes of `pipeline` since this dispatcher started.
    pub fn split_counts(&self, pipeline: &str) -> SplitCounts {
        self.split_counts.get(pipeline).copied().unwrap_or_default()
    }

    /// Worker registrations and losses of `pipeline` since this dispatcher started.
    pub fn worker_counts(&self, pipeline: &str) -> WorkerCounts {
        self.worker_counts.get(pipeline).copied().unwrap_or_default()
    }

    /// What the trainers of each job of `pipeline` reported: `(job, totals)`.
    pub fn trainer_totals(&self, pipeline: &str) -> Vec<(String, TrainerTotals)> {
        self.pipelines.get(pipeline).map_or_else(Vec::new, |p| {
            p.jobs.iter().map(|(name, job)| (name.clone(), job.trainer.clone())).collect()
        })
    }

    /// The metrics endpoints of the registered workers.
    pub fn metrics_targets(&self) -> Vec<String> {
        self.workers.values().filter_map(|w| w.metrics_address.clone()).collect()
    }

    pub(crate) fn count_worker(&mut self, pipeline: Option<&str>, f: impl FnOnce(&mut WorkerCounts)) {
        if let Some(pipeline) = pipeline {
            match self.worker_counts.get_mut(pipeline) {
                Some(counts) => f(counts),
                None => f(self.worker_counts.entry(pipeline.to_string()).or_default()),
            }
        }
    }

    pub(crate) fn count_splits(&mut self, pipeline: &str, f: impl FnOnce(&mut SplitCounts)) {
        match self.split_counts.get_mut(pipeline) {
            Some(counts) => f(counts),
            None => f(self.split_counts.entry(pipeline.to_string()).or_default()),
        }
    }

    /// Liveness timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Takes the events to journal.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Whether work may have become leasable since the last call.
    pub fn take_leasable(&mut self) -> bool {
        std::mem::take(&mut self.leasable)
    }

    pub(crate) fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:x}", self.next_id)
    }

    /// Registers or replaces a pipeline. The same facts again change nothing; other facts start a
    /// new generation with no jobs.
    pub fn register_pipeline(&mut self, name: &str, facts: PipelineFacts) -> Result<u64, DispatchError> {
        check_name("name", name)?;
        if facts.counts.is_empty() {
            return Err(DispatchError::InvalidArgument(format!(
                "pipeline `{name}`: the source has no splits; check spec.source.url"
            )));
        }
        if let Some(p) = self.pipelines.get(name)
            && p.facts == facts
        {
            return Ok(p.generation);
        }
        let generation = self.pipelines.get(name).map_or(1, |p| p.generation + 1);
        self.events.push(Event::Pipeline { name: name.to_string(), generation, facts: facts.clone() });
        self.pipelines.insert(name.to_string(), Pipeline::new(facts, generation));
        Ok(generation)
    }

    /// Removes a pipeline, its jobs and their progress; its leases end and its workers stay
    /// registered (they ask again and hear it is gone). Removing an unknown name does nothing.
    pub fn unregister_pipeline(&mut self, name: &str) {
        if self.pipelines.contains_key(name) {
            self.events.push(Event::PipelineRemoved { name: name.to_string() });
            self.drop_pipeline(name);
        }
    }

    pub(crate) fn drop_pipeline(&mut self, name: &str) {
        self.pipelines.remove(name);
        self.split_counts.remove(name);
        self.worker_counts.remove(name);
        let ended: Vec<u64> =
            self.leases.iter().filter(|(_, l)| l.pipeline == name).map(|(id, _)| *id).collect();
        for id in ended {
            if let Some(lease) = self.leases.remove(&id)
                && let Some(worker) = self.workers.get_mut(&lease.worker)
            {
                worker.leases.remove(&id);
            }
        }
    }

    /// A registered pipeline's description.
    pub fn pipeline_info(&self, name: &str) -> Result<pb::PipelineInfo, DispatchError> {
        let p = self.pipeline(name)?;
        Ok(pb::PipelineInfo {
            name: name.to_string(),
            manifest_json: p.facts.manifest_json.clone(),
            base_dir: p.facts.base_dir.clone(),
            generation: p.generation,
            splits: p.facts.counts.len() as u64,
            elements: p.facts.counts.iter().sum(),
            epochs: p.facts.epochs,
            batch_size: p.facts.batch as u32,
            cache_profile_wanted: p.cache.wants_profile(),
        })
    }

    pub(crate) fn pipeline(&self, name: &str) -> Result<&Pipeline, DispatchError> {
        self.pipelines.get(name).ok_or_else(|| self.unknown_pipeline(name))
    }

    pub(crate) fn unknown_pipeline(&self, name: &str) -> DispatchError {
        if self.private {
            return DispatchError::NotFound(format!("no pipeline named `{name}`"));
        }
        let known: Vec<&str> = self.pipelines.keys().map(String::as_str).collect();
        DispatchError::NotFound(if known.is_empty() {
            format!("no pipeline named `{name}`: none is registered yet")
        } else {
            format!("no pipeline named `{name}`; registered: {}", known.join(", "))
        })
    }

    /// Names of the registered pipelines.
    pub fn pipeline_names(&self) -> Vec<String> {
        self.pipelines.keys().cloned().collect()
    }

    /// Why a pipeline failed, if it did.
    pub fn failure(&self, pipeline: &str) -> Option<String> {
        self.pipelines.get(pipeline).and_then(|p| p.failed.clone())
    }

    /// Jobs of a pipeline and how far they are.
    /// Whether every job of `pipeline` delivered every epoch to every consumer it declared;
    /// with no job left (collected after they finished), whether the last one collected had.
    pub fn completed(&self, pipeline: &str) -> bool {
        let Some(p) = self.pipelines.get(pipeline) else { return false };
        if p.jobs.is_empty() {
            return p.last_collected_complete;
        }
        p.jobs.values().all(|j| j.complete(p.facts.epochs))
    }

    pub fn progress(&self, pipeline: &str) -> Vec<JobProgress> {
        let Some(p) = self.pipelines.get(pipeline) else { return Vec::new() };
        p.jobs
            .iter()
            .map(|(name, job)| JobProgress {
                job: name.clone(),
                consumers: job.consumers.len() as u32,
                declared: job.settings.consumers,
                finished: job.consumers.values().filter(|c| c.finished).count() as u32,
                epoch: job.slowest_epoch(p.facts.epochs),
                mode: job.mode,
                batches_per_epoch: {
                    let elements: u64 = job.settings.counts.iter().sum();
                    let batches = elements.div_ceil(job.settings.batch.max(1));
                    let sharing = if job.mode == Mode::Replicated {
                        1
                    } else {
                        u64::from(job.settings.consumers.max(1))
                    };
                    batches.div_ceil(sharing)
                },
                normalize_on_worker: job.normalize_on_worker(),
                image_share: job.images.share,
            })
            .collect()
    }

    /// Latest metrics of a pipeline's workers and consumers.
    pub fn snapshot(&self, pipeline: &str) -> MetricsSnapshot {
        let mut snap = MetricsSnapshot::default();
        for (id, w) in &self.workers {
            if w.pipeline.as_deref().is_none_or(|p| p == pipeline)
                && let Some(m) = &w.metrics
            {
                snap.workers.push((id.clone(), m.clone()));
            }
        }
        if let Some(p) = self.pipelines.get(pipeline) {
            for (job, j) in &p.jobs {
                for (index, c) in &j.consumers {
                    if let Some(m) = &c.metrics {
                        snap.consumers.push((job.clone(), *index, m.clone()));
                        snap.hosts.push((job.clone(), *index, c.host));
                    }
                }
            }
        }
        snap
    }

    /// Workers that serve `pipeline` and where clients reach them.
    pub fn workers_of(&self, pipeline: &str) -> Vec<pb::WorkerInfo> {
        self.workers
            .iter()
            .filter(|(_, w)| w.pipeline.as_deref().is_none_or(|p| p == pipeline))
            .map(|(id, w)| pb::WorkerInfo { worker_id: id.clone(), address: w.address.clone() })
            .collect()
    }

    /// Forgets silent workers (their leases go back to the front of the queue), expires leases
    /// past their deadline, and marks silent consumers gone.
    pub fn expire(&mut self, now: u64) {
        self.stamp_profile_waits(now);
        let lease_ms = self.timing.lease_ms;
        let dead: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.last_seen) > lease_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in dead {
            tracing::warn!(worker = %id, "worker missed its heartbeats; its splits go to other workers");
            if let Some(worker) = self.workers.remove(&id) {
                self.count_worker(worker.pipeline.as_deref(), |c| c.lost += 1);
            }
        }
        let expired: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline < now || !self.workers.contains_key(&l.worker))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.requeue(id);
        }
        let timeout = self.timing.client_timeout_ms;
        for p in self.pipelines.values_mut() {
            for job in p.jobs.values_mut() {
                for c in job.consumers.values_mut() {
                    if !c.gone && !c.finished && now.saturating_sub(c.last_seen) > timeout {
                        c.gone = true;
                    }
                }
            }
        }
        self.collect_jobs(now);
    }
}

pub(crate) fn check_name(field: &str, value: &str) -> Result<(), DispatchError> {
    if value.is_empty() {
        return Err(DispatchError::InvalidArgument(format!("`{field}` is empty; name the pipeline")));
    }
    if value.len() > 253 {
        return Err(DispatchError::InvalidArgument(format!(
            "`{field}` is {} characters long; names have at most 253",
            value.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounded;
#[cfg(test)]
mod tests_counted;
#[cfg(test)]
mod tests_demand;
#[cfg(test)]
mod tests_errors;
