//! The local service behind `granary run --workers N` and `--serve`: the dispatcher in this
//! process, workers as child processes, and either the built-in consumer or external clients.

pub mod catalog;
pub mod consume;
pub mod service;

use crate::commands::run::{RunArgs, RunSummary, engine_options};
use std::process::ExitCode;
use std::time::Duration;

/// How long workers may drain when `--serve` is stopped: external clients may still read.
const DRAIN_GRACE: Duration = Duration::from_secs(20);
/// How long workers may take to exit once the built-in consumer has finished.
pub const END_OF_RUN_GRACE: Duration = Duration::from_secs(1);

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

fn options(args: &RunArgs, listen: std::net::SocketAddr) -> anyhow::Result<service::ServiceOptions> {
    engine_options(args.threads, &args.prefetch_bytes)?;
    Ok(service::ServiceOptions {
        listen,
        journal: args.journal.clone(),
        workers: args.workers,
        threads: args.threads,
        prefetch_bytes: args.prefetch_bytes.clone(),
        normalize_on_worker: args.normalize_on_worker,
        metrics_addr: args.metrics_addr,
    })
}

/// `granary run --workers N`: the local service and the built-in consumer.
pub fn run(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<RunSummary> {
    let rt = runtime()?;
    rt.block_on(async {
        let local =
            service::LocalService::start(manifest, &options(args, ([127, 0, 0, 1], 0).into())?).await?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = args.threads.unwrap_or((cores / args.workers.max(1) as usize).max(1));
        let result = consume::consume(&local.address.to_string(), &local.pipeline, args, threads).await;
        // The only consumer is done: there is nothing left worth draining for.
        local.stop(END_OF_RUN_GRACE).await;
        result
    })
}

/// `granary run --serve ADDR`: the local service for external clients.
pub fn serve(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let listen = args.serve.unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let rt = runtime()?;
    rt.block_on(async {
        let local = service::LocalService::start(manifest, &options(args, listen)?).await?;
        println!(
            "{}",
            serde_json::json!({"dispatcher": local.address.to_string(), "pipeline": local.pipeline})
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = tick.tick() => {
                    if args.exit_when_done && local.done() {
                        break;
                    }
                }
            }
        }
        local.stop(DRAIN_GRACE).await;
        Ok(ExitCode::SUCCESS)
    })
}
