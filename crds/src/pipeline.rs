//! The `InputPipeline` resource and its spec.

use crate::batch::{BucketSpec, PadSpec};
use crate::errors::ErrorsSpec;
use crate::mixing::{Input, InputPath, MixingSpec, SINGLE_SOURCE_NAME, WeightedSource};
use crate::{CacheSpec, InputPipelineStatus, PythonSpec, ScalingSpec, SourceSpec, StageSpec, WorkersSpec};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An ML input pipeline: a source in object storage, ordered stages, shuffling, batching, and the
/// bounds within which Granary scales its workers and caches its intermediate results.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "granary.dev",
    version = "v1alpha1",
    kind = "InputPipeline",
    plural = "inputpipelines",
    shortname = "ipl",
    namespaced,
    status = "InputPipelineStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Workers","type":"string","jsonPath":".status.workers","description":"ready/desired workers"}"#,
    printcolumn = r#"{"name":"Throughput","type":"number","jsonPath":".status.throughput","description":"elements per second delivered"}"#,
    printcolumn = r#"{"name":"Wait","type":"number","jsonPath":".status.trainerWaitFraction","description":"share of trainer time spent waiting"}"#,
    printcolumn = r#"{"name":"Cache","type":"string","jsonPath":".status.cache.state"}"#,
    printcolumn = r#"{"name":"Epoch","type":"integer","jsonPath":".status.epoch"}"#,
    printcolumn = r#"{"name":"Dispatcher","type":"string","jsonPath":".status.endpoint.dispatcher","priority":1,"description":"host:port trainers connect to, with the pipeline key <namespace>/<name>"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    category = "granary",
    category = "all",
    doc = "An ML input pipeline that Granary serves to trainers: a source in object storage, ordered \
           stages, shuffling and batching, run by a pool of worker pods that the autoscaler sizes within \
           `spec.scaling`, with a transformed intermediate cached in object storage when the autocacher \
           finds it pays. Trainers connect to `status.endpoint`."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.source) != has(self.sources)",
        "message": "give exactly one of `source` (one dataset) and `sources` (datasets mixed by weight)"
    },
    {
        "rule": "has(self.sources) || !has(self.mixing)",
        "message": "`mixing` applies only to `sources`"
    }
]))]
pub struct InputPipelineSpec {
    /// Where the samples live and how they are stored. Give this or `sources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceSpec>,
    /// Several datasets mixed into one stream by weight, instead of `source`. Each draw takes
    /// `mixing.block` elements from one source, chosen by a sampler seeded by `seed` and the
    /// epoch, so that each source's share of every epoch follows the weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 64))]
    pub sources: Vec<WeightedSource>,
    /// How `sources` are mixed: when an epoch ends, and how many elements one draw takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixing: Option<MixingSpec>,
    /// Operators applied to every element, in order. At least one.
    #[schemars(length(min = 1))]
    pub stages: Vec<StageSpec>,
    /// Seeded shuffle buffer applied within each split; splits are also visited in a seeded
    /// random order. Without it, splits and elements keep the source's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<ShuffleSpec>,
    /// How elements are grouped into batches.
    pub batch: BatchSpec,
    /// Seed of every random choice (split order, shuffle, augmentations). Each (seed, epoch, split)
    /// gets its own stream, so a split re-run yields the same elements. Defaults to 0.
    #[serde(default)]
    pub seed: u64,
    /// Number of passes over the source. Defaults to 1.
    #[serde(default = "default_epochs")]
    #[schemars(range(min = 1))]
    pub epochs: u32,
    /// Worker-count bounds and policy, within which the autoscaler sizes the worker pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,
    /// Caching of a deterministic stage output in object storage, decided by the autocacher from
    /// measured costs (or pinned with `policy: at`). Absent: nothing is cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// The worker pods of this pipeline, where they differ from the chart's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersSpec>,
    /// Where `python.map` stages find their code under Kubernetes, besides the worker image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonSpec>,
    /// What an element that a stage fails on does: fail its split (the default), or be skipped
    /// and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<ErrorsSpec>,
    /// Whether the optimizer may rewrite the stages into an equivalent plan: move filters and
    /// size-reducing stages earlier, read only the fields the pipeline uses, and fuse image
    /// stages. Defaults to true; `granary plan` prints the plan and each rewrite with its
    /// equivalence rule. `false` runs the stages exactly as written.
    #[serde(default = "default_optimize", skip_serializing_if = "is_true")]
    pub optimize: bool,
}

fn default_optimize() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

impl InputPipelineSpec {
    /// Whether elements that a stage fails on are skipped (`spec.errors.policy: skip`).
    pub fn skips_elements(&self) -> bool {
        self.errors.as_ref().is_some_and(ErrorsSpec::skips)
    }

    /// The pipeline's inputs: its single `source`, or each of `sources`, in order. Split ids are
    /// numbered across them in this order.
    pub fn inputs(&self) -> Vec<Input<'_>> {
        match &self.source {
            Some(source) => {
                vec![Input { name: SINGLE_SOURCE_NAME, path: InputPath::Single, source, weight: 1.0 }]
            }
            None => self
                .sources
                .iter()
                .enumerate()
                .map(|(i, s)| Input {
                    name: &s.name,
                    path: InputPath::Mixed(i),
                    source: &s.source,
                    weight: s.weight,
                })
                .collect(),
        }
    }

    /// Whether several sources are mixed (`spec.sources`).
    pub fn is_mixed(&self) -> bool {
        self.source.is_none() && !self.sources.is_empty()
    }

    /// The single source, or the first of `sources` (for settings that every source shares).
    pub fn first_source(&self) -> Option<&SourceSpec> {
        self.source.as_ref().or_else(|| self.sources.first().map(|s| &s.source))
    }
}

fn default_epochs() -> u32 {
    1
}

/// Seeded shuffle buffer.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShuffleSpec {
    /// Number of elements held and drawn from at random, within each split. Memory grows with it
    /// (buffer × element size) on top of `--prefetch-bytes`.
    #[schemars(range(min = 1))]
    pub buffer: u32,
}

/// How elements are grouped into batches.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BatchSpec {
    /// Elements per batch, 1 to 1,000,000.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub size: u32,
    /// Drop the last, partial batch of each epoch instead of delivering it. Defaults to false.
    #[serde(default)]
    pub drop_remainder: bool,
    /// Fields whose length along the first axis may differ between elements (token sequences
    /// after `text.truncate`): each batch pads them to its longest element and adds a mask.
    /// Absent: every field must have one shape in every element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<PadSpec>,
    /// Group elements by the length of a padded field, so that each batch pads little (as
    /// tf.data's `bucket_by_sequence_length`). Needs `pad`. Absent: batches take elements in
    /// their (shuffled) order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<BucketSpec>,
}
