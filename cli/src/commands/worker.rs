//! `granary worker`: a data-plane worker. It leases splits from a dispatcher, runs the pipeline's
//! engine on them and streams the batch parts to the consumers; SIGTERM or Ctrl-C drains it.

use anyhow::Context;
use granary_worker::service::{WorkerConfig, serve};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `granary worker`.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// Dispatcher address (`host:port` or `http://host:port`).
    #[arg(long, env = "GRANARY_DISPATCHER")]
    pub dispatcher: String,
    /// Address to listen on for consumer streams (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address consumers connect to, `host:port` (default: the bound address).
    #[arg(long, env = "GRANARY_ADVERTISE")]
    pub advertise: Option<String>,
    /// Serve only this pipeline (default: any).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// Compute threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory budget for data in flight, in bytes or with a suffix (`512Mi`, `2Gi`); `auto`: a
    /// quarter of the memory the process may use (its cgroup's limit or the machine's), from
    /// 32Mi to 512Mi.
    #[arg(long, default_value = "auto")]
    pub prefetch_bytes: String,
    #[command(flatten)]
    pub python: crate::args::PythonArg,
    /// Apply a final `float32` `image.normalize` here, always, and send `float32` tensors. By
    /// default placement decides per job: the worker sends the `uint8` pixels (a quarter of the
    /// bytes) for the client to finish while the trainer's host has idle cores, and normalizes
    /// them itself, with the same tables and so the same bits, when it has none.
    #[arg(long)]
    pub normalize_on_worker: bool,
    /// Serve Prometheus metrics at `GET /metrics` on ADDR.
    #[arg(long, env = "GRANARY_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Seconds a drain (SIGTERM) waits for the held leases before returning them.
    #[arg(long, default_value_t = 20.0)]
    pub drain_timeout: f64,
    /// Folder with the TLS material: `ca.crt` (the CA the dispatcher's certificate chains to),
    /// and `tls.crt` and `tls.key` (this worker's certificate, which its consumers check). With
    /// it, both the dispatcher link and the consumer streams use TLS.
    #[arg(long, env = "GRANARY_TLS_DIR", value_name = "DIR")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// File holding this worker's bearer token for the dispatcher (default: `GRANARY_TOKEN`).
    /// With a token, every consumer stream must present the dispatcher's capability.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// Runs `granary worker` until SIGTERM or Ctrl-C, then drains.
pub fn worker(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let mut engine =
        crate::args::engine_options(args.threads, &args.prefetch_bytes, args.python.path.as_deref())?;
    engine.defer_normalize = !args.normalize_on_worker;
    // Told to normalize, the worker does it per element, where its stage times count the pass.
    engine.finish_per_batch = false;
    let drain_timeout = Duration::try_from_secs_f64(args.drain_timeout).map_err(|_| {
        crate::exit::InvalidInput("--drain-timeout must be a number of seconds, 0 or more".to_string())
    })?;
    let config = WorkerConfig {
        dispatcher: args.dispatcher.clone(),
        listen: args.listen,
        advertise: args.advertise.clone().filter(|a| !a.is_empty()),
        pipeline: args.pipeline.clone().filter(|p| !p.is_empty()),
        engine,
        drain_timeout,
        leases_ahead: 2,
        metrics_addr: args.metrics_addr,
        tls: match &args.tls_dir {
            Some(dir) => Some(
                granary_security::TlsFiles::in_dir(dir)
                    .load()
                    .map_err(|e| crate::exit::InvalidInput(format!("--tls-dir: {e}")))?,
            ),
            None => None,
        },
        token: granary_security::read_token(args.token_file.as_deref())
            .map_err(|e| crate::exit::InvalidInput(format!("--token-file: {e}")))?,
    };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("granary-service")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(serve(config, shutdown_signal()));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result.context("worker failed")?;
    Ok(ExitCode::SUCCESS)
}

/// Completes on the first SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("SIGTERM: draining"),
        () = interrupt => tracing::info!("interrupted: draining"),
    }
}
