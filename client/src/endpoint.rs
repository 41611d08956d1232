//! gRPC channels to the dispatcher and to workers, tuned for large streamed batches.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::ClientError;
use granary_security::TlsMaterial;

/// Limit on establishing a TCP connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Limit on each unary dispatcher call.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Initial HTTP/2 stream and connection windows: enough for a few large batch parts in flight.
const WINDOW_BYTES: u32 = 32 << 20;

/// Largest HTTP/2 frame the peer may send us.
const MAX_FRAME_BYTES: u32 = 1 << 20;

/// `http://host:port` (`https://` with `tls`) for `host:port`; addresses with a scheme are kept.
pub(crate) fn normalize(address: &str, tls: bool) -> String {
    let address = address.trim().trim_end_matches('/');
    let scheme = if tls { "https" } else { "http" };
    if address.contains("://") { address.to_owned() } else { format!("{scheme}://{address}") }
}

/// An endpoint for `address` with the data-plane transport settings, over TLS with `tls` (the
/// server's certificate must name the host dialled).
pub(crate) fn endpoint(address: &str, tls: Option<&TlsMaterial>) -> Result<Endpoint, ClientError> {
    let invalid = |reason: String| ClientError::InvalidAddress { address: address.to_owned(), reason };
    let uri = normalize(address, tls.is_some());
    let mut endpoint = Endpoint::from_shared(uri).map_err(|error| invalid(error.to_string()))?;
    if let Some(tls) = tls {
        let host = endpoint.uri().host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
        endpoint = endpoint.tls_config(tls.client(&host)).map_err(|error| invalid(error.to_string()))?;
    }
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_adaptive_window(true)
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10)))
}

/// Connects to `address` eagerly, within [`CONNECT_TIMEOUT`].
pub(crate) async fn connect(endpoint: &Endpoint) -> Result<Channel, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        // The causes carry the useful part ("connection refused"), each said once.
        Ok(Err(error)) => Err(granary_proto::error_text(&error)),
        Err(_) => Err(format!("no connection within {CONNECT_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_addresses() {
        assert_eq!(normalize("localhost:7070", false), "http://localhost:7070");
        assert_eq!(normalize("localhost:7070", true), "https://localhost:7070");
        assert_eq!(normalize("http://10.0.0.1:7070/", true), "http://10.0.0.1:7070");
        assert!(endpoint("localhost:7070", None).is_ok());
        assert!(matches!(endpoint("bad address:x", None), Err(ClientError::InvalidAddress { .. })));
    }
}
