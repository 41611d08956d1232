//! The autocacher's I/O around the pure state: listing an entry's complete splits when a profile
//! arrives, touching entries pipelines start reading, and evicting entries by age and budget.
//! Every store call runs outside the state lock.

use crate::service::{Dispatcher, now_unix_s};
use granary_proto::v1 as pb;
use granary_store::cache::{CacheStore, EvictionRules, Fingerprint, plan_eviction};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::Status;

/// How often entries are checked for eviction while some pipeline caches.
pub const EVICTION_PERIOD: Duration = Duration::from_secs(30);

/// An entry removed by eviction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Evicted {
    /// The cache store URL.
    pub store: String,
    /// The entry's fingerprint.
    pub fingerprint: String,
    /// Why it went (age, budget), in words.
    pub reason: String,
    /// Objects deleted.
    pub objects: u64,
}

impl Dispatcher {
    /// `ReportCacheProfile` of `pipeline` (its fields checked by the caller): lists what the
    /// store already holds of each measured cut, then decides. A decision triggers an eviction
    /// pass.
    pub(crate) async fn cache_profile(
        &self,
        pipeline: String,
        generation: u64,
        profile: pb::CacheProfile,
    ) -> Result<(), Status> {
        let store = self.state().cache_store_of(&pipeline);
        let existing = match store {
            Some((url, true)) if profile.error.is_empty() => existing_splits(&url, &profile).await,
            _ => BTreeMap::new(),
        };
        let decision =
            self.mutate(move |s, now| s.cache_profile(&pipeline, generation, profile, existing, now)).await?;
        if decision.is_some() {
            let me = self.clone();
            tokio::spawn(async move { me.evict_caches().await });
        }
        Ok(())
    }

    /// One eviction pass over every cache store in use: entries past the TTL, then the least
    /// recently used past the budgets (the store-wide `cache_max_bytes`, each pipeline's
    /// `maxBytes`), never one a running pipeline writes or reads. Returns what was removed.
    pub async fn evict_caches(&self) -> Vec<Evicted> {
        let _one_at_a_time = self.inner.evicting.lock().await;
        let uses = self.state().cache_stores();
        let mut evicted = Vec::new();
        for usage in uses {
            let store = match CacheStore::open(&usage.url) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(store = %usage.url, "cache eviction skipped the store: {e}");
                    continue;
                }
            };
            let entries = match store.list_entries().await {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(store = %usage.url, "cache eviction cannot list entries: {e}");
                    continue;
                }
            };
            let rules = EvictionRules {
                ttl_s: usage.ttl_s,
                store_max_bytes: self.inner.cache_max_bytes,
                pipeline_max_bytes: usage.pipeline_max_bytes.clone(),
            };
            for (fp, reason) in plan_eviction(&entries, now_unix_s(), &rules, &usage.in_use) {
                // A pipeline may have chosen the entry since the plan was made.
                let in_use =
                    self.state().cache_stores().iter().any(|u| u.url == usage.url && u.in_use.contains(&fp));
                if in_use {
                    continue;
                }
                let objects = match Fingerprint::parse(&fp) {
                    Ok(parsed) => store.remove(&parsed).await,
                    Err(e) => Err(e),
                };
                match objects {
                    Ok(objects) => {
                        tracing::info!(store = %usage.url, fingerprint = %fp, objects, "cache entry evicted: {reason}");
                        let (url, f) = (usage.url.clone(), fp.clone());
                        let _ = self
                            .mutate(move |s, _| {
                                s.cache_evicted(&url, &f);
                                Ok(())
                            })
                            .await;
                        evicted.push(Evicted { store: usage.url.clone(), fingerprint: fp, reason, objects });
                    }
                    Err(e) => {
                        tracing::warn!(store = %usage.url, fingerprint = %fp, "cannot evict the cache entry: {e}")
                    }
                }
            }
        }
        evicted
    }
}

/// Complete splits (split → stored bytes) of each cut's entries (every source's) in the store
/// at `url`; a store that fails counts as holding nothing.
async fn existing_splits(url: &str, profile: &pb::CacheProfile) -> BTreeMap<String, BTreeMap<u64, u64>> {
    let mut out = BTreeMap::new();
    let store = match CacheStore::open(url) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(store = %url, "cannot open the cache store; assuming it holds nothing: {e}");
            return out;
        }
    };
    let fingerprints = profile.boundaries.iter().flat_map(crate::state::boundary_entries);
    for text in fingerprints {
        // A malformed fingerprint is refused by the state with the request.
        let Ok(fp) = Fingerprint::parse(text) else { continue };
        if out.contains_key(text) {
            continue;
        }
        match store.completed_splits(&fp).await {
            Ok(splits) => {
                out.insert(text.to_string(), splits);
            }
            Err(e) => tracing::warn!(
                store = %url,
                fingerprint = %text,
                "cannot list the cache entry's splits; assuming none: {e}"
            ),
        }
    }
    out
}
