//! Who made a gRPC request: a bearer token in the `authorization` header (`Bearer <token>`), or
//! else a client certificate the TLS handshake already checked against the CA, whose
//! `urn:granary:<role>:<scope>` name says the role. A token that is presented must be valid: a
//! bad one is refused, not ignored in favour of the certificate.

use crate::authority::URI_PREFIX;
use crate::key::MasterKey;
use crate::token::{ANY, Role, Token};
use tonic::Status;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The header a bearer token travels in.
pub const AUTHORIZATION: &str = "authorization";

/// An authenticated caller: its role, and the pipeline it acts for (or [`ANY`]).
pub type Principal = Token;

/// Authenticates requests with the deployment's master key.
#[derive(Clone, Debug)]
pub struct Authenticator {
    key: MasterKey,
}

impl Authenticator {
    /// Checks tokens made with `key`.
    pub fn new(key: MasterKey) -> Authenticator {
        Authenticator { key }
    }

    /// Who made `request`, or UNAUTHENTICATED saying what to present.
    pub fn principal<T>(&self, request: &tonic::Request<T>) -> Result<Principal, Status> {
        if let Some(value) = request.metadata().get(AUTHORIZATION) {
            let value = value
                .to_str()
                .map_err(|_| Status::unauthenticated("the `authorization` header is not text"))?;
            let Some(token) = value.strip_prefix("Bearer ") else {
                return Err(Status::unauthenticated("the `authorization` header must be `Bearer <token>`"));
            };
            return self.key.check(token).map_err(|e| Status::unauthenticated(e.to_string()));
        }
        if let Some(certs) = request.peer_certs()
            && let Some(principal) = certs.first().and_then(|der| from_certificate(der))
        {
            return Ok(principal);
        }
        Err(Status::unauthenticated(
            "no credentials: present this pipeline's trainer token (`authorization: Bearer <token>`, \
             from the pipeline's Secret or GRANARY_TOKEN) or a client certificate from the deployment's CA",
        ))
    }
}

/// The principal a (CA-checked) certificate names, when it names one.
pub fn from_certificate(der: &[u8]) -> Option<Principal> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let names = cert.subject_alternative_name().ok()??;
    names.value.general_names.iter().find_map(|name| match name {
        GeneralName::URI(uri) => parse_uri(uri),
        _ => None,
    })
}

fn parse_uri(uri: &str) -> Option<Principal> {
    let rest = uri.strip_prefix(URI_PREFIX)?;
    let (role, scope) = rest.split_once(':')?;
    let role = match role {
        "owner" => Role::Owner,
        "worker" => Role::Worker,
        "trainer" => Role::Trainer,
        _ => return None,
    };
    (!scope.is_empty()).then(|| Token { role, scope: if scope == ANY { ANY.into() } else { scope.into() } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::Authority;
    use std::time::Duration;

    #[test]
    fn a_certificate_names_its_role_and_scope() {
        let ca = Authority::generate("test", Duration::from_secs(60)).unwrap();
        let leaf = ca.issue(Role::Worker, "team/p", &[], Duration::from_secs(60)).unwrap();
        let der = rustls_pemfile_der(&leaf.cert_pem);
        assert_eq!(from_certificate(&der), Some(Token { role: Role::Worker, scope: "team/p".into() }));
        assert_eq!(parse_uri("urn:granary:root:*"), None);
        assert_eq!(parse_uri("urn:granary:owner:"), None);
        assert_eq!(parse_uri("https://example.com"), None);
    }

    #[test]
    fn a_request_is_authenticated_by_its_token_and_a_bad_token_is_refused() {
        let key = MasterKey::generate().unwrap();
        let auth = Authenticator::new(key.clone());
        let mut request = tonic::Request::new(());
        let status = auth.principal(&request).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let token = key.mint(Role::Trainer, "a/b");
        request.metadata_mut().insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        assert_eq!(auth.principal(&request).unwrap(), Token { role: Role::Trainer, scope: "a/b".into() });
        let foreign = MasterKey::generate().unwrap().mint(Role::Owner, ANY);
        request.metadata_mut().insert(AUTHORIZATION, format!("Bearer {foreign}").parse().unwrap());
        assert_eq!(auth.principal(&request).unwrap_err().code(), tonic::Code::Unauthenticated);
        request.metadata_mut().insert(AUTHORIZATION, token.parse().unwrap());
        assert_eq!(
            auth.principal(&request).unwrap_err().code(),
            tonic::Code::Unauthenticated,
            "no `Bearer `"
        );
    }

    /// The DER of the first certificate in `pem`.
    fn rustls_pemfile_der(pem: &str) -> Vec<u8> {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD.decode(body).unwrap()
    }
}
