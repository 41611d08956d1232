//! Readiness probes: `tcpSocket` (a TCP connect to the mapped port on 127.0.0.1) and `httpGet`
//! (a plain-HTTP GET answered with 200–399). `exec` and HTTPS probes are not supported: such a
//! container never becomes ready, and its status says why. Liveness and startup probes are
//! ignored.

use super::ports::PortMap;
use k8s_openapi::api::core::v1::Container;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

/// What a probe does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// No readiness probe: ready once running.
    Always,
    /// Connect to 127.0.0.1:port.
    Tcp(u16),
    /// GET `path` from 127.0.0.1:port.
    Http(u16, String),
    /// A probe this agent cannot run, with the reason.
    Unsupported(String),
}

/// The readiness of one container, probed on the schedule of its `readinessProbe`.
#[derive(Clone, Debug)]
pub struct Prober {
    /// What each probe does.
    pub check: Check,
    period: Duration,
    initial_delay: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    streak: (u32, u32),
    ready: bool,
    next: Instant,
}

fn seconds(value: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(value.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0).unwrap_or(default))
}

impl Prober {
    /// The prober of `container`'s readiness probe, ports resolved through `ports`.
    pub fn new(container: &Container, ports: &PortMap) -> Self {
        let probe = container.readiness_probe.as_ref();
        let check = match probe {
            None => Check::Always,
            Some(p) => match (&p.tcp_socket, &p.http_get, &p.exec) {
                (Some(tcp), _, _) => match ports.resolve(container, &tcp.port) {
                    Some(port) => Check::Tcp(port),
                    None => {
                        Check::Unsupported(format!("readiness probe port {:?} is not declared", tcp.port))
                    }
                },
                (_, Some(http), _) if http.scheme.as_deref().unwrap_or("HTTP") != "HTTP" => {
                    Check::Unsupported("HTTPS readiness probes are not supported by granary-e2e-node".into())
                }
                (_, Some(http), _) => match ports.resolve(container, &http.port) {
                    Some(port) => Check::Http(port, http.path.clone().unwrap_or_else(|| "/".into())),
                    None => {
                        Check::Unsupported(format!("readiness probe port {:?} is not declared", http.port))
                    }
                },
                (_, _, Some(_)) => {
                    Check::Unsupported("exec readiness probes are not supported by granary-e2e-node".into())
                }
                _ => Check::Unsupported(
                    "this readiness probe kind is not supported by granary-e2e-node".into(),
                ),
            },
        };
        let thresholds = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0);
        Self {
            check,
            period: seconds(probe.and_then(|p| p.period_seconds), 10),
            initial_delay: Duration::from_secs(
                probe.and_then(|p| p.initial_delay_seconds).and_then(|v| u64::try_from(v).ok()).unwrap_or(0),
            ),
            timeout: seconds(probe.and_then(|p| p.timeout_seconds), 1),
            success_threshold: thresholds(probe.and_then(|p| p.success_threshold)).unwrap_or(1),
            failure_threshold: thresholds(probe.and_then(|p| p.failure_threshold)).unwrap_or(3),
            streak: (0, 0),
            ready: false,
            next: Instant::now(),
        }
    }

    /// Starts over for a container (re)started at `started`: not ready until a probe succeeds
    /// (ready at once without a probe).
    pub fn restart(&mut self, started: Instant) {
        self.ready = self.check == Check::Always;
        self.streak = (0, 0);
        self.next = started + self.initial_delay;
    }

    /// Whether the container passes its readiness probe (it must also be running).
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Why the container can never become ready, if so.
    pub fn note(&self) -> Option<String> {
        match &self.check {
            Check::Unsupported(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Whether a probe is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        matches!(self.check, Check::Tcp(_) | Check::Http(..)) && now >= self.next
    }

    /// Records a probe's outcome at `now` and schedules the next one.
    pub fn record(&mut self, ok: bool, now: Instant) {
        self.streak = if ok { (self.streak.0 + 1, 0) } else { (0, self.streak.1 + 1) };
        if ok && self.streak.0 >= self.success_threshold {
            self.ready = true;
        }
        if !ok && self.streak.1 >= self.failure_threshold {
            self.ready = false;
        }
        self.next = now + self.period;
    }

    /// Runs one probe, bounded by the probe's timeout.
    pub async fn probe(&self) -> bool {
        let attempt = async {
            match &self.check {
                Check::Always => true,
                Check::Unsupported(_) => false,
                Check::Tcp(port) => TcpStream::connect(("127.0.0.1", *port)).await.is_ok(),
                Check::Http(port, path) => http_ok(*port, path).await.unwrap_or(false),
            }
        };
        timeout(self.timeout, attempt).await.unwrap_or(false)
    }
}

/// Whether `GET path` on 127.0.0.1:port answers with a status from 200 to 399.
async fn http_ok(port: u16, path: &str) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.20\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let code = line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok());
    Ok(line.starts_with("HTTP/") && code.is_some_and(|c| (200..400).contains(&c)))
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
