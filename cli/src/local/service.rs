//! Starting the local service: dispatcher, registration, the worker processes and, when the pool
//! is sized automatically, the autoscaler.

use super::catalog::WorkerCatalog;
use anyhow::Context;
use granary_dispatcher::autoscaler::{Autoscaler, Scaling, SharedPool};
use granary_dispatcher::exposition::Exposition;
use granary_dispatcher::{Dispatcher, DispatcherConfig, ProcessPool, WorkerPool};
use granary_policies::{GranaryConfig, GranaryPolicy, PoolConfig};
use granary_telemetry::MetricsServer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How many workers the local service runs.
#[derive(Clone, Debug)]
pub enum Sizing {
    /// Exactly this many.
    Fixed(u32),
    /// Between the bounds of `pool`, as the autoscaler decides every `period`, starting at the
    /// lower bound.
    Auto {
        /// Bounds, batch size and prices.
        pool: PoolConfig,
        /// How often the policy evaluates.
        period: Duration,
    },
}

impl Sizing {
    /// Workers to start with.
    pub fn initial(&self) -> u32 {
        match self {
            Sizing::Fixed(n) => *n,
            Sizing::Auto { pool, .. } => pool.lower(),
        }
    }
}

/// A running local service.
pub struct LocalService {
    /// The dispatcher.
    pub dispatcher: Dispatcher,
    /// Where it listens.
    pub address: SocketAddr,
    /// The pipeline's name.
    pub pipeline: String,
    pool: Arc<tokio::sync::Mutex<ProcessPool>>,
    scaling: Option<Scaling>,
    stops: Vec<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

/// What to start.
pub struct ServiceOptions {
    /// Address to serve the dispatcher API on (port 0 picks one).
    pub listen: SocketAddr,
    /// Journal URL or path.
    pub journal: Option<String>,
    /// Worker processes to run.
    pub sizing: Sizing,
    /// Compute threads per worker (default: cores / workers for a fixed count; every core for
    /// an autoscaled pool, which starts small and must not start slow).
    pub threads: Option<usize>,
    /// `--prefetch-bytes` for each worker.
    pub prefetch_bytes: String,
    /// `--normalize-on-worker` for each worker.
    pub normalize_on_worker: bool,
    /// Serve the dispatcher's metrics at `GET /metrics` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Store-wide budget of the cache stores in use.
    pub cache_max_bytes: Option<u64>,
}

impl ServiceOptions {
    /// Compute threads each worker process runs.
    pub fn worker_threads(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.threads.unwrap_or(match self.sizing {
            Sizing::Fixed(n) => (cores / n.max(1) as usize).max(1),
            Sizing::Auto { .. } => cores,
        })
    }
}

impl LocalService {
    /// Starts the dispatcher, registers `manifest`, and starts the workers (and the autoscaler).
    pub async fn start(
        manifest: &granary_crds::Manifest,
        options: &ServiceOptions,
    ) -> anyhow::Result<LocalService> {
        let config = DispatcherConfig {
            journal: options.journal.clone(),
            cache_max_bytes: options.cache_max_bytes,
            ..Default::default()
        };
        let dispatcher = Dispatcher::new(config, Arc::new(WorkerCatalog)).await?;
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        let address = listener.local_addr()?;
        let pipeline = manifest.pipeline.metadata.name.clone().unwrap_or_default();
        dispatcher.register(&pipeline, manifest).await?;
        let mut stops = Vec::new();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = {
            let d = dispatcher.clone();
            tokio::spawn(async move {
                if let Err(e) = d.serve(listener, async { drop(stopped.await) }).await {
                    tracing::error!("dispatcher stopped: {e}");
                }
            })
        };
        stops.push(stop);
        let program = std::env::current_exe().context("cannot find the granary binary to start workers")?;
        let mut args = vec![
            "worker".to_string(),
            "--dispatcher".to_string(),
            address.to_string(),
            "--pipeline".to_string(),
            pipeline.clone(),
            "--threads".to_string(),
            options.worker_threads().to_string(),
            "--prefetch-bytes".to_string(),
            options.prefetch_bytes.clone(),
        ];
        if options.normalize_on_worker {
            args.push("--normalize-on-worker".to_string());
        }
        if let Some(addr) = options.metrics_addr {
            // Each worker serves its own metrics on a free port of the same interface; the
            // dispatcher lists them at `/targets` for Prometheus.
            args.push("--metrics-addr".to_string());
            args.push(SocketAddr::new(addr.ip(), 0).to_string());
        }
        // Each worker would otherwise advertise, or serve metrics on, this process's address.
        let mut pool =
            ProcessPool::new(program, args).without_env(&["GRANARY_ADVERTISE", "GRANARY_METRICS_ADDR"]);
        pool.scale_to(options.sizing.initial()).await?;
        let pool = Arc::new(tokio::sync::Mutex::new(pool));
        let scaling = match &options.sizing {
            Sizing::Fixed(_) => None,
            Sizing::Auto { pool: bounds, period } => {
                let shared: SharedPool = pool.clone();
                let policy = GranaryPolicy::new(GranaryConfig::for_period(period.as_secs_f64()));
                let autoscaler = Autoscaler::new(
                    dispatcher.clone(),
                    &pipeline,
                    Box::new(policy),
                    shared,
                    bounds.clone(),
                    *period,
                    bounds.lower(),
                );
                let scaling = autoscaler.scaling();
                let (stop, stopped) = oneshot::channel::<()>();
                tokio::spawn(autoscaler.run(async move { drop(stopped.await) }));
                stops.insert(0, stop);
                Some(scaling)
            }
        };
        if let Some(addr) = options.metrics_addr {
            let exposition = Exposition::new()?;
            match (&scaling, &options.sizing) {
                (Some(scaling), _) => exposition.track_scaling(&pipeline, scaling.clone()),
                (None, sizing) => exposition.track_fixed(&pipeline, sizing.initial()),
            }
            let exposition = Arc::new(exposition);
            let server = MetricsServer::bind(addr, exposition.registry()).await?;
            let d = dispatcher.clone();
            let server = server.with_refresh(Arc::new(move || exposition.refresh(&d)));
            let d = dispatcher.clone();
            let server = server.with_targets(Arc::new(move || d.metrics_targets()));
            let (stop, stopped) = oneshot::channel::<()>();
            server.spawn(async move { drop(stopped.await) });
            stops.push(stop);
        }
        Ok(LocalService { dispatcher, address, pipeline, pool, scaling, stops, server })
    }

    /// The autoscaler's report, when the pool is sized automatically.
    pub fn scaling(&self) -> Option<Scaling> {
        self.scaling.clone()
    }

    /// True once every job of the pipeline has all its declared consumers and they all
    /// delivered every epoch.
    pub fn done(&self) -> bool {
        let jobs = self.dispatcher.progress(&self.pipeline);
        !jobs.is_empty() && jobs.iter().all(|j| j.consumers >= j.declared && j.finished >= j.declared)
    }

    /// Stops the autoscaler, then the workers (they drain, for up to `grace`), then the
    /// dispatcher, so that draining workers can still give their leases back.
    pub async fn stop(mut self, grace: Duration) {
        let mut stops = std::mem::take(&mut self.stops).into_iter();
        if self.scaling.is_some()
            && let Some(autoscaler) = stops.next()
        {
            let _ = autoscaler.send(());
        }
        self.pool.lock().await.stop_within(grace).await;
        for stop in stops {
            let _ = stop.send(());
        }
        let _ = self.server.await;
    }
}
