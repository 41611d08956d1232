//! Starting the local service on the control-plane host: the dispatcher, registration, the worker
//! processes as the host's pool and, when the pool is sized automatically, the autoscaler.

use super::catalog::WorkerCatalog;
use anyhow::Context;
use granary_dispatcher::autoscaler::Scaling;
use granary_dispatcher::host::{Autoscaling, ControlPlane, HostOptions, Metrics};
use granary_dispatcher::{Dispatcher, DispatcherConfig, ProcessPool};
use granary_policies::PoolConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
    plane: ControlPlane,
    scaling: Option<Scaling>,
    /// The run's credentials, with `tls`.
    credentials: Option<super::secure::Credentials>,
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
    /// The Python interpreter of `python.map` stages, passed on to the workers.
    pub python: Option<std::path::PathBuf>,
    /// `--normalize-on-worker` for each worker.
    pub normalize_on_worker: bool,
    /// Serve the dispatcher's metrics at `GET /metrics` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Store-wide budget of the cache stores in use.
    pub cache_max_bytes: Option<u64>,
    /// TLS and authentication on every endpoint, with credentials made for this run.
    pub tls: bool,
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
        LocalService::start_kept(manifest, options, None).await
    }

    /// [`LocalService::start`], with the credentials of a run with `tls` kept in `kept`
    /// (`granary run --credentials`) rather than made fresh.
    pub async fn start_kept(
        manifest: &granary_crds::Manifest,
        options: &ServiceOptions,
        kept: Option<&std::path::Path>,
    ) -> anyhow::Result<LocalService> {
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("cannot listen on {}", options.listen))?;
        let pipeline = manifest.pipeline.metadata.name.clone().unwrap_or_default();
        let credentials =
            options.tls.then(|| super::secure::Credentials::make(kept, &pipeline)).transpose()?;
        let host = HostOptions {
            dispatcher: DispatcherConfig {
                journal: options.journal.clone(),
                cache_max_bytes: options.cache_max_bytes,
                auth_key: credentials.as_ref().map(|c| c.key.clone()),
                tls: credentials.as_ref().map(|c| c.dispatcher.clone()),
                ..Default::default()
            },
            metrics: options.metrics_addr.map_or(Metrics::Off, Metrics::Serve),
        };
        let mut plane = ControlPlane::start(host, Arc::new(WorkerCatalog::default()), listener).await?;
        let dispatcher = plane.dispatcher().clone();
        let address = plane.address();
        let started = match dispatcher.register(&pipeline, manifest).await {
            Ok(_) => match worker_processes(options, address, &pipeline, credentials.as_ref()) {
                Ok(workers) => {
                    plane.own_pool(workers, options.sizing.initial()).await.map_err(anyhow::Error::from)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e.into()),
        };
        let pool = match started {
            Ok(pool) => pool,
            Err(e) => {
                plane.stop(Duration::ZERO).await;
                return Err(e);
            }
        };
        let autoscalers = plane.autoscalers();
        let scaling = match &options.sizing {
            Sizing::Fixed(n) => {
                autoscalers.fixed(&pipeline, *n);
                None
            }
            Sizing::Auto { pool: bounds, period } => autoscalers.start(
                &pipeline,
                Autoscaling {
                    pool,
                    bounds: bounds.clone(),
                    period: *period,
                    initial: bounds.lower(),
                    first_after: Duration::ZERO,
                },
            ),
        };
        Ok(LocalService { dispatcher, address, pipeline, plane, scaling, credentials })
    }

    /// The run's credentials, when it serves with TLS and authentication.
    pub fn credentials(&self) -> Option<&super::secure::Credentials> {
        self.credentials.as_ref()
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
    pub async fn stop(self, grace: Duration) {
        self.plane.stop(grace).await;
    }
}

/// The pool of `granary worker` processes serving `pipeline` from the dispatcher at `address`.
fn worker_processes(
    options: &ServiceOptions,
    address: SocketAddr,
    pipeline: &str,
    credentials: Option<&super::secure::Credentials>,
) -> anyhow::Result<ProcessPool> {
    let program = std::env::current_exe().context("cannot find the granary binary to start workers")?;
    let mut args = vec![
        "worker".to_string(),
        "--dispatcher".to_string(),
        address.to_string(),
        "--pipeline".to_string(),
        pipeline.to_string(),
        "--threads".to_string(),
        options.worker_threads().to_string(),
        "--prefetch-bytes".to_string(),
        options.prefetch_bytes.clone(),
    ];
    if let Some(python) = &options.python {
        args.push("--python".to_string());
        args.push(python.display().to_string());
    }
    if options.normalize_on_worker {
        args.push("--normalize-on-worker".to_string());
    }
    if let Some(credentials) = credentials {
        args.extend(credentials.worker_args());
    }
    if let Some(addr) = options.metrics_addr {
        // Each worker serves its own metrics on a free port of the same interface; the
        // dispatcher lists them at `/targets` for Prometheus.
        args.push("--metrics-addr".to_string());
        args.push(SocketAddr::new(addr.ip(), 0).to_string());
    }
    // Each worker would otherwise advertise, or serve metrics on, this process's address.
    Ok(ProcessPool::new(program, args).without_env(&["GRANARY_ADVERTISE", "GRANARY_METRICS_ADDR"]))
}
