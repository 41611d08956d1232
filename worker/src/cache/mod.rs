//! The worker's side of the autocache: the entries a pipeline may write or read (one per legal
//! cut of its deterministic prefix), the record format of an element, reading a split's entry
//! with fallback to the source, write-through while computing, and the profile the autocacher
//! decides from. Entries live in object storage in `granary_store::cache`'s format.

pub mod entries;
pub mod profile;
pub mod read;
pub mod record;
pub mod write;

use granary_store::cache::{CacheStore, Fingerprint};

/// One legal cut: the entry holding the elements as they are after `spec.stages[index - 1]`.
#[derive(Clone, Debug)]
pub struct Cut {
    /// Stages of `spec.stages` before the cut (0: the source's elements).
    pub index: usize,
    /// Name of the stage whose output the entry holds (`source` for 0).
    pub stage: String,
    /// The entry's fingerprint.
    pub fingerprint: Fingerprint,
}

/// The cache store of a pipeline and the entries its tasks may use.
pub struct EngineCache {
    /// The store (`spec.cache.store`).
    pub store: CacheStore,
    /// The legal cuts, in order.
    pub cuts: Vec<Cut>,
    /// Pipeline name, recorded in the entries it creates.
    pub pipeline: String,
    /// Source URL, recorded in entries.
    pub source_url: String,
    /// Names of `spec.stages`, recorded in entries.
    pub stage_names: Vec<String>,
    /// Splits in the source listing.
    pub splits: u64,
    /// Names this writer's chunk folders.
    pub writer_id: String,
    /// Raw record bytes per chunk.
    pub chunk_bytes: usize,
}

impl EngineCache {
    /// The cut at `index`, if it is legal.
    pub fn cut(&self, index: usize) -> Option<&Cut> {
        self.cuts.iter().find(|c| c.index == index)
    }
}

/// What reading a split's entry did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadReport {
    /// Entry bytes read, as stored.
    pub bytes_read: u64,
    /// The entry failed verification; it must not be offered again.
    pub bad: bool,
    /// What went wrong, if anything.
    pub problem: Option<String>,
    /// Elements computed from the source after a failed read.
    pub recomputed: u64,
}

/// What the cache did for one split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheOutcome {
    /// Entry bytes read, as stored.
    pub bytes_read: u64,
    /// Entry bytes written and published.
    pub bytes_written: u64,
    /// The split's manifest was published.
    pub written: bool,
    /// A read found the entry bad.
    pub bad: bool,
    /// What went wrong (bad entry, failed write), if anything.
    pub problem: Option<String>,
    /// Elements computed from the source after a failed read.
    pub recomputed: u64,
}

impl CacheOutcome {
    /// The outcome of a read.
    pub fn from_read(read: ReadReport) -> CacheOutcome {
        CacheOutcome {
            bytes_read: read.bytes_read,
            bad: read.bad,
            problem: read.problem,
            recomputed: read.recomputed,
            ..CacheOutcome::default()
        }
    }
}
