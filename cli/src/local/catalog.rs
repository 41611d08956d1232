//! The dispatcher's view of sources, through the data plane's listing.

use granary_crds::Manifest;

/// Lists sources with `granary_worker::catalog`.
pub struct WorkerCatalog;

impl granary_dispatcher::Catalog for WorkerCatalog {
    fn describe(&self, manifest: &Manifest) -> Result<Vec<u64>, String> {
        granary_worker::catalog::describe(&manifest.pipeline.spec)
            .map(|splits| splits.iter().map(|s| s.elements).collect())
            .map_err(|e| e.to_string())
    }
}
