//! The process's TLS cryptography: aws-lc-rs, the one provider every crate that links rustls
//! shares (rustls refuses to guess when more than one is compiled in), with TLS 1.3's
//! AES-128-GCM preferred. Batches are bulk data: AES-128 runs 10 rounds per block where AES-256
//! runs 14, and on the data plane the cipher is most of what TLS costs beyond copies. Both are
//! TLS 1.3's standard suites; the others stay offered for peers that want them.

use rustls::crypto::{CryptoProvider, aws_lc_rs};
use std::sync::Once;

/// Installs the process-wide provider, once; a provider installed earlier (by the embedding
/// program) is kept.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = provider().install_default();
    });
}

/// aws-lc-rs with the TLS 1.3 suites ordered AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305.
pub fn provider() -> CryptoProvider {
    let mut provider = aws_lc_rs::default_provider();
    let rank = |suite: &rustls::SupportedCipherSuite| match suite.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        _ => 2,
    };
    provider.cipher_suites.sort_by_key(rank);
    provider
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_gcm_comes_first_and_nothing_is_dropped() {
        let suites = provider().cipher_suites;
        assert_eq!(suites[0].suite(), rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(suites.len(), aws_lc_rs::default_provider().cipher_suites.len());
        install();
        let installed = CryptoProvider::get_default().expect("installed");
        assert_eq!(installed.cipher_suites[0].suite(), rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    }
}
