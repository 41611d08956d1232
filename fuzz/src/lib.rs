//! Coverage-guided fuzz targets for Granary, on stable Rust.
//!
//! Each target is a plain function of the fuzzer's bytes that must never panic, hang or touch
//! memory it does not own, whatever the bytes; a returned error is a normal outcome. The
//! libFuzzer binaries (`src/bin/`, built with SanitizerCoverage by `scripts/fuzz`) call these
//! functions, and so does the regression test (`tests/regressions.rs`), which replays every
//! committed input in `corpus/` and `regressions/` in the normal build.
//!
//! | target | what it feeds |
//! | --- | --- |
//! | [`manifest`] | an `InputPipeline` manifest: YAML parsing, `--set` overrides, validation |
//! | [`dispatcher_requests`] | a sequence of dispatcher gRPC requests, decoded with prost and served in-process |
//! | [`worker_requests`] | a worker's `StreamBatches` requests: field checks, capabilities, stream limits |
//! | [`image_decode`] | `image.decode` (JPEG, PNG, WebP), the fused JPEG crop path, and `decode_window` |
//! | [`source_webdataset`], [`source_tfrecord`], [`source_jsonl`], [`source_csv`], [`source_parquet`] | a source object, listed and read |
//! | [`cache`] | the cache's split manifests and chunk objects |

mod cache;
mod dispatcher;
mod image;
mod input;
mod manifest;
mod panics;
mod runtime;
mod sources;
mod worker;

pub use cache::cache;
pub use dispatcher::dispatcher_requests;
pub use image::image_decode;
pub use manifest::manifest;
pub use panics::unwind_dependency_panics;
pub use sources::{source_csv, source_jsonl, source_parquet, source_tfrecord, source_webdataset};
pub use worker::worker_requests;

/// A fuzz target: a function of the fuzzer's bytes.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and its corpus folder.
pub const TARGETS: &[(&str, Target)] = &[
    ("manifest", manifest),
    ("dispatcher_requests", dispatcher_requests),
    ("worker_requests", worker_requests),
    ("image_decode", image_decode),
    ("source_webdataset", source_webdataset),
    ("source_tfrecord", source_tfrecord),
    ("source_jsonl", source_jsonl),
    ("source_csv", source_csv),
    ("source_parquet", source_parquet),
    ("cache", cache),
];
