//! Elements skipped under `spec.errors.policy: skip`: a worker drops an element that a stage
//! fails on, completes its split with the smaller count (which the plan learns, as it does a
//! filter's), and reports how many it skipped. The total is journaled with each split's
//! completion, once per (job, epoch, split), and the pipeline fails past `maxSkipped`.

use super::State;
use granary_crds::ErrorsSpec;

/// A pipeline's `spec.errors` and what was skipped under it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Skips {
    /// The pipeline's `spec.errors`.
    pub(crate) errors: ErrorsSpec,
    /// Elements skipped, over every job and epoch.
    pub(crate) total: u64,
    /// The error of the latest skipped element a worker described.
    pub(crate) last: Option<String>,
}

impl Skips {
    /// No skips yet, under the `spec.errors` of the pipeline `manifest_json` describes.
    pub(crate) fn new(manifest_json: &str) -> Skips {
        Skips { errors: ErrorsSpec::of_manifest_json(manifest_json), total: 0, last: None }
    }
}

impl State {
    /// Elements `pipeline` skipped (`spec.errors.policy: skip`), over every job and epoch.
    pub fn skipped(&self, pipeline: &str) -> u64 {
        self.pipelines.get(pipeline).map_or(0, |p| p.skips.total)
    }

    /// Adds the skips of a split produced for the first time; the pipeline fails once the total
    /// passes `spec.errors.maxSkipped` (or when a worker skipped under `policy: fail`, which
    /// only a worker of another spec would).
    pub(crate) fn add_skips(&mut self, pipeline: &str, skipped: u64, error: Option<&str>) {
        if skipped == 0 {
            return;
        }
        let Some(p) = self.pipelines.get_mut(pipeline) else { return };
        p.skips.total = p.skips.total.saturating_add(skipped);
        if let Some(error) = error.filter(|e| !e.is_empty()) {
            p.skips.last = Some(error.to_string());
        }
        let last = p.skips.last.as_deref().map(|e| format!("; the last: {e}")).unwrap_or_default();
        let total = p.skips.total;
        let why = if !p.skips.errors.skips() {
            Some(format!(
                "a worker skipped {total} elements, but spec.errors.policy is `fail`{last}; do the workers \
                 run this pipeline's spec?"
            ))
        } else {
            p.skips.errors.exceeded_by(total).map(|max| {
                format!(
                    "{total} elements were skipped, more than spec.errors.maxSkipped ({max}) allows{last}; \
                     fix or remove the failing elements, or raise maxSkipped"
                )
            })
        };
        if let Some(why) = why
            && p.failed.is_none()
        {
            tracing::error!(%pipeline, "{why}");
            p.failed = Some(why);
        }
    }
}
