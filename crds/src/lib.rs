//! The `InputPipeline` custom resource (`granary.dev/v1alpha1`): the user-facing spec that both
//! `kubectl apply` and `granary run` read, its status, its validation, and CRD generation.
//!
//! Field names here are the public API: every doc comment becomes `kubectl explain` text.

pub mod batch;
pub mod cache;
pub mod errors;
mod fieldpath;
pub mod manifest;
pub mod mixing;
mod object_url;
pub mod ops;
pub mod part_bound;
pub mod pipeline;
pub mod problem;
pub mod quantity;
pub mod read;
pub mod scaling;
pub mod source;
pub mod stage;
pub mod status;
mod suggest;
pub mod validate;
pub mod workers;

pub use cache::{ByteSize, CachePolicy, CacheSpec, OnDelete};
pub use errors::{ErrorPolicy, ErrorsSpec};
pub use manifest::{Manifest, load_manifest, parse_manifest};
pub use mixing::{Input, InputPath, MixStop, MixingSpec, WeightedSource};
pub use ops::{DType, OpConfig};
pub use pipeline::{BatchSpec, InputPipeline, InputPipelineSpec, ShuffleSpec};
pub use problem::{Problem, Problems};
pub use quantity::{parse_bytes, parse_duration};
pub use scaling::{ScalingPolicy, ScalingSpec};
pub use source::{SourceFormat, SourceSpec};
pub use stage::StageSpec;
pub use status::{CacheStatus, Endpoint, InputPipelineStatus, PipelinePhase, PlanStatus, SourceCacheEntry};
pub use validate::validate;
pub use workers::{PythonSpec, WorkersSpec};
