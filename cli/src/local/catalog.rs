//! The dispatcher's view of sources, through the data plane's listing.

use granary_crds::Manifest;

use std::time::Duration;

/// Lists sources with `granary_worker::catalog`, giving up on a listing after `budget`.
pub struct WorkerCatalog {
    /// How long listing and counting one pipeline's source may take.
    pub budget: Duration,
}

impl Default for WorkerCatalog {
    fn default() -> Self {
        WorkerCatalog { budget: granary_worker::catalog::COUNT_BUDGET }
    }
}

impl granary_dispatcher::Catalog for WorkerCatalog {
    fn describe(&self, manifest: &Manifest) -> Result<granary_dispatcher::Listing, String> {
        let listing = granary_worker::catalog::list_within(&manifest.pipeline.spec, self.budget)
            .map_err(|e| e.to_string())?;
        Ok(granary_dispatcher::Listing {
            counts: listing.splits.iter().map(|s| s.elements).collect(),
            inputs: listing.inputs.iter().map(|r| r.len() as u64).collect(),
        })
    }
}
