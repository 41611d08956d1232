//! The dispatcher as a process component: the state behind a lock, the journal and the catalog,
//! and what its host reads of them. Its gRPC face is in `api`, its cache I/O in `cache_io`.

use crate::catalog::Catalog;
use crate::journal::{Journal, JournalError};
use crate::state::{
    CacheReport, DispatchError, Event, JobProgress, MetricsSnapshot, MixFacts, PipelineFacts, State, Timing,
};
use granary_crds::Manifest;
use granary_proto::v1 as pb;
use granary_store::cache::{CacheStore, Fingerprint};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
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
}

pub(crate) struct Inner {
    state: Mutex<State>,
    journal: Option<tokio::sync::Mutex<Journal>>,
    catalog: Arc<dyn Catalog>,
    start: Instant,
    /// `DispatcherConfig::cache_max_bytes`.
    pub(crate) cache_max_bytes: Option<u64>,
    /// Journal appends that succeeded and that failed.
    journal_writes: [std::sync::atomic::AtomicU64; 2],
    /// Held by the eviction pass: one at a time.
    pub(crate) evicting: tokio::sync::Mutex<()>,
    /// Access control, when authentication is on.
    pub(crate) access: Option<crate::access::Access>,
    /// `DispatcherConfig::tls`.
    pub(crate) tls: Option<granary_security::TlsMaterial>,
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
        let id_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64 & 0xffff_ffff_ffff);
        let mut state = State::new(config.timing, id_base);
        state.set_private(config.auth_key.is_some());
        let journal = match &config.journal {
            Some(url) => {
                let (journal, events) = Journal::open(url).await?;
                for event in &events {
                    state.apply(event);
                }
                if !events.is_empty() {
                    tracing::info!(events = events.len(), "dispatcher state recovered from the journal");
                }
                Some(tokio::sync::Mutex::new(journal))
            }
            None => None,
        };
        Ok(Dispatcher {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                journal,
                catalog,
                start: Instant::now(),
                cache_max_bytes: config.cache_max_bytes,
                journal_writes: Default::default(),
                evicting: tokio::sync::Mutex::new(()),
                access: config.auth_key.as_ref().map(crate::access::Access::new),
                tls: config.tls.clone(),
            }),
        })
    }

    /// Milliseconds since this dispatcher started: the state's clock.
    pub(crate) fn now(&self) -> u64 {
        self.inner.start.elapsed().as_millis() as u64
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a state that is still consistent per request.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the state and journals the events it produced before returning; touches the
    /// cache entries pipelines started reading.
    pub(crate) async fn mutate<T>(
        &self,
        f: impl FnOnce(&mut State, u64) -> Result<T, DispatchError>,
    ) -> Result<T, Status> {
        let now = self.now();
        let (result, events, touches) = {
            let mut state = self.state();
            let result = f(&mut state, now);
            (result, state.take_events(), state.take_cache_touches())
        };
        touch_entries(touches);
        self.persist(events).await;
        result.map_err(status)
    }

    async fn persist(&self, events: Vec<Event>) {
        let Some(journal) = &self.inner.journal else { return };
        if events.is_empty() {
            return;
        }
        let mut journal = journal.lock().await;
        let appended = journal.append(&events).await;
        let outcome = usize::from(appended.is_err());
        self.inner.journal_writes[outcome].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = appended {
            tracing::error!("cannot journal dispatcher state: {e}");
            return;
        }
        if journal.wants_compaction() {
            let all = self.state().snapshot_events();
            if let Err(e) = journal.compact(all).await {
                tracing::error!("cannot compact the journal: {e}");
            }
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
            counts_known: granary_crds::validate::counts_known(&spec.stages),
            batch: u64::from(spec.batch.size.max(1)),
            epochs: spec.epochs,
            drop_remainder: spec.batch.drop_remainder,
            shuffle: spec.shuffle.as_ref().is_some_and(|s| s.buffer > 0),
            seed: spec.seed,
        };
        self.mutate(|s, _| s.register_pipeline(name, facts))
            .await
            .map_err(|st| DispatchError::InvalidArgument(st.message().to_string()))?;
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

    /// Journal appends so far: `(succeeded, failed)`; `None` without a journal.
    pub fn journal_writes(&self) -> Option<(u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let [ok, failed] = &self.inner.journal_writes;
        self.inner.journal.as_ref().map(|_| (ok.load(Relaxed), failed.load(Relaxed)))
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

    /// Why a pipeline failed, if it did.
    pub fn failure(&self, pipeline: &str) -> Option<String> {
        self.state().failure(pipeline)
    }

    /// Latest worker and consumer metrics of a pipeline.
    pub fn snapshot(&self, pipeline: &str) -> MetricsSnapshot {
        self.state().snapshot(pipeline)
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
