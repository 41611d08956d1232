//! The dispatcher as a process component: the state behind a lock, the journal and the catalog,
//! and what its host reads of them. Its gRPC face is in `api`, its cache I/O in `cache_io`.

use crate::catalog::Catalog;
use crate::journal::{Batch, Committer, Journal, JournalError, Urgency};
use crate::state::{
    CacheReport, DispatchError, Event, JobProgress, MetricsSnapshot, MixFacts, PipelineFacts, State, Timing,
};
use granary_crds::Manifest;
use granary_proto::v1 as pb;
use granary_store::cache::{CacheStore, Fingerprint};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tonic::Status;

/// Dispatcher settings.
#[derive(Clone, Debug, Default)]
pub struct DispatcherConfig {
    /// Journal URL or local path; none keeps state in memory only.
    pub journal: Option<String>,
    /// Liveness timing.
    pub timing: Timing,
    /// Most bytes the entries of one cache store may take together (every pipeline's); the
    /// least recently used entries not in use are evicted past it. `None`: no store-wide budget.
    pub cache_max_bytes: Option<u64>,
    /// The deployment's master key: with one, every request is authenticated and authorized
    /// (see [`crate::access`]); without, every caller is the owner (loopback use).
    pub auth_key: Option<granary_security::MasterKey>,
    /// TLS for the gRPC API: the dispatcher's certificate and the CA its clients' certificates
    /// must chain to. `None`: plaintext (loopback use).
    pub tls: Option<granary_security::TlsMaterial>,
    /// How long a failing journal store is retried before the dispatcher stops serving;
    /// `None`: 20 s.
    pub journal_retry: Option<Duration>,
}

/// A failure starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    /// The journal could not be opened or read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The gRPC server failed.
    #[error("dispatcher server: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// TLS is configured without a certificate of the dispatcher's own.
    #[error("the dispatcher's TLS settings have no certificate and key of its own (tls.crt, tls.key)")]
    NoCertificate,
    /// A pipeline could not be registered.
    #[error(transparent)]
    Refused(#[from] DispatchError),
    /// The dispatcher stopped serving: another took its journal over, the journal could not be
    /// written, or its host lost leadership. Restarting replays the journal.
    #[error("the dispatcher stopped serving: {0}")]
    Halted(String),
}

pub(crate) struct Inner {
    state: Mutex<State>,
    journal: Option<Committer>,
    /// Why the dispatcher stopped serving, once it did.
    halted: Arc<watch::Sender<Option<String>>>,
    catalog: Arc<dyn Catalog>,
    start: Instant,
    /// `DispatcherConfig::cache_max_bytes`.
    pub(crate) cache_max_bytes: Option<u64>,
    /// Held by the eviction pass: one at a time.
    pub(crate) evicting: tokio::sync::Mutex<()>,
    /// Access control, when authentication is on.
    pub(crate) access: Option<crate::access::Access>,
    /// `DispatcherConfig::tls`.
    pub(crate) tls: Option<granary_security::TlsMaterial>,
    /// Trainer registrations, signalled to the autoscalers.
    pub(crate) arrivals: crate::arrivals::Arrivals,
    /// Signalled when work may have become leasable (see [`State::take_leasable`]): wakes the
    /// `LeaseSplit` calls waiting for work.
    pub(crate) leasable: tokio::sync::Notify,
}

/// The dispatcher: cheap to clone, shared by the gRPC service and its host.
#[derive(Clone)]
pub struct Dispatcher {
    pub(crate) inner: Arc<Inner>,
}

impl Dispatcher {
    /// Opens the journal (replaying what it holds) and builds the dispatcher.
    pub async fn new(
        config: DispatcherConfig,
        catalog: Arc<dyn Catalog>,
    ) -> Result<Dispatcher, DispatcherError> {
        let state = State::new(config.timing, id_base());
        let journal = match &config.journal {
            Some(url) => Some(Journal::open(url).await?),
            None => None,
        };
        Ok(Dispatcher::build(config, catalog, state, journal))
    }

    /// Builds the dispatcher on a journal opened by the caller (on a store of its choosing),
    /// replaying `events`, what opening it returned; `config.journal` is not read.
    pub fn on_journal(
        config: DispatcherConfig,
        catalog: Arc<dyn Catalog>,
        journal: Journal,
        events: Vec<Event>,
    ) -> Dispatcher {
        let state = State::new(config.timing, id_base());
        Dispatcher::build(config, catalog, state, Some((journal, events)))
    }

    fn build(
        config: DispatcherConfig,
        catalog: Arc<dyn Catalog>,
        mut state: State,
        journal: Option<(Journal, Vec<Event>)>,
    ) -> Dispatcher {
        state.set_private(config.auth_key.is_some());
        let halted = Arc::new(watch::channel(None).0);
        let retry_for = config.journal_retry.unwrap_or(crate::journal::RETRY_FOR);
        let journal = journal.map(|(journal, events)| {
            for event in &events {
                state.apply(event);
            }
            // Replaying produces no events, but leave none behind for the first request.
            drop(state.take_events());
            if !events.is_empty() {
                tracing::info!(events = events.len(), "dispatcher state recovered from the journal");
            }
            Committer::new(journal, Arc::clone(&halted), retry_for)
        });
        Dispatcher {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                journal,
                halted,
                catalog,
                start: Instant::now(),
                cache_max_bytes: config.cache_max_bytes,
                evicting: tokio::sync::Mutex::new(()),
                access: config.auth_key.as_ref().map(crate::access::Access::new),
                tls: config.tls.clone(),
                arrivals: crate::arrivals::Arrivals::default(),
                leasable: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Milliseconds since this dispatcher started: the state's clock.
    pub(crate) fn now(&self) -> u64 {
        self.inner.start.elapsed().as_millis() as u64
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a state that is still consistent per request.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the state and returns once the events it produced are durable in the
    /// journal; touches the cache entries pipelines started reading. The events queue for the
    /// journal while the state is still locked, so the journal's order is the state's. Once the
    /// dispatcher stopped serving, every call fails `UNAVAILABLE`.
    pub(crate) async fn mutate<T>(
        &self,
        f: impl FnOnce(&mut State, u64) -> Result<T, DispatchError>,
    ) -> Result<T, Status> {
        self.mutate_with(Urgency::Prompt, f).await
    }

    /// [`Dispatcher::mutate`] for a change its requester does not wait on (a split's
    /// completion): its record may wait a little for others to join it (see [`Urgency`]).
    pub(crate) async fn mutate_batched<T>(
        &self,
        f: impl FnOnce(&mut State, u64) -> Result<T, DispatchError>,
    ) -> Result<T, Status> {
        self.mutate_with(Urgency::Batched, f).await
    }

    async fn mutate_with<T>(
        &self,
        urgency: Urgency,
        f: impl FnOnce(&mut State, u64) -> Result<T, DispatchError>,
    ) -> Result<T, Status> {
        self.serving()?;
        let now = self.now();
        let (result, ticket, touches, leasable) = {
            let mut state = self.state();
            let result = f(&mut state, now);
            let events = state.take_events();
            let ticket = match &self.inner.journal {
                Some(journal) if !events.is_empty() => Some(journal.enqueue(events)),
                _ => None,
            };
            (result, ticket, state.take_cache_touches(), state.take_leasable())
        };
        if leasable {
            self.inner.leasable.notify_waiters();
        }
        touch_entries(touches);
        if let Some(ticket) = ticket {
            self.durable(ticket, urgency).await?;
        }
        result.map_err(status)
    }

    /// `UNAVAILABLE` once the dispatcher stopped serving.
    fn serving(&self) -> Result<(), Status> {
        match &*self.inner.halted.borrow() {
            Some(why) => Err(Status::unavailable(format!("the dispatcher stopped serving: {why}"))),
            None => Ok(()),
        }
    }

    /// Waits until `ticket`'s events are durable. The write runs in a task of its own, so that
    /// a request given up on does not cut a write short.
    async fn durable(&self, ticket: u64, urgency: Urgency) -> Result<(), Status> {
        let inner = Arc::clone(&self.inner);
        let written = tokio::spawn(async move {
            let Some(journal) = &inner.journal else { return Ok(()) };
            let take = |compact: bool| -> Batch {
                let mut state = inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let stray = state.take_events();
                let snapshot = compact.then(|| state.snapshot_events());
                journal.take(stray, snapshot)
            };
            journal.commit(ticket, urgency, take).await
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(Status::unavailable(format!("the dispatcher stopped serving: {why}"))),
            Err(e) => Err(Status::internal(format!("the journal writer failed: {e}"))),
        }
    }

    /// Stops serving for good: every request from now on fails `UNAVAILABLE`, and the server
    /// ends (see [`Dispatcher::halted`]). For a host that lost the right to serve (its
    /// leadership); the first reason given is kept.
    pub fn halt(&self, why: &str) {
        self.inner.halted.send_if_modified(|halted| {
            let first = halted.is_none();
            if first {
                tracing::error!("the dispatcher stops serving: {why}");
                *halted = Some(why.to_string());
            }
            first
        });
    }

    /// Why the dispatcher stopped serving, once it did.
    pub fn halt_reason(&self) -> Option<String> {
        self.inner.halted.borrow().clone()
    }

    /// Completes, with the reason, once the dispatcher stopped serving: another dispatcher
    /// took its journal over, the journal could not be written, or [`Dispatcher::halt`].
    pub async fn halted(&self) -> String {
        let mut halted = self.inner.halted.subscribe();
        let why = halted.wait_for(Option::is_some).await.ok().map(|why| why.clone().unwrap_or_default());
        match why {
            Some(why) => why,
            // The sender lives as long as the dispatcher.
            None => std::future::pending().await,
        }
    }

    /// Registers `manifest` under `name` (counting its splits' elements through the catalog).
    pub async fn register(
        &self,
        name: &str,
        manifest: &Manifest,
    ) -> Result<pb::PipelineInfo, DispatcherError> {
        let catalog = Arc::clone(&self.inner.catalog);
        let m = manifest.clone();
        let listing = tokio::task::spawn_blocking(move || catalog.describe(&m))
            .await
            .map_err(|e| DispatchError::FailedPrecondition(format!("listing the source failed: {e}")))?
            .map_err(|e| DispatchError::InvalidArgument(format!("pipeline `{name}`: {e}")))?;
        let spec = &manifest.pipeline.spec;
        let manifest_json = serde_json::to_string(&manifest.pipeline)
            .map_err(|e| DispatchError::InvalidArgument(format!("pipeline `{name}`: {e}")))?;
        let facts = PipelineFacts {
            manifest_json,
            base_dir: manifest.base_dir.display().to_string(),
            mixing: MixFacts::of(spec, &listing.inputs),
            counts: listing.counts,
            counts_known: granary_crds::validate::spec_counts_known(spec),
            batch: u64::from(spec.batch.size.max(1)),
            epochs: spec.epochs,
            drop_remainder: spec.batch.drop_remainder,
            shuffle: spec.shuffle.as_ref().is_some_and(|s| s.buffer > 0),
            seed: spec.seed,
        };
        self.mutate(|s, _| s.register_pipeline(name, facts)).await.map_err(|st| {
            if st.code() == tonic::Code::Unavailable {
                DispatcherError::Halted(st.message().to_string())
            } else {
                DispatchError::InvalidArgument(st.message().to_string()).into()
            }
        })?;
        Ok(self.state().pipeline_info(name)?)
    }

    /// Removes a pipeline and its progress (journaled); unknown names are ignored.
    pub async fn unregister(&self, name: &str) {
        let _ = self
            .mutate(|s, _| {
                s.unregister_pipeline(name);
                Ok(())
            })
            .await;
    }

    /// Journal record writes so far: `(succeeded, failed attempts)`; `None` without a
    /// journal.
    pub fn journal_writes(&self) -> Option<(u64, u64)> {
        self.inner.journal.as_ref().map(Committer::writes)
    }

    /// Lease outcomes of `pipeline` since this dispatcher started.
    pub fn split_counts(&self, pipeline: &str) -> crate::state::SplitCounts {
        self.state().split_counts(pipeline)
    }

    /// Worker registrations and losses of `pipeline` since this dispatcher started.
    pub fn worker_counts(&self, pipeline: &str) -> crate::state::WorkerCounts {
        self.state().worker_counts(pipeline)
    }

    /// What the trainers of each job of `pipeline` reported: `(job, totals)`.
    pub fn trainer_totals(&self, pipeline: &str) -> Vec<(String, crate::state::TrainerTotals)> {
        self.state().trainer_totals(pipeline)
    }

    /// The metrics endpoints (`host:port`) of the registered workers, for service discovery.
    pub fn metrics_targets(&self) -> Vec<String> {
        self.state().metrics_targets()
    }

    /// Names of the registered pipelines.
    pub fn pipelines(&self) -> Vec<String> {
        self.state().pipeline_names()
    }

    /// Jobs of a pipeline and how far they are.
    pub fn progress(&self, pipeline: &str) -> Vec<JobProgress> {
        self.state().progress(pipeline)
    }

    /// Whether every job of `pipeline` delivered every epoch (and, with every job collected
    /// since, whether the last one had): the operator's `Completed` phase.
    pub fn completed(&self, pipeline: &str) -> bool {
        self.state().completed(pipeline)
    }

    /// Why a pipeline failed, if it did.
    pub fn failure(&self, pipeline: &str) -> Option<String> {
        self.state().failure(pipeline)
    }

    /// Elements `pipeline` skipped (`spec.errors.policy: skip`), over every job and epoch.
    pub fn skipped(&self, pipeline: &str) -> u64 {
        self.state().skipped(pipeline)
    }

    /// Latest worker and consumer metrics of a pipeline.
    pub fn snapshot(&self, pipeline: &str) -> MetricsSnapshot {
        self.state().snapshot(pipeline)
    }

    /// The consumers reading `pipeline` now, as `(job, index)`: registered, neither gone nor
    /// finished, whether or not they reported metrics yet.
    pub fn attached(&self, pipeline: &str) -> Vec<(String, u32)> {
        self.state().attached(pipeline)
    }

    /// Signalled each time a trainer registers for `pipeline` (one permit is kept while nobody
    /// waits), so its autoscaler can start workers at once when the pool is at zero.
    pub fn trainer_arrivals(&self, pipeline: &str) -> Arc<tokio::sync::Notify> {
        self.inner.arrivals.of(pipeline)
    }

    /// Workers registered for a pipeline.
    pub fn workers(&self, pipeline: &str) -> Vec<pb::WorkerInfo> {
        self.state().workers_of(pipeline)
    }

    /// How many splits and epochs a registered pipeline has.
    pub fn shape(&self, pipeline: &str) -> Option<(u64, u32)> {
        self.state().pipeline_info(pipeline).ok().map(|info| (info.splits, info.epochs))
    }

    /// What the autocacher decided for a pipeline and what the cache did in each epoch.
    pub fn cache_report(&self, pipeline: &str) -> Option<CacheReport> {
        self.state().cache_report(pipeline)
    }
}

/// The base of the ids this dispatcher hands out: the clock, so a restarted one reuses none.
fn id_base() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_millis() as u64 & 0xffff_ffff_ffff)
}

/// Seconds since the Unix epoch: the clock of cache entries' last use.
pub(crate) fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Rewrites the last-used time of entries pipelines started reading, in the background.
fn touch_entries(touches: Vec<(String, String)>) {
    if touches.is_empty() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        for (url, fp) in touches {
            let touched = match (CacheStore::open(&url), Fingerprint::parse(&fp)) {
                (Ok(store), Ok(fp)) => store.touch(&fp, now_unix_s()).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            if let Err(e) = touched {
                tracing::warn!(store = %url, fingerprint = %fp, "cannot touch the cache entry: {e}");
            }
        }
    });
}

/// A state error as the gRPC status a caller receives.
pub(crate) fn status(e: DispatchError) -> Status {
    match e {
        DispatchError::NotFound(m) => Status::not_found(m),
        DispatchError::InvalidArgument(m) => Status::invalid_argument(m),
        DispatchError::FailedPrecondition(m) => Status::failed_precondition(m),
        DispatchError::ResourceExhausted(m) => Status::resource_exhausted(m),
        DispatchError::PermissionDenied(m) => Status::permission_denied(m),
    }
}
