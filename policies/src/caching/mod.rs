//! Autocaching: whether to materialize a stage output of the deterministic prefix in object
//! storage, where, and when to read it back, as a pure function of measured costs.
//!
//! The dispatcher fills [`CacheInputs`] from a worker's measured profile and the entries already
//! in the store, calls [`decide`] (policy `auto`) or [`forced`] (policy `at`), and leases splits
//! accordingly; [`cachew::decide`] is Cachew's autocacher as a baseline. Every decision carries
//! its reason in words and every candidate it weighed, each with why it is out, if it is.
//!
//! The model, per element with all cores: computing takes `compute / cores`; an epoch that
//! writes cut `k` takes `compute / cores + encode / readers + bytes / write throughput`; one that
//! reads it `bytes / read throughput + decode / readers + suffix / cores`, where `readers` is the
//! number of workers: each streams its entries (and compresses what it writes) on one thread. Totals cover the remaining epochs;
//! dollars add time at the hourly price and storage of newly written bytes over the retention.
//! A cache option must beat computing by [`MARGIN`] of the total to be chosen.
//!
//! [`feedback`] closes the loop: at each epoch boundary the caller compares the measured time with
//! the predicted one and, beyond [`feedback::TOLERANCE`], corrects the profile's figures and
//! decides again.

mod at;
mod auto;
pub mod cachew;
pub mod feedback;
mod fmt;
mod model;
mod rules;

pub use at::forced;
pub use auto::decide;
pub use rules::MARGIN;

use serde::{Deserialize, Serialize};

/// Measured costs of caching at one cut of the deterministic prefix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Boundary {
    /// Stages before the cut: the entry holds the output of stage `index - 1` (0: the source's
    /// elements as read).
    pub index: usize,
    /// Name of the stage whose output is cached (`source` for 0).
    pub stage: String,
    /// CPU seconds per element (one core) of the stages before the cut, source read included.
    pub prefix_s_per_element: f64,
    /// CPU seconds per element (one core) of the stages after the cut.
    pub suffix_s_per_element: f64,
    /// Stored (compressed) entry bytes per element.
    pub bytes_per_element: f64,
    /// CPU seconds per element to encode (serialize and compress) for writing.
    pub encode_s_per_element: f64,
    /// CPU seconds per element to decode (decompress and deserialize) when reading.
    pub decode_s_per_element: f64,
    /// Share (0..=1) of the epoch's elements whose entry splits are already complete in the
    /// store (written by this pipeline earlier or by another with the same fingerprint).
    pub existing_fraction: f64,
}

/// Measured throughput of the cache store, bytes per second, over all concurrent transfers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoreRates {
    /// Reading entries.
    pub read_bytes_per_s: f64,
    /// Writing entries.
    pub write_bytes_per_s: f64,
}

/// Prices that turn time and storage into one cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheCosts {
    /// Dollars per hour that the pipeline's running time costs (workers, plus accelerators that
    /// wait on them). 0 when unknown: storage is then free too and time alone decides.
    pub time_per_hour: f64,
    /// Dollars per GB (10^9 bytes) per month of stored entry.
    pub storage_per_gb_month: f64,
    /// How long an entry is expected to be kept (the TTL, or the run's length), hours.
    pub retention_hours: f64,
}

/// Everything the policy needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheInputs {
    /// Every legal cut, in order of `index`.
    pub boundaries: Vec<Boundary>,
    /// CPU seconds per element (one core) of the whole pipeline as it runs without a cache.
    pub compute_s_per_element: f64,
    /// Compute cores working on the pipeline (all workers).
    pub cores: f64,
    /// Entry streams working in parallel: each worker reads (decompresses, decodes) and writes
    /// (compresses) its entries on one thread, so that work scales with workers, not cores.
    pub readers: f64,
    /// Elements in one epoch.
    pub elements_per_epoch: u64,
    /// Epochs still to run, the one being decided included.
    pub remaining_epochs: u32,
    /// The cache store's measured throughput.
    pub store: StoreRates,
    /// Prices.
    pub costs: CacheCosts,
    /// Most bytes one entry may take (`spec.cache.maxBytes`), if limited.
    pub max_bytes: Option<u64>,
}

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Run every stage from the source in every remaining epoch.
    Compute,
    /// Write the output at cut `boundary` while computing this epoch (write-through), and read
    /// it in the epochs after.
    Write {
        /// The cut.
        boundary: usize,
    },
    /// Read the complete existing entry at cut `boundary` from now on.
    Read {
        /// The cut.
        boundary: usize,
    },
}

/// Predicted elements per second of the pipeline (all cores) in each kind of epoch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// Computing every stage: `cores / compute_s_per_element`.
    pub compute_items_per_s: f64,
    /// The epoch that writes (compute plus encoding plus store writes), if the action writes.
    pub write_items_per_s: Option<f64>,
    /// Epochs that read: `1 / (read seconds per element + seconds per element of the stages
    /// after the cut)`, where read seconds per element = bytes / read throughput + decode CPU /
    /// readers, and stage seconds = suffix CPU / cores. Present when the action writes or reads.
    pub read_items_per_s: Option<f64>,
}

/// One candidate as the policy weighed it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The action.
    pub action: Action,
    /// Predicted seconds for the remaining epochs (0 when it could not be estimated: see
    /// `excluded`).
    pub seconds: f64,
    /// Entry bytes it stores (newly written; 0 when reading an existing entry).
    pub bytes: f64,
    /// Dollars: time at `time_per_hour` plus storage (0 when `time_per_hour` is 0).
    pub dollars: f64,
    /// Why it is out, if it is (over budget, no gain).
    pub excluded: Option<String>,
}

/// The policy's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheDecision {
    /// What to do.
    pub action: Action,
    /// Predicted rates for the chosen action.
    pub predicted: Predicted,
    /// The reason in words, with the figures that decided it.
    pub reason: String,
    /// Every candidate considered.
    pub candidates: Vec<Candidate>,
}
