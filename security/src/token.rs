//! Bearer tokens: `gr1.<role>.<scope>.<mac>`, where the scope is a pipeline (`namespace/name`) or
//! `*`, and the mac is HMAC-SHA256 of role and scope under a key derived from the master key. A
//! token carries its own proof: checking one needs the master key and nothing stored, and a new
//! master key revokes every token at once.
//!
//! The operator puts each pipeline's trainer token in a Secret in the pipeline's namespace, so
//! Kubernetes RBAC on that Secret decides who may consume; each pipeline's worker token goes in a
//! Secret only its worker pods mount.

use crate::key::MasterKey;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The label the token key is derived under.
const LABEL: &str = "granary token v1";
/// Every token starts with this.
const PREFIX: &str = "gr1";
/// The scope that covers every pipeline.
pub const ANY: &str = "*";

/// Whose token it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The deployment's owner: the operator, or the user who ran `granary run`. May register and
    /// remove pipelines, and do anything a worker or trainer may.
    Owner,
    /// The workers of the pipeline in scope (`*`: of any pipeline, as `granary run` starts them).
    Worker,
    /// The trainers of the pipeline in scope: may consume it.
    Trainer,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Worker => "worker",
            Role::Trainer => "trainer",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        [Role::Owner, Role::Worker, Role::Trainer].into_iter().find(|r| r.name() == text)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a valid token says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Token {
    /// The holder's role.
    pub role: Role,
    /// The pipeline (`namespace/name`) it is for, or [`ANY`].
    pub scope: String,
}

impl Token {
    /// Whether the token covers pipeline `pipeline`.
    pub fn covers(&self, pipeline: &str) -> bool {
        self.scope == ANY || self.scope == pipeline
    }
}

/// Why a token was refused. The messages never echo the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a Granary token at all.
    #[error("the bearer token is not a Granary token (`gr1.<role>.<scope>.<signature>`)")]
    Malformed,
    /// Well formed, but not made with this deployment's key (forged, altered, or from another
    /// deployment or an earlier key).
    #[error("the bearer token's signature does not match this deployment's key")]
    BadSignature,
}

impl MasterKey {
    /// A token for `role` over `scope` (a pipeline's `namespace/name`, or [`ANY`]).
    pub fn mint(&self, role: Role, scope: &str) -> String {
        let scope = URL_SAFE_NO_PAD.encode(scope.as_bytes());
        let mac = self.mac(LABEL, format!("{}.{scope}", role.name()).as_bytes());
        format!("{PREFIX}.{}.{scope}.{}", role.name(), URL_SAFE_NO_PAD.encode(mac))
    }

    /// What `text` says, when this key made it.
    pub fn check(&self, text: &str) -> Result<Token, TokenError> {
        let mut parts = text.trim().split('.');
        let (Some(PREFIX), Some(role), Some(scope), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let role = Role::parse(role).ok_or(TokenError::Malformed)?;
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| TokenError::Malformed)?;
        let expected = self.mac(LABEL, format!("{}.{scope}", role.name()).as_bytes());
        aws_lc_rs::constant_time::verify_slices_are_equal(&mac, &expected)
            .map_err(|_| TokenError::BadSignature)?;
        let scope = URL_SAFE_NO_PAD.decode(scope).map_err(|_| TokenError::Malformed)?;
        let scope = String::from_utf8(scope).map_err(|_| TokenError::Malformed)?;
        Ok(Token { role, scope })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_role_and_scope() {
        let key = MasterKey::generate().unwrap();
        let text = key.mint(Role::Trainer, "team-a/imagenet");
        let token = key.check(&text).unwrap();
        assert_eq!(token, Token { role: Role::Trainer, scope: "team-a/imagenet".into() });
        assert!(token.covers("team-a/imagenet"));
        assert!(!token.covers("team-b/imagenet"));
        let owner = key.check(&key.mint(Role::Owner, ANY)).unwrap();
        assert!(owner.covers("anything/at-all"));
    }

    #[test]
    fn forged_altered_and_foreign_tokens_are_refused() {
        let key = MasterKey::generate().unwrap();
        let other = MasterKey::generate().unwrap();
        let text = key.mint(Role::Worker, "a/p");
        assert_eq!(other.check(&text), Err(TokenError::BadSignature), "another deployment's key");
        // The same signature under another role or scope.
        let mac = text.rsplit('.').next().unwrap();
        let scope = URL_SAFE_NO_PAD.encode("b/q");
        assert_eq!(key.check(&format!("gr1.worker.{scope}.{mac}")), Err(TokenError::BadSignature));
        let owner_scope = text.split('.').nth(2).unwrap();
        assert_eq!(key.check(&format!("gr1.owner.{owner_scope}.{mac}")), Err(TokenError::BadSignature));
        for bad in [
            "",
            "gr1",
            "gr1.worker.x",
            "gr2.worker.eA.AAAA",
            "gr1.root.eA.AAAA",
            "gr1.worker.eA.***",
            "a.b.c.d.e",
        ] {
            assert_eq!(key.check(bad), Err(TokenError::Malformed), "{bad:?}");
        }
    }
}
