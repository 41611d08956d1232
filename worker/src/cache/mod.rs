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

/// One legal cut: the entries holding the elements as they are after `spec.stages[index - 1]`,
/// one per source.
#[derive(Clone, Debug)]
pub struct Cut {
    /// Stages of `spec.stages` before the cut (0: the source's elements).
    pub index: usize,
    /// Name of the stage whose output the entry holds (`source` for 0).
    pub stage: String,
    /// The entry of each source, in the order of `spec.sources` (one for a single `spec.source`).
    /// Each is the entry a single-source pipeline reading that source with the same stages uses.
    pub fingerprints: Vec<Fingerprint>,
}

impl Cut {
    /// The entry of the first (for a single source, the only) source.
    pub fn fingerprint(&self) -> &Fingerprint {
        // `entries::build` makes a cut only with an entry for every source, and there is one.
        &self.fingerprints[0]
    }
}

/// One source of a pipeline that caches: what its entries record, and its splits.
#[derive(Clone, Debug)]
pub struct CachedInput {
    /// The source URL, recorded in the entries it creates.
    pub url: String,
    /// Its split ids in the pipeline's combined listing.
    pub splits: std::ops::Range<u64>,
}

/// Where one split's elements live: which source's entry, and which split of that entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntrySplit<'a> {
    /// The entry (the source's entry at the cut).
    pub fingerprint: &'a Fingerprint,
    /// Index of the source in `spec.sources` (0 for a single source).
    pub input: usize,
    /// The split's index in its own source's listing: the entry's split.
    pub split: u64,
}

/// The cache store of a pipeline and the entries its tasks may use.
pub struct EngineCache {
    /// The store (`spec.cache.store`).
    pub store: CacheStore,
    /// The legal cuts, in order.
    pub cuts: Vec<Cut>,
    /// Pipeline name, recorded in the entries it creates.
    pub pipeline: String,
    /// Each source, in the order of `spec.sources` (one for a single source).
    pub inputs: Vec<CachedInput>,
    /// Names of `spec.stages`, recorded in entries.
    pub stage_names: Vec<String>,
    /// Splits in the pipeline's combined listing (every source's).
    pub listed: u64,
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

    /// `(source, split of the source's listing)` of split id `split` of the combined listing.
    /// Ids past the listing are further passes of an upsampled source (`pass × listed + id`):
    /// they read listed split `id`, and so do their entries. Only the seeds of the stages differ
    /// between passes, and the stages before a cut are deterministic (they draw nothing from
    /// their seeded stream, or an entry could not serve later epochs either), so a pass's
    /// elements at the cut are its base split's.
    pub fn locate(&self, split: u64) -> Option<(usize, u64)> {
        let base = split.checked_rem(self.listed)?;
        let input = self.inputs.iter().position(|i| i.splits.contains(&base))?;
        Some((input, base - self.inputs[input].splits.start))
    }

    /// The entry split of split id `split` at `cut`, if the pipeline lists that split.
    pub fn entry<'a>(&self, cut: &'a Cut, split: u64) -> Option<EntrySplit<'a>> {
        let (input, split) = self.locate(split)?;
        Some(EntrySplit { fingerprint: cut.fingerprints.get(input)?, input, split })
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
