//! Stream capabilities: the dispatcher's signed permission for one consumer of one job of one
//! pipeline to stream batches from workers, until an expiry. The dispatcher signs with an Ed25519
//! key derived from the master key; workers hold only the public key, so a worker can check a
//! capability but never make one.
//!
//! Text form: `grc1.<payload>.<signature>`, both unpadded URL-safe base64; the payload is the
//! pipeline, the job, the consumer index and the expiry (Unix milliseconds), one per line.

use crate::key::MasterKey;
use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The label the signing key's seed is derived under.
const LABEL: &str = "granary stream capability v1";
/// Every capability starts with this.
const PREFIX: &str = "grc1";

/// What a capability allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// The pipeline (`namespace/name`).
    pub pipeline: String,
    /// The job.
    pub job: String,
    /// The consumer index within the job.
    pub consumer: u32,
    /// When it stops being valid, in Unix milliseconds.
    pub expires_ms: u64,
}

impl Capability {
    fn payload(&self) -> String {
        format!("{}\n{}\n{}\n{}", self.pipeline, self.job, self.consumer, self.expires_ms)
    }

    fn parse(payload: &str) -> Option<Capability> {
        let mut lines = payload.split('\n');
        let (Some(pipeline), Some(job), Some(consumer), Some(expires), None) =
            (lines.next(), lines.next(), lines.next(), lines.next(), lines.next())
        else {
            return None;
        };
        Some(Capability {
            pipeline: pipeline.to_string(),
            job: job.to_string(),
            consumer: consumer.parse().ok()?,
            expires_ms: expires.parse().ok()?,
        })
    }
}

/// Why a capability was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilityError {
    /// Not a capability.
    #[error("the stream capability is malformed; ask the dispatcher for one (RegisterClient)")]
    Malformed,
    /// Not signed by this deployment's dispatcher.
    #[error("the stream capability was not signed by this deployment's dispatcher")]
    BadSignature,
    /// Past its expiry.
    #[error("the stream capability expired {0} ms ago; the client renews it from the dispatcher")]
    Expired(u64),
    /// Signed, but for another pipeline, job or consumer than the request names.
    #[error("the stream capability is for {0}, not for this request")]
    Mismatch(String),
}

/// The dispatcher's side: makes capabilities.
pub struct CapabilitySigner {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for CapabilitySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilitySigner(…)")
    }
}

impl CapabilitySigner {
    /// The signer of the deployment whose master key is `key`.
    pub fn new(key: &MasterKey) -> CapabilitySigner {
        let seed = key.derive(LABEL);
        // A 32-byte seed is always a valid Ed25519 private key.
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .unwrap_or_else(|_| unreachable!("a 32-byte seed is a valid Ed25519 key"));
        CapabilitySigner { pair }
    }

    /// The public key workers check capabilities with.
    pub fn public_key(&self) -> Vec<u8> {
        self.pair.public_key().as_ref().to_vec()
    }

    /// The text form of `capability`, signed.
    pub fn sign(&self, capability: &Capability) -> String {
        let payload = capability.payload();
        let signature = self.pair.sign(payload.as_bytes());
        format!(
            "{PREFIX}.{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        )
    }
}

/// A worker's side: checks capabilities with the dispatcher's public key.
#[derive(Clone, Debug)]
pub struct CapabilityVerifier {
    public_key: Vec<u8>,
}

impl CapabilityVerifier {
    /// A verifier for the dispatcher whose public key is `public_key`.
    pub fn new(public_key: Vec<u8>) -> CapabilityVerifier {
        CapabilityVerifier { public_key }
    }

    /// What `text` allows, when the dispatcher signed it and it has not expired at `now_ms`
    /// (Unix milliseconds).
    pub fn verify(&self, text: &str, now_ms: u64) -> Result<Capability, CapabilityError> {
        let mut parts = text.trim().split('.');
        let (Some(PREFIX), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(CapabilityError::Malformed);
        };
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| CapabilityError::Malformed)?;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| CapabilityError::Malformed)?;
        UnparsedPublicKey::new(&ED25519, &self.public_key)
            .verify(&payload, &signature)
            .map_err(|_| CapabilityError::BadSignature)?;
        let payload = std::str::from_utf8(&payload).map_err(|_| CapabilityError::Malformed)?;
        let capability = Capability::parse(payload).ok_or(CapabilityError::Malformed)?;
        if capability.expires_ms <= now_ms {
            return Err(CapabilityError::Expired(now_ms - capability.expires_ms));
        }
        Ok(capability)
    }

    /// Checks `text` (as [`CapabilityVerifier::verify`]) and that it is for consumer `consumer`
    /// of job `job`.
    pub fn allows(
        &self,
        text: &str,
        now_ms: u64,
        job: &str,
        consumer: u32,
    ) -> Result<Capability, CapabilityError> {
        let capability = self.verify(text, now_ms)?;
        if capability.job != job || capability.consumer != consumer {
            return Err(CapabilityError::Mismatch(format!(
                "consumer {} of job `{}`",
                capability.consumer, capability.job
            )));
        }
        Ok(capability)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capability(expires_ms: u64) -> Capability {
        Capability { pipeline: "team/p".into(), job: "train".into(), consumer: 3, expires_ms }
    }

    #[test]
    fn a_signed_capability_is_accepted_until_it_expires() {
        let key = MasterKey::generate().unwrap();
        let signer = CapabilitySigner::new(&key);
        let verifier = CapabilityVerifier::new(signer.public_key());
        let text = signer.sign(&capability(1_000));
        assert_eq!(verifier.verify(&text, 999), Ok(capability(1_000)));
        assert_eq!(verifier.allows(&text, 999, "train", 3), Ok(capability(1_000)));
        assert_eq!(verifier.verify(&text, 1_250), Err(CapabilityError::Expired(250)));
        assert!(matches!(verifier.allows(&text, 999, "train", 2), Err(CapabilityError::Mismatch(_))));
        assert!(matches!(verifier.allows(&text, 999, "eval", 3), Err(CapabilityError::Mismatch(_))));
    }

    #[test]
    fn forged_and_foreign_capabilities_are_refused() {
        let key = MasterKey::generate().unwrap();
        let signer = CapabilitySigner::new(&key);
        let verifier = CapabilityVerifier::new(signer.public_key());
        let foreign = CapabilitySigner::new(&MasterKey::generate().unwrap()).sign(&capability(u64::MAX));
        assert_eq!(verifier.verify(&foreign, 0), Err(CapabilityError::BadSignature));
        // A valid signature over another payload: the consumer changed.
        let text = signer.sign(&capability(u64::MAX));
        let signature = text.rsplit('.').next().unwrap();
        let other = URL_SAFE_NO_PAD.encode(capability(u64::MAX).payload().replace("\n3\n", "\n4\n"));
        assert_eq!(
            verifier.verify(&format!("grc1.{other}.{signature}"), 0),
            Err(CapabilityError::BadSignature)
        );
        for bad in ["", "grc1", "grc1.a", "grc1.***.AAAA", "x.y.z"] {
            assert_eq!(verifier.verify(bad, 0), Err(CapabilityError::Malformed), "{bad:?}");
        }
        assert_eq!(CapabilitySigner::new(&key).public_key(), signer.public_key(), "derived, not random");
    }
}
