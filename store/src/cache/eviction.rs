//! Eviction planning: which entries to remove, by TTL and size budgets, as a pure function.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::EntrySummary;

/// When entries are evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRules {
    /// Evict entries unused for longer than this many seconds.
    pub ttl_s: Option<u64>,
    /// Keep the whole cache within this many bytes, evicting the least recently used entries.
    pub store_max_bytes: Option<u64>,
    /// Keep each named pipeline's entries (by [`EntryInfo::pipeline`](super::EntryInfo)) within
    /// this many bytes, evicting its least recently used entries.
    pub pipeline_max_bytes: Vec<(String, u64)>,
}

/// The entries to evict, each with its reason, in the order decided: first those past the TTL,
/// then per pipeline budget, then for the store-wide budget, each budget evicting least recently
/// used first (by [`EntrySummary::last_used_unix_s`], ties by fingerprint). Entries whose
/// fingerprint is in `in_use` are never evicted, though their bytes count toward the budgets.
pub fn plan_eviction(
    entries: &[EntrySummary],
    now_unix_s: u64,
    rules: &EvictionRules,
    in_use: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut lru: Vec<&EntrySummary> = entries.iter().collect();
    lru.sort_by(|a, b| (a.last_used_unix_s(), &a.fingerprint).cmp(&(b.last_used_unix_s(), &b.fingerprint)));
    lru.dedup_by(|a, b| a.fingerprint == b.fingerprint);
    let mut plan: Vec<(String, String)> = Vec::new();
    let mut evicted: BTreeSet<&str> = BTreeSet::new();

    if let Some(ttl) = rules.ttl_s {
        for entry in &lru {
            let idle = now_unix_s.saturating_sub(entry.last_used_unix_s());
            if idle > ttl && !in_use.contains(&entry.fingerprint) {
                evicted.insert(&entry.fingerprint);
                plan.push((
                    entry.fingerprint.clone(),
                    format!("unused for {idle} s, longer than the TTL of {ttl} s"),
                ));
            }
        }
    }

    for (pipeline, max) in &rules.pipeline_max_bytes {
        let of_pipeline = |e: &&&EntrySummary| e.info.as_ref().is_some_and(|i| &i.pipeline == pipeline);
        let scope = format!("pipeline `{pipeline}`'s entries");
        evict_over_budget(lru.iter().filter(of_pipeline), *max, &scope, in_use, &mut evicted, &mut plan);
    }

    if let Some(max) = rules.store_max_bytes {
        evict_over_budget(lru.iter(), max, "the cache's entries", in_use, &mut evicted, &mut plan);
    }
    plan
}

/// Evicts from `candidates` (least recently used first) until the ones not yet evicted fit `max`.
fn evict_over_budget<'a>(
    candidates: impl Iterator<Item = &'a &'a EntrySummary>,
    max: u64,
    scope: &str,
    in_use: &BTreeSet<String>,
    evicted: &mut BTreeSet<&'a str>,
    plan: &mut Vec<(String, String)>,
) {
    let alive: Vec<&EntrySummary> =
        candidates.filter(|e| !evicted.contains(e.fingerprint.as_str())).copied().collect();
    let mut total: u64 = alive.iter().map(|e| e.bytes).sum();
    for entry in alive {
        if total <= max {
            break;
        }
        if in_use.contains(&entry.fingerprint) {
            continue;
        }
        plan.push((
            entry.fingerprint.clone(),
            format!(
                "least recently used of {scope}, which hold {total} bytes, over the budget of {max} bytes"
            ),
        ));
        evicted.insert(&entry.fingerprint);
        total -= entry.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{EntryInfo, FORMAT_VERSION};

    fn entry(fp: &str, pipeline: Option<&str>, last_used: u64, bytes: u64) -> EntrySummary {
        EntrySummary {
            fingerprint: fp.to_string(),
            info: pipeline.map(|p| EntryInfo {
                format_version: FORMAT_VERSION,
                fingerprint: fp.to_string(),
                pipeline: p.to_string(),
                source_url: "file:///d/".into(),
                boundary: 1,
                stage: "decode".into(),
                stages: vec!["decode".into()],
                splits_total: 4,
                created_unix_s: 0,
                last_used_unix_s: last_used,
            }),
            splits: 4,
            bytes,
            objects: 9,
            // Without info the object time counts; with info it must be ignored.
            last_modified_unix_s: if pipeline.is_some() { 999_999 } else { last_used },
        }
    }

    fn fps(plan: &[(String, String)]) -> Vec<&str> {
        plan.iter().map(|(fp, _)| fp.as_str()).collect()
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn no_rules_evict_nothing() {
        let entries = [entry("a", Some("p"), 0, 100)];
        assert!(plan_eviction(&entries, 1_000_000, &EvictionRules::default(), &none()).is_empty());
    }

    #[test]
    fn ttl_evicts_idle_entries_only() {
        let entries =
            [entry("old", Some("p"), 100, 1), entry("new", Some("p"), 950, 1), entry("bare", None, 10, 1)];
        let rules = EvictionRules { ttl_s: Some(100), ..EvictionRules::default() };
        let plan = plan_eviction(&entries, 1000, &rules, &none());
        assert_eq!(fps(&plan), ["bare", "old"]);
        assert!(plan[1].1.contains("unused for 900 s"), "{}", plan[1].1);
        // Exactly at the TTL is kept.
        assert!(plan_eviction(&entries, 200, &rules, &none()).iter().all(|(fp, _)| fp == "bare"));
    }

    #[test]
    fn store_budget_evicts_least_recently_used_first() {
        let entries = [
            entry("c", Some("p"), 30, 40),
            entry("a", Some("p"), 10, 40),
            entry("b", Some("q"), 20, 40),
            entry("d", None, 40, 40),
        ];
        let rules = EvictionRules { store_max_bytes: Some(100), ..EvictionRules::default() };
        let plan = plan_eviction(&entries, 50, &rules, &none());
        assert_eq!(fps(&plan), ["a", "b"]);
        assert!(plan[0].1.contains("160 bytes, over the budget of 100"), "{}", plan[0].1);
        let rules = EvictionRules { store_max_bytes: Some(160), ..EvictionRules::default() };
        assert!(plan_eviction(&entries, 50, &rules, &none()).is_empty());
    }

    #[test]
    fn pipeline_budget_counts_only_that_pipeline() {
        let entries =
            [entry("p1", Some("p"), 10, 50), entry("p2", Some("p"), 20, 50), entry("q1", Some("q"), 5, 500)];
        let rules = EvictionRules { pipeline_max_bytes: vec![("p".into(), 60)], ..EvictionRules::default() };
        let plan = plan_eviction(&entries, 30, &rules, &none());
        assert_eq!(fps(&plan), ["p1"]);
        assert!(plan[0].1.contains("pipeline `p`"), "{}", plan[0].1);
    }

    #[test]
    fn in_use_entries_are_never_evicted_but_count() {
        let entries =
            [entry("a", Some("p"), 10, 100), entry("b", Some("p"), 20, 100), entry("c", Some("p"), 30, 100)];
        let in_use: BTreeSet<String> = ["a".to_string()].into();
        let rules = EvictionRules {
            ttl_s: Some(1),
            store_max_bytes: Some(150),
            pipeline_max_bytes: vec![("p".into(), 150)],
        };
        let plan = plan_eviction(&entries, 1000, &rules, &in_use);
        assert_eq!(fps(&plan), ["b", "c"]);
        let rules = EvictionRules { store_max_bytes: Some(150), ..EvictionRules::default() };
        // `a` is oldest but in use: its 100 bytes still count, so `b` and `c` both go.
        assert_eq!(fps(&plan_eviction(&entries, 1000, &rules, &in_use)), ["b", "c"]);
        let everything: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        assert!(plan_eviction(&entries, 1000, &rules, &everything).is_empty());
    }

    #[test]
    fn ties_break_by_fingerprint_and_no_entry_is_planned_twice() {
        let entries =
            [entry("b", Some("p"), 10, 10), entry("a", Some("p"), 10, 10), entry("a", Some("p"), 10, 10)];
        let rules = EvictionRules {
            ttl_s: Some(0),
            store_max_bytes: Some(0),
            pipeline_max_bytes: vec![("p".into(), 0)],
        };
        assert_eq!(fps(&plan_eviction(&entries, 11, &rules, &none())), ["a", "b"]);
    }
}
