//! `granary bench --workers N --tls`: how long a client takes to open a channel to the dispatcher
//! or a worker: TCP connect, the TLS handshake (with TLS) and the HTTP/2 preface, what a trainer
//! pays once per connection.

use anyhow::Context;
use granary_security::TlsMaterial;
use std::time::{Duration, Instant};
use tonic::transport::Endpoint;

/// Connections timed; the median is reported.
const SAMPLES: usize = 5;
/// Longest one connection may take before the measurement fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Median milliseconds to open a channel to `address` (`host:port`), over TLS with `tls`. Each
/// sample builds its TLS settings afresh, so every handshake is a full one, not a resumption.
pub async fn median_connect_ms(address: &str, tls: Option<&TlsMaterial>) -> anyhow::Result<f64> {
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let endpoint = endpoint(address, tls)?;
        let start = Instant::now();
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
            .await
            .map_err(|_| anyhow::anyhow!("no connection to {address} within {CONNECT_TIMEOUT:?}"))?
            .with_context(|| format!("cannot connect to {address}"))?;
        samples.push(start.elapsed().as_secs_f64() * 1e3);
        drop(channel);
    }
    Ok(median(&mut samples))
}

fn endpoint(address: &str, tls: Option<&TlsMaterial>) -> anyhow::Result<Endpoint> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .with_context(|| format!("`{address}` is not a host:port address"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        let host = endpoint.uri().host().unwrap_or("localhost").trim_matches(['[', ']']).to_string();
        endpoint = endpoint.tls_config(tls.client(&host)).context("the bench's TLS settings")?;
    }
    Ok(endpoint)
}

/// The median of `samples` (the mean of the middle two for an even count); 0 for none.
fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let mid = samples.len() / 2;
    if samples.len() % 2 == 1 { samples[mid] } else { (samples[mid - 1] + samples[mid]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let error = median_connect_ms(&address, None).await.unwrap_err();
        assert!(format!("{error:#}").contains(&address), "{error:#}");
    }
}
