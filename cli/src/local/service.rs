//! Starting the local service: dispatcher, registration, and the worker processes.

use super::catalog::WorkerCatalog;
use anyhow::Context;
use granary_dispatcher::exposition::Exposition;
use granary_dispatcher::{Dispatcher, DispatcherConfig, ProcessPool, WorkerPool};
use granary_telemetry::MetricsServer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A running local service.
pub struct LocalService {
    /// The dispatcher.
    pub dispatcher: Dispatcher,
    /// Where it listens.
    pub address: SocketAddr,
    /// The pipeline's name.
    pub pipeline: String,
    /// The worker processes.
    pub pool: ProcessPool,
    stop: Option<oneshot::Sender<()>>,
    stop_metrics: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

/// What to start.
pub struct ServiceOptions {
    /// Address to serve the dispatcher API on (port 0 picks one).
    pub listen: SocketAddr,
    /// Journal URL or path.
    pub journal: Option<String>,
    /// Worker processes to start.
    pub workers: u32,
    /// Compute threads per worker (default: cores / workers).
    pub threads: Option<usize>,
    /// `--prefetch-bytes` for each worker.
    pub prefetch_bytes: String,
    /// `--normalize-on-worker` for each worker.
    pub normalize_on_worker: bool,
    /// Serve the dispatcher's metrics at `GET /metrics` here.
    pub metrics_addr: Option<SocketAddr>,
}

impl LocalService {
    /// Starts the dispatcher, registers `manifest`, and starts the workers.
    pub async fn start(
        manifest: &granary_crds::Manifest,
        options: &ServiceOptions,
    ) -> anyhow::Result<LocalService> {
        let config = DispatcherConfig { journal: options.journal.clone(), ..Default::default() };
        let dispatcher = Dispatcher::new(config, Arc::new(WorkerCatalog)).await?;
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        let address = listener.local_addr()?;
        let pipeline = manifest.pipeline.metadata.name.clone().unwrap_or_default();
        dispatcher.register(&pipeline, manifest).await?;
        let (stop, stopped) = oneshot::channel::<()>();
        let (stop_metrics, metrics_stopped) = oneshot::channel::<()>();
        if let Some(addr) = options.metrics_addr {
            let exposition = Arc::new(Exposition::new()?);
            let server = MetricsServer::bind(addr, exposition.registry()).await?;
            let d = dispatcher.clone();
            let server = server.with_refresh(Arc::new(move || exposition.refresh(&d)));
            server.spawn(async move { drop(metrics_stopped.await) });
        }
        let server = {
            let d = dispatcher.clone();
            tokio::spawn(async move {
                if let Err(e) = d.serve(listener, async { drop(stopped.await) }).await {
                    tracing::error!("dispatcher stopped: {e}");
                }
            })
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = options.threads.unwrap_or((cores / options.workers.max(1) as usize).max(1));
        let program = std::env::current_exe().context("cannot find the granary binary to start workers")?;
        let args = vec![
            "worker".to_string(),
            "--dispatcher".to_string(),
            address.to_string(),
            "--pipeline".to_string(),
            pipeline.clone(),
            "--threads".to_string(),
            threads.to_string(),
            "--prefetch-bytes".to_string(),
            options.prefetch_bytes.clone(),
        ];
        let mut args = args;
        if options.normalize_on_worker {
            args.push("--normalize-on-worker".to_string());
        }
        // Each worker would otherwise advertise, or serve metrics on, this process's address.
        let mut pool =
            ProcessPool::new(program, args).without_env(&["GRANARY_ADVERTISE", "GRANARY_METRICS_ADDR"]);
        pool.scale_to(options.workers).await?;
        Ok(LocalService {
            dispatcher,
            address,
            pipeline,
            pool,
            stop: Some(stop),
            stop_metrics: Some(stop_metrics),
            server,
        })
    }

    /// True once every job of the pipeline has all its declared consumers and they all
    /// delivered every epoch.
    pub fn done(&self) -> bool {
        let jobs = self.dispatcher.progress(&self.pipeline);
        !jobs.is_empty() && jobs.iter().all(|j| j.consumers >= j.declared && j.finished >= j.declared)
    }

    /// Stops the workers (they drain, for up to `grace`) and then the dispatcher, so that
    /// draining workers can still give their leases back.
    pub async fn stop(mut self, grace: Duration) {
        self.pool.stop_within(grace).await;
        for stop in [self.stop.take(), self.stop_metrics.take()].into_iter().flatten() {
            let _ = stop.send(());
        }
        let _ = self.server.await;
    }
}
