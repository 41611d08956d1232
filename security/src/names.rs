//! The name a pipeline's workers serve TLS under. Workers are dialled by pod address, which no
//! certificate shared by a pipeline's pods can list, so clients check a worker's certificate
//! against a name derived from the pipeline instead: a worker of another pipeline, holding a
//! certificate from the same CA, cannot pass for one of this pipeline's.

use aws_lc_rs::digest::{SHA256, digest};

/// The DNS domain of worker names; not resolvable, it only names certificates.
pub const WORKER_DOMAIN: &str = "workers.granary.internal";

/// The DNS name `pipeline`'s workers' certificates carry and clients verify: a hash of the
/// pipeline's exact name (any characters, any length) as one DNS label under
/// [`WORKER_DOMAIN`].
pub fn worker_server_name(pipeline: &str) -> String {
    let hash = digest(&SHA256, pipeline.as_bytes());
    let label: String = hash.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{label}.{WORKER_DOMAIN}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pipeline_gets_its_own_valid_dns_name() {
        let a = worker_server_name("team/imagenet");
        assert_eq!(a, worker_server_name("team/imagenet"));
        assert_ne!(a, worker_server_name("team/imagenet2"));
        assert_ne!(a, worker_server_name("other/imagenet"));
        let label = a.split('.').next().unwrap();
        assert_eq!(label.len(), 32);
        assert!(label.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(worker_server_name(&"ü/x".repeat(200)).len() < 64 + WORKER_DOMAIN.len());
    }
}
