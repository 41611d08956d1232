//! The HTTP endpoint: `GET /metrics`, the Kubernetes probes, and Prometheus HTTP service
//! discovery.

use crate::render;
use prometheus::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// A failure serving metrics.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The address could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("the metrics server failed: {0}")]
    Serve(std::io::Error),
}

/// Called before each scrape, to bring gauges read from live state up to date.
pub type Refresh = Arc<dyn Fn() + Send + Sync>;

/// Whether the process is ready for traffic, asked by `GET /readyz`.
pub type Readiness = Arc<dyn Fn() -> bool + Send + Sync>;

/// The `host:port` metrics endpoints to list for Prometheus' service discovery.
pub type Targets = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// A bound metrics endpoint, ready to serve.
pub struct MetricsServer {
    listener: tokio::net::TcpListener,
    registry: Registry,
    refresh: Option<Refresh>,
    readiness: Option<Readiness>,
    targets: Option<Targets>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port) for `registry`.
    pub async fn bind(addr: SocketAddr, registry: Registry) -> Result<MetricsServer, TelemetryError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| TelemetryError::Bind { addr, source })?;
        Ok(MetricsServer { listener, registry, refresh: None, readiness: None, targets: None })
    }

    /// Calls `refresh` before rendering each scrape.
    pub fn with_refresh(self, refresh: Refresh) -> MetricsServer {
        MetricsServer { refresh: Some(refresh), ..self }
    }

    /// Also serves Kubernetes probes: `GET /healthz` (200 while the process serves) and
    /// `GET /readyz` (200 while `ready` says so, else 503).
    pub fn with_probes(self, ready: Readiness) -> MetricsServer {
        MetricsServer { readiness: Some(ready), ..self }
    }

    /// Also serves `GET /targets`: Prometheus HTTP service discovery (`http_sd_configs`) listing
    /// this endpoint and what `targets` returns, so one scrape configuration finds every process
    /// of a `granary run`.
    pub fn with_targets(self, targets: Targets) -> MetricsServer {
        MetricsServer { targets: Some(targets), ..self }
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves `GET /metrics` until `shutdown` completes.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), TelemetryError> {
        let registry = self.registry;
        let refresh = self.refresh;
        // Refreshing and rendering happen under one lock, so that concurrent scrapes never see
        // a registry half rebuilt.
        let scraping = Arc::new(std::sync::Mutex::new(()));
        let mut app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let text = {
                    let _scrape = scraping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(refresh) = &refresh {
                        refresh();
                    }
                    render(&registry)
                };
                async move { ([(axum::http::header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text) }
            }),
        );
        if let Some(targets) = self.targets {
            let own = self.listener.local_addr().ok().map(|a| a.to_string());
            app = app.route(
                "/targets",
                axum::routing::get(move || {
                    let mut all: Vec<String> = own.iter().cloned().collect();
                    all.extend(targets());
                    all.dedup();
                    let body = serde_json::json!([{ "targets": all, "labels": {} }]).to_string();
                    async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }
                }),
            );
        }
        if let Some(ready) = self.readiness {
            use axum::http::StatusCode;
            app = app.route("/healthz", axum::routing::get(|| async { (StatusCode::OK, "ok\n") })).route(
                "/readyz",
                axum::routing::get(move || {
                    let ready = ready();
                    async move {
                        if ready {
                            (StatusCode::OK, "ready\n")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                        }
                    }
                }),
            );
        }
        axum::serve(self.listener, app).with_graceful_shutdown(shutdown).await.map_err(TelemetryError::Serve)
    }

    /// Serves in a background task until `shutdown` completes, logging a failure.
    pub fn spawn(self, shutdown: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if let Err(e) = self.serve(shutdown).await {
                tracing::error!("{e}");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{IntCounter, Opts};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_the_registry_in_the_text_format() {
        let registry = Registry::new();
        let counter = IntCounter::with_opts(Opts::new("granary_test_things_total", "Things.")).unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc_by(2);
        let server = MetricsServer::bind(([127, 0, 0, 1], 0).into(), registry).await.unwrap();
        let server = server.with_refresh(Arc::new(move || counter.inc()));
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = server.spawn(async move { drop(stopped.await) });
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("text/plain; version=0.0.4"), "{response}");
        assert!(response.contains("# TYPE granary_test_things_total counter"), "{response}");
        assert!(response.contains("granary_test_things_total 3"), "{response}");
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn targets_list_this_endpoint_and_the_others() {
        let server = MetricsServer::bind(([127, 0, 0, 1], 0).into(), Registry::new())
            .await
            .unwrap()
            .with_targets(Arc::new(|| vec!["127.0.0.1:1".to_string()]));
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = server.spawn(async move { drop(stopped.await) });
        let response = get(addr, "/targets").await;
        let body = response.split("\r\n\r\n").nth(1).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!([{ "targets": [addr.to_string(), "127.0.0.1:1"], "labels": {} }])
        );
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn probes_report_liveness_and_the_readiness_asked_for() {
        let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ready.clone();
        let server = MetricsServer::bind(([127, 0, 0, 1], 0).into(), Registry::new())
            .await
            .unwrap()
            .with_probes(Arc::new(move || flag.load(std::sync::atomic::Ordering::Relaxed)));
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = server.spawn(async move { drop(stopped.await) });
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        ready.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_taken_port_is_a_clear_error() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let Err(e) = MetricsServer::bind(addr, Registry::new()).await else { panic!("bound twice") };
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
