//! The worker process of the distributed data plane (see `docs/data-plane.md`).
//!
//! A worker serves the `Worker` gRPC service (`StreamBatches`) and, beside it, talks to the
//! dispatcher: it registers, heartbeats (renewing its leases and sending its metrics), leases
//! splits, runs each pipeline's engine on them, cuts the batches into the parts of each lease,
//! queues every part for its consumers with backpressure, and completes the split once its
//! consumers took it. On shutdown it drains: it stops leasing, finishes the leases it holds (up
//! to a timeout), returns the rest, and exits.
//!
//! - `agent`: registration, heartbeats, leases (`leases`), completion, drain;
//! - `producer`: one engine per pipeline generation, on its own thread;
//! - [`router`]: cutting a split's batches into lease parts;
//! - [`queues`]: the per-consumer queues behind the streams;
//! - [`server`]: the gRPC service;
//! - `metrics`: the figures sent with each heartbeat;
//! - [`exposition`]: the same figures for Prometheus, at `GET /metrics` on `metrics_addr`.

mod agent;
mod delivery;
pub mod exposition;
mod finish;
mod leases;
mod metrics;
mod pacing;
mod planned;
mod producer;
pub mod queues;
pub mod router;
pub mod server;

use crate::engine::EngineOptions;
use exposition::Exposition;
use granary_proto::MAX_MESSAGE_BYTES;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_security::Bearer;
use granary_telemetry::MetricsServer;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// How long the gRPC server may take to close its connections after the drain.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of a worker process.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Dispatcher address: `host:port` or `http://host:port`.
    pub dispatcher: String,
    /// Address to listen on for consumer streams; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Address consumers should connect to (`host:port`); by default the bound address.
    pub advertise: Option<String>,
    /// Serve only this pipeline; `None` serves any.
    pub pipeline: Option<String>,
    /// Engine settings (compute threads, prefetch budget).
    pub engine: EngineOptions,
    /// How long a drain waits for held leases before returning them.
    pub drain_timeout: Duration,
    /// Splits kept leased and computing, at least (at least 1); more while the engine runs dry
    /// waiting for leases, up to 16.
    pub leases_ahead: usize,
    /// Serve Prometheus metrics at `GET /metrics` on this address.
    pub metrics_addr: Option<SocketAddr>,
    /// TLS: the worker's certificate (for its `Worker` service), and the CA the dispatcher's
    /// certificate must chain to. `None`: plaintext both ways.
    pub tls: Option<granary_security::TlsMaterial>,
    /// The bearer token the worker presents to the dispatcher (a worker token of its pipeline).
    /// With one, the worker also requires a dispatcher-signed capability on every stream.
    pub token: Option<String>,
}

impl WorkerConfig {
    /// Defaults for a worker of the dispatcher at `dispatcher`: listens on `127.0.0.1:0`,
    /// advertises the bound address, serves any pipeline, leaves a final `float32`
    /// `image.normalize` to the clients (a quarter of the bytes on the wire), drains for 20 s,
    /// two leases ahead.
    pub fn new(dispatcher: impl Into<String>) -> WorkerConfig {
        WorkerConfig {
            dispatcher: dispatcher.into(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            advertise: None,
            pipeline: None,
            engine: EngineOptions {
                defer_normalize: true,
                finish_per_batch: false,
                ..EngineOptions::default()
            },
            drain_timeout: Duration::from_secs(20),
            leases_ahead: 2,
            metrics_addr: None,
            tls: None,
            token: None,
        }
    }
}

/// Why a worker could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        source: std::io::Error,
    },
    /// The dispatcher address is not a valid URI.
    #[error("invalid dispatcher address `{address}`: {message}")]
    Dispatcher {
        /// The address given.
        address: String,
        /// What is wrong with it.
        message: String,
    },
    /// The gRPC server failed.
    #[error("the worker's gRPC server failed: {0}")]
    Server(#[from] tonic::transport::Error),
    /// TLS is on without a certificate of the worker's own.
    #[error("the worker's TLS settings have no certificate and key of its own (tls.crt, tls.key)")]
    NoCertificate,
    /// The token cannot be sent.
    #[error(transparent)]
    Token(#[from] granary_security::BearerError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] granary_telemetry::TelemetryError),
    /// The metrics could not be registered.
    #[error("cannot register the worker's metrics: {0}")]
    Registry(#[from] granary_telemetry::prometheus::Error),
}

/// A worker whose listener is bound, ready to [`run`](WorkerService::run).
pub struct WorkerService {
    config: WorkerConfig,
    listener: TcpListener,
    local_addr: SocketAddr,
    advertise: String,
    metrics: Option<(MetricsServer, Arc<Exposition>)>,
}

impl WorkerService {
    /// Binds the listen address.
    pub async fn bind(config: WorkerConfig) -> Result<WorkerService, ServiceError> {
        let bind_error = |source| ServiceError::Bind { addr: config.listen, source };
        let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let advertise = match &config.advertise {
            Some(address) => address.clone(),
            None if local_addr.ip().is_unspecified() => {
                let address = SocketAddr::from((Ipv4Addr::LOCALHOST, local_addr.port())).to_string();
                tracing::warn!(
                    listen = %local_addr,
                    "listening on every interface without --advertise; advertising {address}, which only \
                     local consumers can reach"
                );
                address
            }
            None => local_addr.to_string(),
        };
        let metrics = match config.metrics_addr {
            Some(addr) => {
                let exposition = Arc::new(Exposition::new(config.pipeline.as_deref().unwrap_or_default())?);
                Some((MetricsServer::bind(addr, exposition.registry()).await?, exposition))
            }
            None => None,
        };
        Ok(WorkerService { config, listener, local_addr, advertise, metrics })
    }

    /// Where metrics are served, with `metrics_addr`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|(server, _)| server.local_addr())
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address registered with the dispatcher.
    pub fn advertised(&self) -> &str {
        &self.advertise
    }

    /// Serves streams and works for the dispatcher until `shutdown` completes, then drains.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServiceError> {
        let metrics_addr = self.metrics_addr();
        let WorkerService { config, listener, local_addr, advertise, metrics } = self;
        let (stop_metrics, metrics_stopped) = oneshot::channel::<()>();
        let exposition = metrics.map(|(server, exposition)| {
            server.spawn(async move { drop(metrics_stopped.await) });
            exposition
        });
        let client = connect(&config.dispatcher, config.tls.as_ref(), config.token.as_deref())?;
        let server_tls = match &config.tls {
            Some(tls) => Some(tls.server().ok_or(ServiceError::NoCertificate)?),
            None => None,
        };
        let queues = Arc::new(queues::Queues::new(queues::Capacity::default()));
        let (stop_server, server_stopped) = oneshot::channel();
        let gate = Arc::new(server::CapabilityGate::new(config.token.is_some()));
        let limits = Arc::new(server::StreamLimits::default());
        let api = server::WorkerApi::new(Arc::clone(&queues), config.pipeline.clone())
            .with_gate(Arc::clone(&gate))
            .with_limits(Arc::clone(&limits));
        let server = server::spawn(listener, api, server_tls, server_stopped)?;
        tracing::info!(
            listen = %local_addr,
            advertise = %advertise,
            dispatcher = %config.dispatcher,
            threads = config.engine.threads,
            prefetch_mib = config.engine.prefetch_bytes >> 20,
            "worker serving",
        );
        let metrics_address = match metrics_addr {
            // Listening on every interface: scrape it where consumers reach the worker.
            Some(addr) if addr.ip().is_unspecified() => {
                let host = advertise.rsplit_once(':').map_or(advertise.as_str(), |(host, _)| host);
                format!("{host}:{}", addr.port())
            }
            Some(addr) => addr.to_string(),
            None => String::new(),
        };
        let agent_config = agent::AgentConfig {
            metrics_address,
            advertise,
            pipeline: config.pipeline.clone().unwrap_or_default(),
            cores: u32::try_from(config.engine.threads.max(1)).unwrap_or(u32::MAX),
            engine: config.engine,
            leases_ahead: config.leases_ahead.max(1),
            drain_timeout: config.drain_timeout,
        };
        let (agent, events) =
            agent::Agent::new(agent_config, client, Arc::clone(&queues), exposition, gate, limits);
        agent.run(events, shutdown).await;
        // Every stream ends, so that the server can close its connections.
        queues.close();
        let _ = stop_server.send(());
        match tokio::time::timeout(SERVER_STOP_TIMEOUT, server).await {
            Ok(Ok(result)) => result?,
            Ok(Err(e)) => tracing::error!("the gRPC server task failed: {e}"),
            Err(_) => tracing::warn!("the gRPC server did not stop in time"),
        }
        let _ = stop_metrics.send(());
        tracing::info!("worker stopped");
        Ok(())
    }
}

/// Runs a worker: binds `config.listen`, serves the `Worker` service there, registers with the
/// dispatcher and works for it until `shutdown` completes, then drains and returns.
pub async fn serve(config: WorkerConfig, shutdown: impl Future<Output = ()>) -> Result<(), ServiceError> {
    WorkerService::bind(config).await?.run(shutdown).await
}

/// The worker's dispatcher client: a channel that sends the worker's token with each call.
pub(crate) type Dispatcher = DispatcherClient<InterceptedService<Channel, Bearer>>;

/// A lazily connected dispatcher client (over TLS with `tls`, presenting `token`): calls made
/// while the dispatcher is down fail fast and later calls reconnect.
fn connect(
    address: &str,
    tls: Option<&granary_security::TlsMaterial>,
    token: Option<&str>,
) -> Result<Dispatcher, ServiceError> {
    let bad = |message: String| ServiceError::Dispatcher { address: address.to_string(), message };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let uri = if address.contains("://") { address.to_string() } else { format!("{scheme}://{address}") };
    let mut endpoint = Endpoint::from_shared(uri).map_err(|e| bad(e.to_string()))?;
    if let Some(tls) = tls {
        let host = endpoint.uri().host().unwrap_or("localhost").to_string();
        endpoint = endpoint.tls_config(tls.client(&host)).map_err(|e| bad(e.to_string()))?;
    }
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    Ok(DispatcherClient::with_interceptor(endpoint.connect_lazy(), Bearer::new(token)?)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
