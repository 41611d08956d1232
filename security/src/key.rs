//! The master key of one Granary deployment: 32 random bytes, kept by the dispatcher (and the
//! operator, which hosts it) in a Secret or a file. Everything secret is derived from it with
//! HMAC-SHA256 under a distinct label, so one key rotates every token and capability at once.

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Bytes in a master key.
pub const KEY_BYTES: usize = 32;

/// Why a master key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The text is not a key.
    #[error("a master key is {KEY_BYTES} bytes in unpadded URL-safe base64 (43 characters); {0}")]
    Malformed(String),
    /// No random bytes could be drawn.
    #[error("cannot draw random bytes for a key")]
    Random,
}

/// A deployment's master key.
#[derive(Clone)]
pub struct MasterKey {
    bytes: [u8; KEY_BYTES],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(…)")
    }
}

impl MasterKey {
    /// A new random key.
    pub fn generate() -> Result<MasterKey, KeyError> {
        let mut bytes = [0u8; KEY_BYTES];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| KeyError::Random)?;
        Ok(MasterKey { bytes })
    }

    /// The key from its text form ([`MasterKey::encode`]); surrounding whitespace (a trailing
    /// newline in a file or Secret) is ignored.
    pub fn decode(text: &str) -> Result<MasterKey, KeyError> {
        let raw = URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|e| KeyError::Malformed(format!("it does not decode: {e}")))?;
        let bytes: [u8; KEY_BYTES] = raw
            .try_into()
            .map_err(|raw: Vec<u8>| KeyError::Malformed(format!("it holds {} bytes", raw.len())))?;
        Ok(MasterKey { bytes })
    }

    /// The key as text, to store in a Secret or a file.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.bytes)
    }

    /// HMAC-SHA256 of `message` under the key derived for `label`.
    pub(crate) fn mac(&self, label: &str, message: &[u8]) -> [u8; 32] {
        let derived = self.derive(label);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &derived);
        let tag = hmac::sign(&key, message);
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// The 32 bytes derived from the key for `label`: distinct labels give independent keys.
    pub(crate) fn derive(&self, label: &str) -> [u8; 32] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.bytes);
        let tag = hmac::sign(&key, label.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_survives_its_text_form_and_bad_text_is_refused() {
        let key = MasterKey::generate().unwrap();
        let again = MasterKey::decode(&format!("{}\n", key.encode())).unwrap();
        assert_eq!(key.bytes, again.bytes);
        assert_ne!(key.bytes, MasterKey::generate().unwrap().bytes, "keys are random");
        let short = MasterKey::decode("abcd").unwrap_err().to_string();
        assert!(short.contains("holds 3 bytes"), "{short}");
        assert!(MasterKey::decode("not base64!").is_err());
    }

    #[test]
    fn labels_derive_independent_keys() {
        let key = MasterKey::generate().unwrap();
        assert_ne!(key.derive("a"), key.derive("b"));
        assert_eq!(key.mac("a", b"m"), key.mac("a", b"m"));
        assert_ne!(key.mac("a", b"m"), key.mac("b", b"m"));
    }
}
