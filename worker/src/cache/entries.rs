//! Which entries a pipeline may use: its legal cuts and their fingerprints.
//!
//! A cut is legal when it lies in the deterministic prefix and the stages as they run have a
//! boundary there: a fused stage (decode with a random crop) computes other bits than its parts
//! one after another, so a cut inside it would make cached epochs differ from computed ones.
//! With `policy: at` the engine does not fuse across the named cut instead.

use super::{Cut, EngineCache};
use crate::executor::Plan;
use crate::source::Source;
use granary_crds::{CachePolicy, InputPipelineSpec};
use granary_store::cache::{CacheError, CacheStore, EntryIdentity};

/// A file a stage read when it was built (a tokenizer): its content is part of the identity of
/// every entry after that stage, so editing it in place never serves a stale entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Index of the stage in `spec.stages`.
    pub stage: usize,
    /// Where it was read from, as the spec names it.
    pub location: String,
    /// SHA-256 of its content, hex.
    pub sha256: String,
}

impl Resource {
    /// The resource `bytes` read from `location` by stage `stage`.
    pub fn new(stage: usize, location: &str, bytes: &[u8]) -> Resource {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(bytes);
        let sha256 = digest.iter().map(|b| format!("{b:02x}")).collect();
        Resource { stage, location: location.to_string(), sha256 }
    }
}

/// The cut `policy: at` pins, if the spec has one: stages up to and including the named one.
pub fn pinned_cut(spec: &InputPipelineSpec) -> Option<usize> {
    let cache = spec.cache.as_ref()?;
    if cache.policy != CachePolicy::At {
        return None;
    }
    let at = cache.at.as_deref()?;
    spec.stages.iter().position(|s| s.display_name() == at).map(|i| i + 1)
}

/// Whether the spec asks for caching at all.
pub fn caches(spec: &InputPipelineSpec) -> bool {
    spec.cache.as_ref().is_some_and(|c| c.policy != CachePolicy::Never && c.store.is_some())
}

/// The cache context of a pipeline whose plan and source are built, or `None` when it does not
/// cache or has no legal cut.
pub fn build(
    spec: &InputPipelineSpec,
    pipeline: &str,
    source: &Source,
    plan: &Plan,
    resources: &[Resource],
    writer_id: String,
    chunk_bytes: usize,
) -> Result<Option<EngineCache>, CacheError> {
    let Some(url) = spec.cache.as_ref().filter(|_| caches(spec)).and_then(|c| c.store.as_deref()) else {
        return Ok(None);
    };
    // Mixed sources are not cached (validation refuses `cache` with `sources`).
    let Some(source_spec_of) = spec.source.as_ref() else { return Ok(None) };
    let store = CacheStore::open(url)?;
    let prefix = granary_crds::validate::deterministic_prefix_len(&spec.stages).min(plan.spec_stages);
    let candidates: Vec<usize> = match pinned_cut(spec) {
        Some(k) => vec![k],
        None => (0..=prefix).collect(),
    };
    let source_spec = serde_json::to_value(&spec.source).unwrap_or_default();
    let extra = serde_json::json!({
        "objects": source.identity(),
        "source": source_spec,
        "splits": source.splits().len(),
        "filesPerSplit": source_spec_of.files_per_split(spec.batch.size.max(1) as usize),
    });
    let mut cuts = Vec::new();
    for k in candidates {
        if k > prefix || plan.stage_at_cut(k).is_none() {
            continue;
        }
        let stages = spec.stages[..k]
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                // The name is a label: renaming a stage does not change its output.
                if let Some(map) = v.as_object_mut() {
                    map.remove("name");
                }
                v
            })
            .collect();
        let read: Vec<serde_json::Value> = resources
            .iter()
            .filter(|r| r.stage < k)
            .map(|r| serde_json::json!({"stage": r.stage, "location": r.location, "sha256": r.sha256}))
            .collect();
        let mut extra = extra.clone();
        if let Some(map) = extra.as_object_mut() {
            map.insert("resources".to_string(), serde_json::Value::Array(read));
        }
        let identity = EntryIdentity {
            source_url: source.url().to_string(),
            source_format: format!("{:?}", source_spec_of.format).to_lowercase(),
            // The listing is in `extra` as one digest, hashed once for every cut.
            objects: Vec::new(),
            stages,
            extra,
        };
        let stage = if k == 0 { "source".to_string() } else { spec.stages[k - 1].display_name().to_string() };
        cuts.push(Cut { index: k, stage, fingerprint: identity.fingerprint() });
    }
    if cuts.is_empty() {
        return Ok(None);
    }
    Ok(Some(EngineCache {
        store,
        cuts,
        pipeline: pipeline.to_string(),
        source_url: source.url().to_string(),
        stage_names: spec.stages.iter().map(|s| s.display_name().to_string()).collect(),
        splits: source.splits().len() as u64,
        writer_id,
        chunk_bytes: chunk_bytes.max(1),
    }))
}
