//! The autocacher's control-plane state. Per pipeline: the cache settings of its spec, the
//! measured profile, the decision and per-epoch figures. Dispatcher-wide, per entry (cache store
//! URL and fingerprint): which splits are complete, bad, or being written. Pure like the rest
//! of the state: no I/O, the time comes in as milliseconds.

mod config;
mod feedback;
mod inputs;
mod leases;
mod report;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_feedback;
#[cfg(test)]
mod tests_sources;

pub use config::CacheConfig;
pub use feedback::EpochCheck;
pub use inputs::{DEFAULT_RETENTION_HOURS, STORAGE_PER_GB_MONTH};
pub use report::{CACHE_STATES, CacheReport, EpochCache, SourceEntry};

use super::{DispatchError, Event, State};
use granary_crds::CachePolicy;
use granary_policies::caching::feedback::Corrections;
use granary_policies::caching::{self as policy, Action, CacheDecision, Predicted};
use granary_proto::v1 as pb;
use std::collections::{BTreeMap, BTreeSet};

/// How long a caching pipeline waits for a cache profile before it computes without one.
pub const PROFILE_WAIT_MS: u64 = 30_000;

/// The decision a pipeline runs with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chosen {
    pub(crate) decision: CacheDecision,
    /// The chosen entry's fingerprint (empty when computing); of the first source for
    /// `spec.sources`.
    pub(crate) fingerprint: String,
    /// With `spec.sources`: each source's entry at the chosen cut, in order (empty when
    /// computing, and for a single source, whose entry is `fingerprint`).
    pub(crate) sources: Vec<String>,
    /// The chosen cut (0 when computing).
    pub(crate) boundary: usize,
    /// Name of the stage whose output is cached (empty when computing).
    pub(crate) stage: String,
    /// The slowest job's epoch when the decision was made.
    pub(crate) epoch: u32,
}

impl Chosen {
    /// A decision to compute.
    fn compute(decision: CacheDecision, epoch: u32) -> Chosen {
        Chosen {
            decision,
            fingerprint: String::new(),
            sources: Vec::new(),
            boundary: 0,
            stage: String::new(),
            epoch,
        }
    }

    /// The fingerprints of the entries the pipeline writes or reads: one per source (empty when
    /// computing).
    pub(crate) fn entries(&self) -> Vec<&str> {
        match self.decision.action {
            Action::Compute => Vec::new(),
            Action::Write { .. } | Action::Read { .. } if self.sources.is_empty() => vec![&self.fingerprint],
            Action::Write { .. } | Action::Read { .. } => self.sources.iter().map(String::as_str).collect(),
        }
    }

    /// The fingerprint of the entry source `input` writes or reads.
    pub(crate) fn entry_of(&self, input: usize) -> Option<&str> {
        self.entries().get(input).copied()
    }
}

/// What the cache did for one pipeline in one epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpochStats {
    pub(crate) splits_read: u64,
    pub(crate) splits_written: u64,
    pub(crate) splits_computed: u64,
    pub(crate) splits_bad: u64,
    /// Splits read whose read failed on the store (not a bad entry) and were recomputed; they
    /// are counted in `splits_read` too.
    pub(crate) splits_read_failed: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) recomputed: u64,
    /// Listed elements of the splits completed.
    pub(crate) elements: u64,
    /// When the earliest-granted lease among those completed was granted (ms, this run's clock).
    pub(crate) started_ms: Option<u64>,
    /// When the state last saw completions of the epoch: the first tick after them (ms).
    pub(crate) done_ms: Option<u64>,
    /// Whether the epoch's prediction was checked against its outcome (once, when it finished).
    pub(crate) checked: bool,
}

/// A pipeline's cache state.
pub(crate) struct PipelineCache {
    pub(crate) config: CacheConfig,
    pub(crate) profile: Option<pb::CacheProfile>,
    pub(crate) decision: Option<Chosen>,
    /// When the state first saw the pipeline wait for a profile.
    pub(crate) waiting_since: Option<u64>,
    pub(crate) stats: BTreeMap<u32, EpochStats>,
    /// Entries the store was told (once each) that the pipeline started reading.
    pub(crate) touched: BTreeSet<String>,
    /// When each live lease of the pipeline was granted (ms), to time its epoch.
    pub(crate) granted: BTreeMap<u64, u64>,
    /// Epochs with completions the clock has not stamped yet.
    pub(crate) unstamped: BTreeSet<u32>,
    /// Each finished epoch's prediction against its outcome, in order.
    pub(crate) checks: Vec<EpochCheck>,
    /// What the measured epochs corrected in the profile's figures.
    pub(crate) corrections: Corrections,
}

impl PipelineCache {
    pub(crate) fn new(manifest_json: &str) -> PipelineCache {
        PipelineCache {
            config: CacheConfig::from_manifest(manifest_json),
            profile: None,
            decision: None,
            waiting_since: None,
            stats: BTreeMap::new(),
            touched: BTreeSet::new(),
            granted: BTreeMap::new(),
            unstamped: BTreeSet::new(),
            checks: Vec::new(),
            corrections: Corrections::default(),
        }
    }

    /// Whether the pipeline may cache, so that its epochs are timed and checked.
    pub(crate) fn timed(&self) -> bool {
        self.config.policy != CachePolicy::Never && self.config.store.is_some()
    }

    /// The pipeline caches and has no decision yet: the first worker measures a profile while
    /// its splits compute.
    pub(crate) fn wants_profile(&self) -> bool {
        self.config.policy != CachePolicy::Never && self.decision.is_none()
    }

    /// The store and fingerprint of the entry source `input` (0 for a single source) writes
    /// or reads.
    pub(crate) fn entry_key(&self, input: usize) -> Option<EntryKey> {
        let store = self.config.store.as_ref()?;
        let fp = self.decision.as_ref()?.entry_of(input)?;
        Some((store.clone(), fp.to_string()))
    }

    /// The fingerprints of every entry the pipeline writes or reads (one per source).
    pub(crate) fn entries(&self) -> Vec<String> {
        self.decision
            .as_ref()
            .map(|c| c.entries().into_iter().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

/// An entry: (cache store URL, fingerprint).
pub(crate) type EntryKey = (String, String);

/// What the dispatcher knows of one entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EntryState {
    /// Published splits and their stored bytes; never holds a bad split.
    pub(crate) complete: BTreeMap<u64, u64>,
    /// Splits that failed verification: never read again.
    pub(crate) bad: BTreeSet<u64>,
    /// Splits a live lease is writing, and that lease.
    pub(crate) writing: BTreeMap<u64, u64>,
    /// Last lease or report that used the entry (ms, this run's clock).
    pub(crate) last_used_ms: u64,
}

impl EntryState {
    pub(crate) fn written(&mut self, split: u64, bytes: u64) -> bool {
        if self.bad.contains(&split) {
            return false;
        }
        self.complete.insert(split, bytes) != Some(bytes)
    }

    pub(crate) fn mark_bad(&mut self, split: u64) -> bool {
        self.complete.remove(&split);
        self.bad.insert(split)
    }
}

/// One store in use and what eviction must respect there.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreUse {
    /// The cache store URL.
    pub url: String,
    /// Entries unused this long go (the longest `spec.cache.ttl` among the pipelines using the
    /// store); `None`: no age limit.
    pub ttl_s: Option<u64>,
    /// `spec.cache.maxBytes` of each pipeline that set it.
    pub pipeline_max_bytes: Vec<(String, u64)>,
    /// Fingerprints that pipelines still running write or read: never evicted.
    pub in_use: BTreeSet<String>,
}

fn decided_compute(reason: String, compute_items_per_s: f64) -> CacheDecision {
    CacheDecision {
        action: Action::Compute,
        predicted: Predicted { compute_items_per_s, write_items_per_s: None, read_items_per_s: None },
        reason,
        candidates: Vec::new(),
    }
}

/// Replaces figures JSON cannot carry (the journal must read back what it wrote).
fn finite(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(f64::MIN, f64::MAX) }
}

fn sanitize(mut d: CacheDecision) -> CacheDecision {
    let p = &mut d.predicted;
    p.compute_items_per_s = finite(p.compute_items_per_s);
    p.write_items_per_s = p.write_items_per_s.map(finite);
    p.read_items_per_s = p.read_items_per_s.map(finite);
    for c in &mut d.candidates {
        c.seconds = finite(c.seconds);
        c.bytes = finite(c.bytes);
        c.dollars = finite(c.dollars);
    }
    d
}

/// A fingerprint as the store names entries: 64 hex digits.
fn valid_fingerprint(fp: &str) -> bool {
    fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The entries of a measured cut: one per source, in order (`fingerprint` alone from a single
/// source, or from a worker that reports no `source_fingerprints`).
pub(crate) fn boundary_entries(b: &pb::CacheBoundary) -> Vec<&str> {
    if b.source_fingerprints.is_empty() {
        vec![&b.fingerprint]
    } else {
        b.source_fingerprints.iter().map(String::as_str).collect()
    }
}

impl State {
    /// A worker's cache profile for `pipeline`, with the entries' splits already complete in
    /// the store (per fingerprint: split → stored bytes). Decides where (and whether) the
    /// pipeline caches, journals the decision and returns it; `None` when the pipeline does not
    /// cache or already decided (a second profile is ignored).
    pub fn cache_profile(
        &mut self,
        pipeline: &str,
        generation: u64,
        profile: pb::CacheProfile,
        existing: BTreeMap<String, BTreeMap<u64, u64>>,
        now: u64,
    ) -> Result<Option<CacheDecision>, DispatchError> {
        let p = self.pipeline(pipeline)?;
        if p.generation != generation {
            return Err(DispatchError::FailedPrecondition(format!(
                "the cache profile was measured for generation {generation} of `{pipeline}`, which is at generation {}; measure again",
                p.generation
            )));
        }
        for b in &profile.boundaries {
            let fingerprints = std::iter::once(b.fingerprint.as_str()).chain(boundary_entries(b));
            if let Some(bad) = fingerprints.into_iter().find(|fp| !valid_fingerprint(fp)) {
                return Err(DispatchError::InvalidArgument(format!(
                    "cache boundary {} (`{}`) has fingerprint `{bad}`; expected 64 hex digits",
                    b.index, b.stage
                )));
            }
            let entries = boundary_entries(b).len();
            if entries != p.facts.inputs() {
                return Err(DispatchError::InvalidArgument(format!(
                    "cache boundary {} (`{}`) has {entries} source entries but `{pipeline}` reads {} \
                     sources; the worker runs another spec, measure again",
                    b.index,
                    b.stage,
                    p.facts.inputs()
                )));
            }
        }
        if !p.cache.wants_profile() {
            tracing::debug!(
                pipeline,
                "cache profile ignored: the pipeline does not cache or already decided"
            );
            return Ok(None);
        }
        let Some(store) = p.cache.config.store.clone() else { return Ok(None) };
        for (fp, splits) in existing {
            if splits.is_empty() {
                continue;
            }
            let entry = self.cache_entries.entry((store.clone(), fp)).or_default();
            entry.last_used_ms = entry.last_used_ms.max(now);
            for (split, bytes) in splits {
                entry.written(split, bytes);
            }
        }
        let chosen = self.choose(pipeline, &profile);
        if let Some(p) = self.pipelines.get_mut(pipeline) {
            p.cache.profile = Some(profile);
        }
        let decision = chosen.decision.clone();
        self.record_decision(pipeline, chosen);
        Ok(Some(decision))
    }

    /// The policy's decision for `profile`, with the chosen entry.
    fn choose(&self, name: &str, profile: &pb::CacheProfile) -> Chosen {
        let epoch = self.decision_epoch(name);
        let Some(p) = self.pipelines.get(name) else {
            return Chosen::compute(decided_compute("the pipeline is gone".into(), 0.0), epoch);
        };
        let compute = |reason: String, rate: f64| Chosen::compute(decided_compute(reason, rate), epoch);
        let inputs = inputs::inputs(self, name, profile);
        let rate = if inputs.compute_s_per_element > 0.0 {
            inputs.cores / inputs.compute_s_per_element
        } else {
            0.0
        };
        if !profile.error.is_empty() {
            return compute(
                format!("computing: measuring the cache profile failed: {}", profile.error),
                rate,
            );
        }
        let config = &p.cache.config;
        let decision = match config.policy {
            CachePolicy::Never => return compute("caching is off (`policy: never`)".into(), rate),
            CachePolicy::Auto => policy::decide(&inputs),
            CachePolicy::At => {
                let Some(cut) = config.cut else {
                    let why =
                        config.problem.clone().unwrap_or_else(|| "`spec.cache.at` names no stage".into());
                    return compute(format!("computing: {why}"), rate);
                };
                if !inputs.boundaries.iter().any(|b| b.index == cut) {
                    let measured: Vec<String> =
                        inputs.boundaries.iter().map(|b| b.index.to_string()).collect();
                    return compute(
                        format!(
                            "computing: `spec.cache.at` cuts after stage {cut}, which is not among the measured cuts ({}): it is outside the deterministic prefix",
                            measured.join(", ")
                        ),
                        rate,
                    );
                }
                policy::forced(&inputs, cut)
            }
        };
        self.chosen(name, profile, decision, epoch)
    }

    /// `decision` with its entry at the cut it chose, from `profile`'s cuts.
    pub(crate) fn chosen(
        &self,
        name: &str,
        profile: &pb::CacheProfile,
        decision: CacheDecision,
        epoch: u32,
    ) -> Chosen {
        let decision = sanitize(decision);
        let mixing = self.pipelines.get(name).is_some_and(|p| p.facts.mixing.is_some());
        let cut = match decision.action {
            Action::Compute => return Chosen::compute(decision, epoch),
            Action::Write { boundary } | Action::Read { boundary } => boundary,
        };
        match profile.boundaries.iter().find(|b| b.index as usize == cut) {
            Some(b) => Chosen {
                decision,
                fingerprint: b.fingerprint.clone(),
                // A single source's entry is `fingerprint`; the journal keeps its old shape.
                sources: if mixing {
                    boundary_entries(b).into_iter().map(str::to_string).collect()
                } else {
                    Vec::new()
                },
                boundary: cut,
                stage: b.stage.clone(),
                epoch,
            },
            None => {
                let rate = decision.predicted.compute_items_per_s;
                Chosen::compute(
                    decided_compute(
                        format!("computing: the policy chose cut {cut}, which the profile does not list"),
                        rate,
                    ),
                    epoch,
                )
            }
        }
    }

    /// The slowest job's epoch (0 without jobs).
    pub(crate) fn decision_epoch(&self, name: &str) -> u32 {
        let Some(p) = self.pipelines.get(name) else { return 0 };
        p.jobs.values().map(|j| j.slowest_epoch(p.facts.epochs)).min().unwrap_or(0)
    }

    fn record_decision(&mut self, name: &str, chosen: Chosen) {
        let Some(p) = self.pipelines.get_mut(name) else { return };
        tracing::info!(
            pipeline = name,
            action = ?chosen.decision.action,
            stage = %chosen.stage,
            fingerprint = %chosen.fingerprint,
            "cache decision: {}",
            chosen.decision.reason
        );
        self.events.push(Event::CacheDecided {
            pipeline: name.to_string(),
            generation: p.generation,
            decision: chosen.decision.clone(),
            fingerprint: chosen.fingerprint.clone(),
            sources: chosen.sources.clone(),
            boundary: chosen.boundary,
            stage: chosen.stage.clone(),
            epoch: chosen.epoch,
        });
        p.cache.decision = Some(chosen);
    }

    /// Decides to compute for a caching pipeline that has waited [`PROFILE_WAIT_MS`] for a
    /// profile. Until a decision, its splits are leased to compute: the first worker measures
    /// the profile beside its first splits instead of holding the epoch up.
    /// Also the clock of the closed loop, on each lease request: see [`State::cache_tick`].
    pub(crate) fn cache_profile_timeout(&mut self, name: &str, now: u64) {
        self.cache_tick(name, now);
        let Some(p) = self.pipelines.get_mut(name) else { return };
        if !p.cache.wants_profile() {
            return;
        }
        let since = *p.cache.waiting_since.get_or_insert(now);
        if now.saturating_sub(since) < PROFILE_WAIT_MS {
            return;
        }
        let reason = format!("computing: no cache profile arrived within {} s", PROFILE_WAIT_MS / 1000);
        let epoch = self.decision_epoch(name);
        self.record_decision(name, Chosen::compute(decided_compute(reason, 0.0), epoch));
    }

    /// Starts the profile wait of every caching pipeline that has none yet, and runs the closed
    /// loop's clock ([`State::cache_tick`]) for every pipeline that caches.
    pub(crate) fn stamp_profile_waits(&mut self, now: u64) {
        let mut timed = Vec::new();
        for (name, p) in &mut self.pipelines {
            if p.cache.wants_profile() && p.cache.waiting_since.is_none() {
                p.cache.waiting_since = Some(now);
            }
            if !p.cache.unstamped.is_empty() {
                timed.push(name.clone());
            }
        }
        for name in timed {
            self.cache_tick(&name, now);
        }
    }

    /// Takes the entries that pipelines started reading (store URL, fingerprint), to touch.
    pub fn take_cache_touches(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.cache_touches)
    }

    /// Whether some pipeline writes or reads a cache entry.
    pub fn caching(&self) -> bool {
        self.pipelines.values().any(|p| p.cache.config.store.is_some() && !p.cache.entries().is_empty())
    }

    /// Every cache store a pipeline uses, with what eviction there must respect.
    pub fn cache_stores(&self) -> Vec<StoreUse> {
        let mut stores: BTreeMap<String, StoreUse> = BTreeMap::new();
        for (name, p) in &self.pipelines {
            let config = &p.cache.config;
            let Some(url) = config.store.as_ref().filter(|_| config.policy != CachePolicy::Never) else {
                continue;
            };
            let store = stores.entry(url.clone()).or_insert_with(|| StoreUse {
                url: url.clone(),
                ttl_s: None,
                pipeline_max_bytes: Vec::new(),
                in_use: BTreeSet::new(),
            });
            if let Some(ttl) = config.ttl_s {
                store.ttl_s = Some(store.ttl_s.map_or(ttl, |t| t.max(ttl)));
            }
            if let Some(max) = config.max_bytes {
                store.pipeline_max_bytes.push((name.clone(), max));
            }
            let finished = !p.jobs.is_empty()
                && p.jobs
                    .values()
                    .all(|j| !j.consumers.is_empty() && j.consumers.values().all(|c| c.finished));
            if !finished {
                store.in_use.extend(p.cache.entries());
            }
        }
        // An entry a lease still writes stays, even once no decision names it (the pipeline
        // re-decided): the write finishes, or its lease is lost, before the entry may go.
        for ((url, fp), entry) in &self.cache_entries {
            if let Some(store) = stores.get_mut(url)
                && !entry.writing.is_empty()
            {
                store.in_use.insert(fp.clone());
            }
        }
        stores.into_values().collect()
    }

    /// An entry was removed from its store: forget it (journaled).
    pub fn cache_evicted(&mut self, store: &str, fingerprint: &str) {
        self.cache_entries.remove(&(store.to_string(), fingerprint.to_string()));
        self.events
            .push(Event::CacheEvicted { store: store.to_string(), fingerprint: fingerprint.to_string() });
    }

    /// The cache store URL of a pipeline that caches, and whether it still waits for a profile.
    pub fn cache_store_of(&self, pipeline: &str) -> Option<(String, bool)> {
        let p = self.pipelines.get(pipeline)?;
        let config = &p.cache.config;
        if config.policy == CachePolicy::Never {
            return None;
        }
        Some((config.store.clone()?, p.cache.wants_profile()))
    }
}
