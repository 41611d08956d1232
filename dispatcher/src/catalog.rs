//! How the dispatcher learns a source's splits and their element counts without depending on the
//! data plane: whoever hosts the dispatcher (the `granary` binary) supplies a `Catalog`.

use granary_crds::Manifest;

/// Lists a pipeline's source.
pub trait Catalog: Send + Sync + 'static {
    /// Element count of each split, in listing order. Blocking; called off the async runtime.
    fn describe(&self, manifest: &Manifest) -> Result<Vec<u64>, String>;
}
