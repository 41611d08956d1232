//! A certificate authority for one deployment: an ECDSA P-256 CA that issues each component a
//! short-lived leaf certificate. A leaf names its holder's role and scope in a URI subject
//! alternative name (`urn:granary:<role>:<scope>`, read back by [`crate::principal`]) and, for
//! servers, the DNS names and addresses clients dial.

use crate::token::Role;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::time::Duration;

/// The prefix of the URI that names a certificate's role and scope.
pub const URI_PREFIX: &str = "urn:granary:";

/// Why a certificate could not be made or the authority read.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// rcgen refused (a bad name, a key it cannot use).
    #[error("cannot make the certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// A DNS name or URI that is not ASCII.
    #[error("`{0}` cannot be put in a certificate: names must be ASCII")]
    Name(String),
}

/// A leaf certificate and its private key, both PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

/// A certificate authority.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

impl Authority {
    /// A new CA named `name`, valid for `validity` from now.
    pub fn generate(name: &str, validity: Duration) -> Result<Authority, AuthorityError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, validity);
        let cert = params.self_signed(&key)?;
        Ok(Authority { cert_pem: cert.pem(), issuer: Issuer::new(params, key) })
    }

    /// The CA kept as `cert_pem` and `key_pem` (what [`Authority::cert_pem`] and
    /// [`Authority::key_pem`] gave).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Authority, AuthorityError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Authority { issuer, cert_pem: cert_pem.to_string() })
    }

    /// The CA's certificate: what every component trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, to keep in a Secret.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A leaf for `role` over `scope` (a pipeline, or `*`), valid for `validity` from now. It
    /// serves TLS for the DNS names and IP addresses in `hosts` (none: a client certificate
    /// only); a worker's leaf for one pipeline also serves its pipeline's
    /// [`worker_server_name`](crate::names::worker_server_name), which clients check.
    pub fn issue(
        &self,
        role: Role,
        scope: &str,
        hosts: &[&str],
        validity: Duration,
    ) -> Result<Issued, AuthorityError> {
        let key = KeyPair::generate()?;
        let mut names: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        if role == Role::Worker && scope != crate::token::ANY {
            names.push(crate::names::worker_server_name(scope));
        }
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("granary {role} {scope}"));
        let uri = format!("{URI_PREFIX}{role}:{scope}");
        let uri_name = uri.clone().try_into().map_err(|_| AuthorityError::Name(uri))?;
        params.subject_alt_names.push(SanType::URI(uri_name));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if !params.subject_alt_names.iter().all(|n| matches!(n, SanType::URI(_))) {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, validity);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// A short, stable name for a PEM text (the first 16 bytes of its SHA-256, in hex): what a
/// Secret records of the CA that issued it, and what a pod template records of its certificate.
pub fn fingerprint(pem: &str) -> String {
    let hash = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, pem.as_bytes());
    hash.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// When the first certificate in `cert_pem` becomes valid and when it expires (Unix seconds);
/// `None` when the text holds no readable certificate.
pub fn validity(cert_pem: &str) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let validity = cert.validity();
    Some((validity.not_before.timestamp(), validity.not_after.timestamp()))
}

/// Valid from a minute ago (clocks drift) for `validity`.
fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::try_from(validity).unwrap_or(time::Duration::days(365));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_survives_its_pem_form_and_issues_leaves() {
        let ca = Authority::generate("granary test CA", Duration::from_secs(3600)).unwrap();
        let again = Authority::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        let leaf = again
            .issue(Role::Worker, "team/p", &["localhost", "127.0.0.1"], Duration::from_secs(60))
            .unwrap();
        assert!(leaf.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(leaf.key_pem.contains("PRIVATE KEY"));
        let (from, until) = validity(&leaf.cert_pem).unwrap();
        assert!((55..=65).contains(&(until - from - 60)), "a minute back for drift, then 60 s");
        assert_eq!(validity("not a certificate"), None);
    }
}
