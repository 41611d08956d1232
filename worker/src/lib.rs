//! Granary's data plane: sources over object storage, operators, and the executor that turns a
//! validated `InputPipeline` spec into a deterministic, memory-bounded stream of batches.
//!
//! The data path is a straight line: object store → source splits → operators → shuffle within
//! a split → batches. Everything random is seeded per (seed, epoch, split, element), so a split
//! re-run yields identical elements whatever the thread count.

#[cfg(not(target_endian = "little"))]
compile_error!("granary-worker assumes a little-endian target: batch buffers are little-endian");

pub mod allocator;
pub mod batch;
pub mod budget;
pub mod buffers;
pub mod cache;
pub mod catalog;
mod contained;
#[cfg(test)]
mod counting_store;
pub mod element;
pub mod engine;
pub mod executor;
pub mod memory;
pub mod ops;
pub mod scheduling;
pub mod seed;
pub mod service;
pub mod source;
pub mod store;
pub mod tensor;

pub use batch::{Batch, BatchTensor};
pub use element::{Element, FieldName, Value};
pub use engine::{DeferredNormalize, Engine, EngineError, EngineOptions, fused_runs};
pub use ops::image::fused::ImagePath;
pub use tensor::{DType, Tensor, TensorData};
