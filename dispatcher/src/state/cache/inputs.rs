//! The autocacher's inputs: a worker's measured profile, the entries' complete splits, the
//! pipeline's size, progress and workers, and the prices of its spec.

use crate::state::State;
use granary_policies::caching::{Boundary, CacheCosts, CacheInputs, StoreRates};
use granary_proto::v1 as pb;

/// Dollars per GB-month of stored entry (object storage list price).
pub const STORAGE_PER_GB_MONTH: f64 = 0.023;

/// Hours an entry is expected to be kept when `spec.cache.ttl` is unset.
pub const DEFAULT_RETENTION_HOURS: f64 = 24.0 * 7.0;

/// The policy's inputs for pipeline `name` from `profile`.
pub(crate) fn inputs(state: &State, name: &str, profile: &pb::CacheProfile) -> CacheInputs {
    let Some(p) = state.pipelines.get(name) else {
        return empty(profile);
    };
    let counts = &p.facts.counts;
    let total: u64 = counts.iter().sum();
    let store = p.cache.config.store.clone().unwrap_or_default();
    // The listed elements whose entry splits are complete, over every source's entry (each
    // source's entry splits are numbered in its own listing, from `first` in the combined one).
    let firsts: Vec<u64> = match &p.facts.mixing {
        Some(m) => m
            .splits
            .iter()
            .scan(0u64, |first, &n| Some(std::mem::replace(first, first.saturating_add(n))))
            .collect(),
        None => vec![0],
    };
    let existing_fraction = |b: &pb::CacheBoundary| -> f64 {
        if total == 0 {
            return 0.0;
        }
        let mut done = 0u64;
        for (fp, first) in super::boundary_entries(b).into_iter().zip(&firsts) {
            let Some(entry) = state.cache_entries.get(&(store.clone(), fp.to_string())) else { continue };
            done += entry
                .complete
                .keys()
                .filter_map(|&s| counts.get(s.saturating_add(*first) as usize))
                .sum::<u64>();
        }
        done as f64 / total as f64
    };
    let mut boundaries: Vec<Boundary> = profile
        .boundaries
        .iter()
        .map(|b| Boundary {
            index: b.index as usize,
            stage: b.stage.clone(),
            prefix_s_per_element: b.prefix_seconds_per_element,
            suffix_s_per_element: b.suffix_seconds_per_element,
            bytes_per_element: b.bytes_per_element,
            encode_s_per_element: b.encode_seconds_per_element,
            decode_s_per_element: b.decode_seconds_per_element,
            existing_fraction: existing_fraction(b),
        })
        .collect();
    boundaries.sort_by_key(|b| b.index);
    let workers =
        state.workers.values().filter(|w| w.pipeline.as_deref().is_none_or(|x| x == name)).count().max(1)
            as f64;
    let slowest = state.decision_epoch(name);
    let config = &p.cache.config;
    CacheInputs {
        boundaries,
        compute_s_per_element: profile.compute_seconds_per_element,
        cores: f64::from(profile.cores.max(1)) * workers,
        readers: workers,
        elements_per_epoch: total,
        remaining_epochs: p.facts.epochs.saturating_sub(slowest),
        store: StoreRates {
            read_bytes_per_s: profile.read_bytes_per_second,
            write_bytes_per_s: profile.write_bytes_per_second,
        },
        costs: CacheCosts {
            time_per_hour: config.worker_cost_per_hour * workers + config.trainer_cost_per_hour,
            storage_per_gb_month: STORAGE_PER_GB_MONTH,
            retention_hours: config.ttl_s.map_or(DEFAULT_RETENTION_HOURS, |s| s as f64 / 3600.0),
        },
        max_bytes: config.max_bytes,
    }
}

fn empty(profile: &pb::CacheProfile) -> CacheInputs {
    CacheInputs {
        boundaries: Vec::new(),
        compute_s_per_element: profile.compute_seconds_per_element,
        cores: f64::from(profile.cores.max(1)),
        readers: 1.0,
        elements_per_epoch: 0,
        remaining_epochs: 0,
        store: StoreRates { read_bytes_per_s: 0.0, write_bytes_per_s: 0.0 },
        costs: CacheCosts {
            time_per_hour: 0.0,
            storage_per_gb_month: STORAGE_PER_GB_MONTH,
            retention_hours: DEFAULT_RETENTION_HOURS,
        },
        max_bytes: None,
    }
}
