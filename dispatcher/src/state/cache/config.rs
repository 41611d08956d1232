//! A pipeline's cache settings, read from the `spec.cache` (and the prices in `spec.scaling`) of
//! its manifest.

use granary_crds::{CachePolicy, CacheSpec, ScalingSpec, StageSpec};

/// What `spec.cache` asks for, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// `auto`, `never` (also when `spec.cache` is absent) or `at`.
    pub policy: CachePolicy,
    /// For `at`: the stage named, and the cut after it (its position + 1).
    pub at: Option<String>,
    /// See `at`; `None` when the name matches no stage.
    pub cut: Option<usize>,
    /// The cache store URL.
    pub store: Option<String>,
    /// Most bytes the pipeline's entries may take.
    pub max_bytes: Option<u64>,
    /// Entries unused this long are evicted.
    pub ttl_s: Option<u64>,
    /// `spec.scaling.workerCostPerHour`, 0 when unset.
    pub worker_cost_per_hour: f64,
    /// `spec.scaling.trainerCostPerHour`, 0 when unset.
    pub trainer_cost_per_hour: f64,
    /// Why the settings cannot be followed as written, if they cannot.
    pub problem: Option<String>,
}

impl CacheConfig {
    /// No caching.
    pub fn never() -> CacheConfig {
        CacheConfig {
            policy: CachePolicy::Never,
            at: None,
            cut: None,
            store: None,
            max_bytes: None,
            ttl_s: None,
            worker_cost_per_hour: 0.0,
            trainer_cost_per_hour: 0.0,
            problem: None,
        }
    }

    /// The settings of an `InputPipeline` manifest (JSON). A manifest without `spec.cache`, or
    /// one that cannot be read, does not cache.
    pub fn from_manifest(json: &str) -> CacheConfig {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
            return CacheConfig::never();
        };
        let spec = &value["spec"];
        let cache = match spec.get("cache").filter(|c| !c.is_null()) {
            None => return CacheConfig::never(),
            Some(c) => match serde_json::from_value::<CacheSpec>(c.clone()) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("spec.cache cannot be read ({e}); the pipeline computes");
                    return CacheConfig::never();
                }
            },
        };
        let stages: Vec<StageSpec> =
            spec.get("stages").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default();
        let scaling: ScalingSpec =
            spec.get("scaling").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default();
        CacheConfig::resolve(&cache, &stages, &scaling)
    }

    /// Resolves `cache` against the stages and prices of the spec.
    pub fn resolve(cache: &CacheSpec, stages: &[StageSpec], scaling: &ScalingSpec) -> CacheConfig {
        let mut config = CacheConfig::never();
        config.worker_cost_per_hour = scaling.worker_cost_per_hour.unwrap_or(0.0).max(0.0);
        config.trainer_cost_per_hour = scaling.trainer_cost_per_hour.unwrap_or(0.0).max(0.0);
        if cache.policy == CachePolicy::Never {
            return config;
        }
        let Some(store) = cache.store.clone().filter(|s| !s.is_empty()) else {
            tracing::warn!("spec.cache has no `store`; the pipeline computes");
            return config;
        };
        config.policy = cache.policy;
        config.store = Some(store);
        config.max_bytes = cache.max_bytes.as_ref().and_then(|m| match m.bytes() {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!("spec.cache.maxBytes ignored: {e}");
                None
            }
        });
        config.ttl_s = cache.ttl.as_deref().and_then(|t| match granary_crds::cache::parse_duration(t) {
            Ok(d) => Some(d.as_secs()),
            Err(e) => {
                tracing::warn!("spec.cache.ttl ignored: {e}");
                None
            }
        });
        if cache.policy == CachePolicy::At {
            config.at = cache.at.clone();
            match &cache.at {
                Some(at) => {
                    config.cut = stages.iter().position(|s| s.display_name() == at).map(|i| i + 1);
                    if config.cut.is_none() {
                        config.problem = Some(format!("`spec.cache.at` names `{at}`, which is no stage"));
                    }
                }
                None => config.problem = Some("`policy: at` without `at`".into()),
            }
        }
        config
    }

    /// The policy as written in the spec.
    pub fn policy_name(&self) -> &'static str {
        match self.policy {
            CachePolicy::Auto => "auto",
            CachePolicy::Never => "never",
            CachePolicy::At => "at",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_cache_is_resolved() {
        let json = r#"{"spec":{"stages":[{"op":"image.decode"},{"op":"image.resize","name":"small"}],
            "scaling":{"workerCostPerHour":0.5},
            "cache":{"policy":"at","at":"small","store":"file:///tmp/c","maxBytes":"1Ki","ttl":"2h"}}}"#;
        let c = CacheConfig::from_manifest(json);
        assert_eq!(c.policy, CachePolicy::At);
        assert_eq!(c.cut, Some(2));
        assert_eq!(c.max_bytes, Some(1024));
        assert_eq!(c.ttl_s, Some(7200));
        assert_eq!(c.worker_cost_per_hour, 0.5);
        assert_eq!(CacheConfig::from_manifest("{}").policy, CachePolicy::Never);
        let by_op = r#"{"spec":{"stages":[{"op":"image.decode"}],"cache":{"policy":"at","at":"image.decode","store":"s3://b/"}}}"#;
        assert_eq!(CacheConfig::from_manifest(by_op).cut, Some(1));
    }
}
