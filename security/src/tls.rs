//! TLS for Granary's gRPC links, over tonic's rustls transport: a component's certificate, key
//! and the CA it trusts, read from PEM files (mounted from a Secret on Kubernetes, written by
//! `granary run --tls` locally).
//!
//! Servers ask for a client certificate but do not require one: components (workers, the
//! operator) present theirs (mutual TLS), while trainers authenticate with a bearer token over
//! a server-authenticated connection. A client certificate that is presented must chain to the
//! CA, or the handshake fails.

use std::path::{Path, PathBuf};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Why TLS settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} `{path}`: {source}")]
    Read {
        /// Which file it is (`the CA certificate`, …).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not PEM of the kind expected.
    #[error("{what} `{path}` holds no PEM {kind}; give a PEM file (`-----BEGIN {kind}-----`)")]
    NotPem {
        /// Which file it is.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The PEM label expected.
        kind: &'static str,
    },
}

/// Where a component's TLS material lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate every peer's certificate must chain to (PEM).
    pub ca: PathBuf,
    /// This component's certificate (PEM); `None` for a client without one (a trainer).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); needed with `cert`.
    pub key: Option<PathBuf>,
}

/// PEM material read from [`TlsFiles`].
#[derive(Clone)]
pub struct TlsMaterial {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name servers' certificates must carry, whatever host is dialled.
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").field("identity", &self.identity.is_some()).finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path, kind: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes =
        std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_path_buf(), source })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.contains("-----BEGIN ") && text.contains(kind);
    if !found {
        return Err(TlsError::NotPem { what, path: path.to_path_buf(), kind });
    }
    Ok(bytes)
}

impl TlsFiles {
    /// The CA, certificate and key in `dir` under the names `granary run --tls` and the
    /// operator's Secrets use: `ca.crt`, `tls.crt`, `tls.key` (the last two when present).
    pub fn in_dir(dir: &Path) -> TlsFiles {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        let has = cert.exists() && key.exists();
        TlsFiles { ca: dir.join("ca.crt"), cert: has.then_some(cert), key: has.then_some(key) }
    }

    /// Reads the files.
    pub fn load(&self) -> Result<TlsMaterial, TlsError> {
        let ca = read("the CA certificate", &self.ca, "CERTIFICATE")?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((
                read("the certificate", cert, "CERTIFICATE")?,
                read("the private key", key, "PRIVATE KEY")?,
            )),
            _ => None,
        };
        Ok(TlsMaterial { ca, identity, server_name: None })
    }
}

impl TlsMaterial {
    /// Material from PEM text in memory.
    pub fn from_pem(ca: &str, identity: Option<(&str, &str)>) -> TlsMaterial {
        TlsMaterial {
            ca: ca.as_bytes().to_vec(),
            identity: identity.map(|(c, k)| (c.as_bytes().to_vec(), k.as_bytes().to_vec())),
            server_name: None,
        }
    }

    /// The same material, checking every server's certificate for `name` instead of the host
    /// dialled: how clients check workers, dialled by address, against their pipeline's
    /// [`worker_server_name`](crate::names::worker_server_name).
    pub fn naming(mut self, name: impl Into<String>) -> TlsMaterial {
        self.server_name = Some(name.into());
        self
    }

    /// Whether this side has a certificate of its own.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// A server's settings: its certificate (it must have one), and client certificates checked
    /// against the CA when presented.
    pub fn server(&self) -> Option<ServerTlsConfig> {
        crate::provider::install();
        let (cert, key) = self.identity.as_ref()?;
        Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(cert, key))
                .client_ca_root(Certificate::from_pem(&self.ca))
                .client_auth_optional(true),
        )
    }

    /// A client's settings: the CA to check the server against, the name the server's
    /// certificate must carry (`domain`, unless [`TlsMaterial::naming`] set one), and this
    /// side's certificate when it has one.
    pub fn client(&self, domain: &str) -> ClientTlsConfig {
        crate::provider::install();
        let domain = self.server_name.as_deref().unwrap_or(domain);
        let config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca)).domain_name(domain);
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_pem_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles::in_dir(dir.path());
        assert_eq!(files.cert, None, "no certificate in the folder");
        let error = files.load().unwrap_err().to_string();
        assert!(error.contains("the CA certificate") && error.contains("ca.crt"), "{error}");
        std::fs::write(dir.path().join("ca.crt"), "hello").unwrap();
        let error = files.load().unwrap_err().to_string();
        assert!(error.contains("holds no PEM CERTIFICATE"), "{error}");
    }
}
