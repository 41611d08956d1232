//! The demo: a small deterministic synthetic dataset for the example pipelines.

pub mod data;
mod summary;
