//! Granary's dispatcher: pipelines and their epochs, dynamic split leases for workers, consumer
//! registration and epoch plans for clients, liveness, metric snapshots for the policies, a
//! journal so a restarted dispatcher resumes where it was, and the `WorkerPool` it scales.

pub mod access;
pub mod api;
mod arrivals;
pub mod autoscaler;
pub mod cache_cleanup;
pub mod cache_io;
pub mod catalog;
pub mod exposition;
pub mod host;
pub mod journal;
pub mod plan;
pub mod pool;
pub mod service;
pub mod state;

pub use cache_io::Evicted;
pub use catalog::{Catalog, Listing};
pub use plan::Mode;
pub use pool::{ProcessPool, WorkerPool};
pub use service::{Dispatcher, DispatcherConfig, DispatcherError};
pub use state::{
    BucketTotals, CACHE_STATES, CacheReport, EpochCache, EpochCheck, JobProgress, MetricsSnapshot,
    SourceEntry, SplitCounts, Timing, TrainerTotals, WorkerCounts,
};
