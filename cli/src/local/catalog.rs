//! The dispatcher's view of sources, through the data plane's listing.

use granary_crds::Manifest;

/// Lists sources with `granary_worker::catalog`.
pub struct WorkerCatalog;

impl granary_dispatcher::Catalog for WorkerCatalog {
    fn describe(&self, manifest: &Manifest) -> Result<granary_dispatcher::Listing, String> {
        let listing = granary_worker::catalog::list(&manifest.pipeline.spec).map_err(|e| e.to_string())?;
        Ok(granary_dispatcher::Listing {
            counts: listing.splits.iter().map(|s| s.elements).collect(),
            inputs: listing.inputs.iter().map(|r| r.len() as u64).collect(),
        })
    }
}
