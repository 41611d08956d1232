//! The Tokio runtime the targets run async code on: one per process, built on first use.

use std::sync::OnceLock;
use tokio::runtime::Runtime;

/// The process's runtime: one worker thread (sources read through its handle from the calling
/// thread) and the blocking pool.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
            Ok(runtime) => runtime,
            // No runtime means no fuzzing at all: the harness itself is broken.
            Err(e) => panic!("cannot start a Tokio runtime: {e}"),
        }
    })
}
