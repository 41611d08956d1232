//! `granary._native`: the Rust half of the Python client. It wraps the `granary-client` crate, so
//! exactly-once delivery, duplicate dropping, trainer metrics and checkpoint/resume have one
//! implementation; the pure-Python package `granary` builds the user-facing API on top of it.
//!
//! Batches cross into Python without copying: each tensor's received buffer is handed over as a
//! read-only [`TensorBuffer`] that exports the buffer protocol, which NumPy wraps as an array.

mod buffer;
mod client;
mod drain;
mod errors;

pub use buffer::TensorBuffer;
pub use client::{Client, RawBatch};
pub use drain::DrainReport;

use pyo3::prelude::*;

/// The extension module, imported as `granary._native`.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Client>()?;
    module.add_class::<RawBatch>()?;
    module.add_class::<TensorBuffer>()?;
    module.add_class::<DrainReport>()?;
    module.add("DISPATCHER_ENV", granary_client::DISPATCHER_ENV)?;
    module.add("POSITION_VERSION", granary_client::POSITION_VERSION)?;
    Ok(())
}
