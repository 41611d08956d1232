//! How the dispatcher learns a source's splits and their element counts without depending on the
//! data plane: whoever hosts the dispatcher (the `granary` binary) supplies a `Catalog`.

use granary_crds::Manifest;

/// A pipeline's listing, as the dispatcher plans with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Element count of each split, in listing order (across the inputs, in order).
    pub counts: Vec<u64>,
    /// Splits of each input (`spec.source`, or each of `spec.sources`), in order; they sum to
    /// `counts.len()`.
    pub inputs: Vec<u64>,
}

impl Listing {
    /// The listing of a single source.
    pub fn single(counts: Vec<u64>) -> Listing {
        let inputs = vec![counts.len() as u64];
        Listing { counts, inputs }
    }
}

/// Lists a pipeline's source.
pub trait Catalog: Send + Sync + 'static {
    /// The pipeline's splits and their element counts. Blocking; called off the async runtime.
    fn describe(&self, manifest: &Manifest) -> Result<Listing, String>;
}
