//! The trainer side of Granary: join a job as a consumer, read batch parts from every worker at
//! once, assemble them into batches, drop duplicates, report step and wait times, and checkpoint
//! and resume the position. See `docs/data-plane.md`.
//!
//! ```no_run
//! # async fn train() -> Result<(), granary_client::ClientError> {
//! let mut client = granary_client::Client::connect(Some("localhost:7070"), "imagenet").await?;
//! while let Some(batch) = client.next().await {
//!     let batch = batch?;
//!     let _images = batch.tensor("image");
//!     let _saved = client.checkpoint().to_bytes();
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod assembler;
mod backoff;
mod batch;
mod blocking;
mod client;
mod dispatcher;
mod endpoint;
mod error;
mod expand;
mod finisher;
mod heartbeat;
mod host;
mod images;
mod metrics;
mod mode;
mod options;
mod pad;
mod plan;
mod position;
mod prefetch;
mod ranges;
mod registration;
mod replay;
mod session;
mod streams;
mod task;
mod tensor;

pub use batch::Batch;
pub use blocking::BlockingClient;
pub use client::Client;
pub use error::ClientError;
pub use mode::Mode;
pub use options::{ClientOptions, DISPATCHER_ENV, IMAGES_ENV, ImagePlacement};
pub use position::{POSITION_VERSION, Position, SourcePosition};
pub use prefetch::DEFAULT_PREFETCH_BYTES;
pub use tensor::Tensor;
