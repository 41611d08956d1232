//! Removing a deleted pipeline's cache entries: those it created (their `entry.json` names it),
//! unless a pipeline still registered writes or reads them. Runs after the pipeline is
//! unregistered, so its own use no longer counts.

use crate::service::Dispatcher;
use granary_store::cache::{CacheError, CacheStore, Fingerprint};
use serde::Serialize;

/// What removing a pipeline's entries did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CleanedUp {
    /// Fingerprints of the entries removed.
    pub removed: Vec<String>,
    /// Objects deleted with them.
    pub objects: u64,
    /// Bytes they held.
    pub bytes: u64,
    /// Fingerprints of the pipeline's entries kept because another pipeline uses them.
    pub kept: Vec<String>,
}

impl Dispatcher {
    /// Removes from the cache store at `store_url` every entry that `pipeline` created, except
    /// those a registered pipeline writes or reads. Call it after unregistering `pipeline`.
    pub async fn remove_cache_entries(
        &self,
        pipeline: &str,
        store_url: &str,
    ) -> Result<CleanedUp, CacheError> {
        let _not_while_evicting = self.inner.evicting.lock().await;
        let store = CacheStore::open(store_url)?;
        let mut done = CleanedUp::default();
        for entry in store.list_entries().await? {
            if entry.info.as_ref().is_none_or(|info| info.pipeline != pipeline) {
                continue;
            }
            let in_use = self
                .state()
                .cache_stores()
                .iter()
                .any(|u| u.url == store_url && u.in_use.contains(&entry.fingerprint));
            if in_use {
                done.kept.push(entry.fingerprint);
                continue;
            }
            let objects = store.remove(&Fingerprint::parse(&entry.fingerprint)?).await?;
            tracing::info!(
                store = %store_url, fingerprint = %entry.fingerprint, objects, %pipeline,
                "cache entry removed with its pipeline"
            );
            done.objects += objects;
            done.bytes += entry.bytes;
            done.removed.push(entry.fingerprint);
        }
        Ok(done)
    }
}
