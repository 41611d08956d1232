//! One control-plane host: the single place that starts the dispatcher (configuration, journal,
//! catalog), serves its gRPC API, its metrics endpoint (when asked), the autoscalers (one per
//! pipeline) and the worker pool it owns, and stops them in order. `granary run` and the
//! Kubernetes operator both host the control plane through [`ControlPlane`]; they differ only in
//! the pool and the catalog they pass in (and their options).

mod autoscalers;
#[cfg(test)]
mod tests;

pub use autoscalers::{Autoscalers, Autoscaling};

use crate::autoscaler::SharedPool;
use crate::catalog::Catalog;
use crate::exposition::Exposition;
use crate::pool::{PoolError, PoolFuture, ProcessPool, WorkerPool};
use crate::service::{Dispatcher, DispatcherConfig, DispatcherError};
use granary_telemetry::MetricsServer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The dispatcher's metrics.
#[derive(Clone)]
pub enum Metrics {
    /// None.
    Off,
    /// Served at this address: `GET /metrics` (rebuilt from the dispatcher at every scrape) and
    /// `GET /targets` (the workers' metrics endpoints, for Prometheus).
    Serve(SocketAddr),
    /// Reported through this exposition, which the caller serves (with probes of its own, say).
    Report(Arc<Exposition>),
}

/// What the host starts.
#[derive(Clone)]
pub struct HostOptions {
    /// The dispatcher's settings (journal, timing, cache budget).
    pub dispatcher: DispatcherConfig,
    /// Its metrics.
    pub metrics: Metrics,
}

/// A failure starting the control plane.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The dispatcher could not start, or its server failed.
    #[error(transparent)]
    Dispatcher(#[from] DispatcherError),
    /// The listener handed in has no address.
    #[error("the dispatcher's listener has no address: {0}")]
    Listener(std::io::Error),
    /// The metrics endpoint could not be set up.
    #[error("{0}")]
    Metrics(String),
    /// The worker pool could not start its workers.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The dispatcher's server task ended abnormally.
    #[error("the dispatcher task failed: {0}")]
    Task(String),
}

/// A pool the host owns: its workers drain when the host stops.
pub trait OwnedPool: WorkerPool {
    /// Stops every worker, letting each drain (finish or give back its leases) for up to
    /// `grace`.
    fn drain(&mut self, grace: Duration) -> PoolFuture<'_, ()>;
}

impl OwnedPool for ProcessPool {
    fn drain(&mut self, grace: Duration) -> PoolFuture<'_, ()> {
        Box::pin(async move {
            self.stop_within(grace).await;
            Ok(())
        })
    }
}

/// A running control plane.
pub struct ControlPlane {
    dispatcher: Dispatcher,
    address: SocketAddr,
    metrics_address: Option<SocketAddr>,
    autoscalers: Autoscalers,
    pool: Option<Arc<tokio::sync::Mutex<dyn OwnedPool>>>,
    metrics: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    stop_server: oneshot::Sender<()>,
    server: Option<JoinHandle<Result<(), DispatcherError>>>,
}

impl ControlPlane {
    /// Starts the dispatcher (replaying its journal), serves its API on `listener` and, as
    /// `options` ask, its metrics. No autoscaler runs and no pool is owned yet.
    pub async fn start(
        options: HostOptions,
        catalog: Arc<dyn Catalog>,
        listener: tokio::net::TcpListener,
    ) -> Result<ControlPlane, HostError> {
        let address = listener.local_addr().map_err(HostError::Listener)?;
        let dispatcher = Dispatcher::new(options.dispatcher, catalog).await?;
        let (exposition, served) = match options.metrics {
            Metrics::Off => (None, None),
            Metrics::Report(exposition) => (Some(exposition), None),
            Metrics::Serve(addr) => {
                let exposition = Arc::new(Exposition::new().map_err(|e| HostError::Metrics(e.to_string()))?);
                (Some(exposition.clone()), Some((addr, exposition)))
            }
        };
        let (metrics, metrics_address) = match served {
            Some((addr, exposition)) => {
                let (stop, task, bound) = serve_metrics(addr, exposition, &dispatcher).await?;
                (Some((stop, task)), Some(bound))
            }
            None => (None, None),
        };
        let (stop_server, stopped) = oneshot::channel::<()>();
        let server = {
            let d = dispatcher.clone();
            tokio::spawn(async move {
                // The server also ends when the dispatcher stops serving (its journal fenced).
                let halted = d.clone();
                let shutdown = async move {
                    tokio::select! {
                        _ = stopped => {}
                        _ = halted.halted() => {}
                    }
                };
                d.serve(listener, shutdown).await?;
                d.halt_reason().map_or(Ok(()), |why| Err(DispatcherError::Halted(why)))
            })
        };
        let autoscalers = Autoscalers::new(dispatcher.clone(), exposition);
        Ok(ControlPlane {
            dispatcher,
            address,
            metrics_address,
            autoscalers,
            pool: None,
            metrics,
            stop_server,
            server: Some(server),
        })
    }

    /// The dispatcher.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Where the gRPC API listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where the metrics are served, when they are.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_address
    }

    /// The autoscalers, to start and stop by pipeline name.
    pub fn autoscalers(&self) -> Autoscalers {
        self.autoscalers.clone()
    }

    /// Takes `pool` into the host's care and scales it to `initial` workers; it drains when the
    /// host stops. Returns it shared, for autoscalers to size.
    pub async fn own_pool<P: OwnedPool + 'static>(
        &mut self,
        mut pool: P,
        initial: u32,
    ) -> Result<SharedPool, HostError> {
        pool.scale_to(initial).await?;
        let pool = Arc::new(tokio::sync::Mutex::new(pool));
        self.pool = Some(pool.clone());
        Ok(pool)
    }

    /// Waits for the dispatcher's server to end by itself, which it does only when it fails or
    /// the dispatcher stops serving (its journal fenced: [`DispatcherError::Halted`]), until
    /// [`ControlPlane::stop`]; pending forever once it ended.
    pub async fn served(&mut self) -> Result<(), HostError> {
        let Some(server) = &mut self.server else { return std::future::pending().await };
        let ended = server.await;
        self.server = None;
        match ended {
            Ok(served) => served.map_err(HostError::from),
            Err(e) => Err(HostError::Task(e.to_string())),
        }
    }

    /// Stops, in order: the autoscalers, then the owned pool (its workers drain for up to
    /// `grace`, while the dispatcher still takes their leases back), then the metrics endpoint
    /// and the dispatcher's server (each given up to `grace` to finish).
    pub async fn stop(self, grace: Duration) {
        self.autoscalers.stop_all(grace).await;
        if let Some(pool) = &self.pool
            && let Err(e) = pool.lock().await.drain(grace).await
        {
            tracing::warn!("cannot drain the worker pool: {e}");
        }
        if let Some((stop, task)) = self.metrics {
            let _ = stop.send(());
            let _ = tokio::time::timeout(grace, task).await;
        }
        let _ = self.stop_server.send(());
        if let Some(server) = self.server {
            match tokio::time::timeout(grace, server).await {
                Ok(Ok(Err(e))) => tracing::error!("dispatcher stopped: {e}"),
                Ok(Err(e)) => tracing::error!("the dispatcher task failed: {e}"),
                Ok(Ok(Ok(()))) | Err(_) => {}
            }
        }
    }
}

/// Binds the metrics endpoint at `addr`, refreshed from `dispatcher` at every scrape, with the
/// workers' endpoints at `/targets`. Returns its stop, its task and the bound address.
async fn serve_metrics(
    addr: SocketAddr,
    exposition: Arc<Exposition>,
    dispatcher: &Dispatcher,
) -> Result<(oneshot::Sender<()>, JoinHandle<()>, SocketAddr), HostError> {
    let server = MetricsServer::bind(addr, exposition.registry())
        .await
        .map_err(|e| HostError::Metrics(e.to_string()))?;
    let bound = server.local_addr().unwrap_or(addr);
    let d = dispatcher.clone();
    let server = server.with_refresh(Arc::new(move || exposition.refresh(&d)));
    let d = dispatcher.clone();
    let server = server.with_targets(Arc::new(move || d.metrics_targets()));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = server.spawn(async move { drop(stopped.await) });
    Ok((stop, task, bound))
}
