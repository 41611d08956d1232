//! What the autocacher decided for a pipeline and what the cache did in each epoch, for status,
//! summaries and benchmarks.

use super::{EpochCheck, EpochStats};
use crate::state::State;
use granary_policies::caching::{Action, CacheDecision};
use serde::Serialize;

/// A pipeline's cache, as reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CacheReport {
    /// `auto`, `never` or `at`.
    pub policy: String,
    /// The cache store URL, if the pipeline caches.
    pub store: Option<String>,
    /// The decision, with its reason; `None` while waiting for a profile (or never caching).
    pub decision: Option<CacheDecision>,
    /// Name of the stage whose output is cached, when writing or reading.
    pub stage: Option<String>,
    /// The entry's fingerprint, when writing or reading (the first source's, for
    /// `spec.sources`).
    pub fingerprint: Option<String>,
    /// With `spec.sources`, when writing or reading: each source's entry, in order. Each is the
    /// entry a single-source pipeline reading that source with the same stages uses.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceEntry>,
    /// What the cache did in each epoch that completed splits.
    pub epochs: Vec<EpochCache>,
    /// Each finished epoch's prediction against its outcome, in order (see
    /// [`EpochCheck::verdict`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<EpochCheck>,
    /// The last check in words: "epoch 0: predicted 8.4 s computing, measured 25 s (+198%):
    /// re-deciding → write `small` (cut 2)".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// How many times the closed loop re-decided.
    pub redecisions: u32,
}

impl CacheReport {
    /// What the cache does now: `off` (no cache, or the policy is `never`), `profiling`
    /// (waiting for a profile to decide), `compute`, `writing` or `reading`.
    pub fn state(&self) -> &'static str {
        let last_mode = self.epochs.last().map(|e| e.mode.as_str());
        match (&self.decision, self.policy.as_str()) {
            (None, "never") => "off",
            (None, _) if self.store.is_none() => "off",
            (None, _) => "profiling",
            (Some(d), _) => match d.action {
                Action::Compute => "compute",
                Action::Write { .. } if last_mode == Some("read") => "reading",
                Action::Write { .. } => "writing",
                Action::Read { .. } => "reading",
            },
        }
    }

    /// Splits whose cache read failed (a bad entry, or the store failing) and that were
    /// recomputed from the source, over every epoch.
    pub fn fallbacks(&self) -> u64 {
        self.epochs.iter().map(|e| e.splits_bad + e.splits_read_failed).sum()
    }
}

/// One source's cache entry, as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceEntry {
    /// The source's name in `spec.sources`.
    pub name: String,
    /// Its entry's fingerprint.
    pub fingerprint: String,
}

/// Every state [`CacheReport::state`] may answer.
pub const CACHE_STATES: [&str; 5] = ["off", "profiling", "compute", "writing", "reading"];

/// The cache in one epoch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochCache {
    /// Epoch.
    pub epoch: u32,
    /// `read` when every split was read, `write` when any split was written, else `compute`.
    pub mode: String,
    /// Entry bytes read (as stored).
    pub bytes_read: u64,
    /// Entry bytes written (as stored).
    pub bytes_written: u64,
    /// Splits read from the entry.
    pub splits_read: u64,
    /// Splits computed and written.
    pub splits_written: u64,
    /// Splits computed without the cache.
    pub splits_computed: u64,
    /// Splits whose entry part failed verification.
    pub splits_bad: u64,
    /// Splits counted as read whose read failed on the store and that were recomputed.
    pub splits_read_failed: u64,
    /// Elements recomputed after failed reads.
    pub recomputed: u64,
    /// The decision's predicted pipeline rate (elements/s) for this epoch: the predicted time
    /// per element of reading, writing and computing, weighted by the splits of each kind. Once
    /// the epoch is checked, the rate it was checked against.
    pub predicted_items_per_s: Option<f64>,
    /// The rate the dispatcher measured over the epoch (elements/s), once it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_items_per_s: Option<f64>,
}

pub(super) fn mode(s: &EpochStats) -> &'static str {
    if s.splits_written > 0 {
        "write"
    } else if s.splits_read > 0 && s.splits_read >= s.splits_computed {
        "read"
    } else {
        "compute"
    }
}

fn positive(x: f64) -> Option<f64> {
    (x.is_finite() && x > 0.0).then_some(x)
}

/// The predicted rate of an epoch whose splits were read, written and computed as `s` counts
/// them: the time per element of each kind, weighted by its splits.
pub(super) fn blended(p: &granary_policies::caching::Predicted, s: &EpochStats) -> Option<f64> {
    let time = |rate: Option<f64>| rate.and_then(positive).map(|r| 1.0 / r);
    let kinds = [
        (s.splits_read, time(p.read_items_per_s)),
        (s.splits_written, time(p.write_items_per_s)),
        (s.splits_computed + s.splits_bad, time(Some(p.compute_items_per_s))),
    ];
    let mut splits = 0u64;
    let mut seconds = 0.0;
    for (n, t) in kinds {
        if n > 0 {
            seconds += n as f64 * t?;
            splits += n;
        }
    }
    (splits > 0).then(|| splits as f64 / seconds)
}

impl State {
    /// The cache report of `pipeline`; `None` when it is not registered.
    pub fn cache_report(&self, pipeline: &str) -> Option<CacheReport> {
        let p = self.pipelines.get(pipeline)?;
        let config = &p.cache.config;
        let chosen = p.cache.decision.as_ref();
        let entry = chosen.and_then(|c| c.entry_of(0).map(|fp| (c.stage.clone(), fp.to_string())));
        let names = p.facts.mixing.as_ref().map(|m| m.names.clone()).unwrap_or_default();
        let sources = chosen
            .filter(|c| !c.sources.is_empty())
            .map(|c| {
                c.entries()
                    .into_iter()
                    .enumerate()
                    .map(|(i, fp)| SourceEntry {
                        name: names.get(i).cloned().unwrap_or_else(|| format!("sources[{i}]")),
                        fingerprint: fp.to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let epochs = p
            .cache
            .stats
            .iter()
            .map(|(&epoch, s)| {
                let mode = mode(s);
                let check = p.cache.checks.iter().rev().find(|c| c.epoch == epoch);
                let predicted = match check {
                    Some(c) => Some(c.predicted_items_per_s()),
                    None => chosen.and_then(|c| blended(&c.decision.predicted, s)),
                };
                EpochCache {
                    epoch,
                    mode: mode.to_string(),
                    bytes_read: s.bytes_read,
                    bytes_written: s.bytes_written,
                    splits_read: s.splits_read,
                    splits_written: s.splits_written,
                    splits_computed: s.splits_computed,
                    splits_bad: s.splits_bad,
                    splits_read_failed: s.splits_read_failed,
                    recomputed: s.recomputed,
                    predicted_items_per_s: predicted.and_then(positive),
                    measured_items_per_s: check.map(EpochCheck::measured_items_per_s).and_then(positive),
                }
            })
            .collect();
        Some(CacheReport {
            policy: config.policy_name().to_string(),
            store: config.store.clone(),
            decision: chosen.map(|c| c.decision.clone()),
            stage: entry.as_ref().map(|e| e.0.clone()),
            fingerprint: entry.map(|e| e.1),
            sources,
            epochs,
            checks: p.cache.checks.clone(),
            last_check: p.cache.checks.last().map(|c| c.text.clone()),
            redecisions: p.cache.checks.iter().filter(|c| c.verdict == "re-decided").count() as u32,
        })
    }
}
