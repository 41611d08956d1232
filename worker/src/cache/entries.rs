//! Which entries a pipeline may use: its legal cuts and their fingerprints.
//!
//! A cut is legal when it lies in the deterministic prefix and the stages as they run have a
//! boundary there: a fused stage (decode with a random crop) computes other bits than its parts
//! one after another, so a cut inside it would make cached epochs differ from computed ones.
//! With `policy: at` the engine does not fuse across the named cut instead.

use super::{CachedInput, Cut, EngineCache};
use crate::executor::Plan;
use crate::source::{InputListing, Source};
use granary_crds::{CachePolicy, InputPipelineSpec, SourceFormat, SourceSpec};
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
///
/// Every source has its own entry at each cut, whose fingerprint depends only on that source
/// (URL, format and its options, listing, splits) and on the stages before the cut with the
/// resources they read: a mixed pipeline's entry of a source is the entry a single-source
/// pipeline reading that source with the same stages writes and reads, and the other way round.
/// A source's name and weight only choose which elements are drawn, so they are not part of it,
/// and neither is the batch size (see [`source_identity`]).
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
    let inputs = spec.inputs();
    let listings = source.listings();
    if inputs.is_empty() || inputs.len() != listings.len() {
        // The source was listed from this spec; a mismatch would make every entry a wrong one.
        return Ok(None);
    }
    let store = CacheStore::open(url)?;
    let prefix = granary_crds::validate::deterministic_prefix_len(&spec.stages).min(plan.spec_stages);
    let candidates: Vec<usize> = match pinned_cut(spec) {
        Some(k) => vec![k],
        None => (0..=prefix).collect(),
    };
    let mut cuts = Vec::new();
    for k in candidates {
        if k > prefix || plan.stage_at_cut(k).is_none() {
            continue;
        }
        let stages = stage_identity(spec, k);
        let read: Vec<serde_json::Value> = resources
            .iter()
            .filter(|r| r.stage < k)
            .map(|r| serde_json::json!({"stage": r.stage, "location": r.location, "sha256": r.sha256}))
            .collect();
        let fingerprints = inputs
            .iter()
            .zip(&listings)
            .map(|(input, listing)| source_identity(input.source, listing, &stages, &read).fingerprint())
            .collect();
        let stage = if k == 0 { "source".to_string() } else { spec.stages[k - 1].display_name().to_string() };
        cuts.push(Cut { index: k, stage, fingerprints });
    }
    if cuts.is_empty() {
        return Ok(None);
    }
    let inputs = listings
        .iter()
        .map(|l| CachedInput { url: l.url.to_string(), splits: l.splits.start as u64..l.splits.end as u64 })
        .collect();
    Ok(Some(EngineCache {
        store,
        cuts,
        pipeline: pipeline.to_string(),
        inputs,
        stage_names: spec.stages.iter().map(|s| s.display_name().to_string()).collect(),
        listed: source.splits().len() as u64,
        writer_id,
        chunk_bytes: chunk_bytes.max(1),
    }))
}

/// The stages before cut `k`, each with its arguments and without its name.
fn stage_identity(spec: &InputPipelineSpec, k: usize) -> Vec<serde_json::Value> {
    spec.stages[..k]
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            // The name is a label: renaming a stage does not change its output.
            if let Some(map) = v.as_object_mut() {
                map.remove("name");
            }
            v
        })
        .collect()
}

/// The identity of one source's entry at a cut whose stages are `stages` (see [`build`]).
/// `source` is the source as the spec gives it (for `spec.sources`, without its name and
/// weight); `read` the resources those stages read.
///
/// The batch size is not part of it. It shapes no split: `format: files` groups
/// [`SourceSpec::files_per_split`] files, which has a default of its own, and the other formats
/// split by file or row group. Nor does it shape an element before a cut: the only stages that
/// see it are batched ones (a batched `python.map` gets groups of `batch.size` elements), and
/// one of those lies in the deterministic prefix only when it declares `deterministic: true`,
/// which promises each element's output from that element alone, whatever its group. A batched
/// stage that draws from its group's random stream ends the prefix, so no entry holds its output.
/// `filesPerSplit` enters only for `format: files`, where it groups the files into splits.
pub fn source_identity(
    source: &SourceSpec,
    listing: &InputListing<'_>,
    stages: &[serde_json::Value],
    read: &[serde_json::Value],
) -> EntryIdentity {
    let mut extra = serde_json::json!({
        "objects": listing.identity,
        "source": serde_json::to_value(source).unwrap_or_default(),
        "splits": listing.splits.len(),
        "resources": read,
    });
    if source.format == SourceFormat::Files
        && let Some(map) = extra.as_object_mut()
    {
        map.insert("filesPerSplit".to_string(), source.files_per_split().into());
    }
    EntryIdentity {
        source_url: listing.url.to_string(),
        source_format: format!("{:?}", source.format).to_lowercase(),
        // The listing is in `extra` as one digest, hashed once for every cut.
        objects: Vec::new(),
        stages: stages.to_vec(),
        extra,
    }
}
