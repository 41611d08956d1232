//! The local service behind `granary run --workers N` and `--serve`: the dispatcher in this
//! process, workers as child processes, and either the built-in consumer or external clients.

pub mod catalog;
pub mod consume;
pub mod interrupt;
pub mod secure;
pub mod service;

use crate::args::{RunArgs, engine_options};
use crate::summary::RunSummary;
use interrupt::StopSignals;
use std::process::ExitCode;
use std::time::Duration;

/// How long workers may drain when `--serve` is stopped: external clients may still read.
const DRAIN_GRACE: Duration = Duration::from_secs(20);
/// How long workers may take to exit once the built-in consumer has finished.
pub const END_OF_RUN_GRACE: Duration = Duration::from_secs(1);

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// How many workers to run: `--workers N` when given, else what `spec.scaling` says. An
/// autoscaled local pool is bounded by `maxWorkers` and, unless `--max-workers` says otherwise,
/// by the number of cores: on one machine more worker processes than cores add no compute for
/// a CPU-bound pipeline, only memory (each has its own prefetch budget).
pub fn sizing(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<service::Sizing> {
    use granary_crds::ScalingPolicy;
    if let Some(n) = args.workers {
        return Ok(service::Sizing::Fixed(n));
    }
    let spec = &manifest.pipeline.spec;
    let scaling = spec.scaling.clone().unwrap_or_default();
    if scaling.policy == ScalingPolicy::Fixed {
        return Ok(service::Sizing::Fixed(scaling.replicas.unwrap_or(1)));
    }
    let period = std::time::Duration::try_from_secs_f64(args.policy_period)
        .ok()
        .filter(|p| !p.is_zero())
        .ok_or_else(|| anyhow::anyhow!("--policy-period must be a positive number of seconds"))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let min = scaling.min_workers.unwrap_or(1);
    Ok(service::Sizing::Auto {
        pool: granary_policies::PoolConfig {
            min_workers: min,
            max_workers: args
                .max_workers
                .unwrap_or_else(|| scaling.max_workers.unwrap_or(cores).min(cores))
                .max(min),
            elements_per_batch: spec.batch.size,
            worker_cost_per_hour: scaling.worker_cost_per_hour,
            trainer_cost_per_hour: scaling.trainer_cost_per_hour,
            idle_after_s: scaling.idle_after_s(),
        },
        period,
    })
}

fn options(
    manifest: &granary_crds::Manifest,
    args: &RunArgs,
    listen: std::net::SocketAddr,
) -> anyhow::Result<service::ServiceOptions> {
    engine_options(args.threads, &args.prefetch_bytes, args.python.path.as_deref())?;
    let cache_max_bytes = args
        .cache_max_bytes
        .as_deref()
        .map(granary_crds::quantity::parse_bytes)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--cache-max-bytes: {e}"))?;
    Ok(service::ServiceOptions {
        cache_max_bytes,
        listen,
        journal: args.journal.clone(),
        sizing: sizing(manifest, args)?,
        threads: args.threads,
        prefetch_bytes: args.prefetch_bytes.clone(),
        python: args.python.path.clone(),
        normalize_on_worker: args.normalize_on_worker,
        metrics_addr: args.metrics_addr,
        tls: args.tls,
    })
}

/// `granary run --workers N`: the local service and the built-in consumer. SIGTERM or SIGINT
/// stops the workers and ends the run with an [`interrupt::Interrupted`] error.
pub fn run(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<RunSummary> {
    let rt = runtime()?;
    rt.block_on(async {
        // Before any worker starts: from here on a signal stops them rather than this process.
        let mut signals = StopSignals::listen()?;
        let options = options(manifest, args, ([127, 0, 0, 1], 0).into())?;
        let local = tokio::select! {
            local = service::LocalService::start(manifest, &options) => local?,
            interrupted = signals.recv() => return Err(interrupted.into()),
        };
        let threads = options.worker_threads();
        let address = local.address.to_string();
        let consumed = tokio::select! {
            result = consume::consume(&address, manifest, &local.pipeline, args, threads) => {
                Ok(result)
            }
            interrupted = signals.recv() => Err(interrupted),
        };
        let result = match consumed {
            Ok(result) => result,
            Err(interrupted) => {
                // Nobody reads what the workers hold any more: no drain worth waiting for.
                local.stop(END_OF_RUN_GRACE).await;
                return Err(interrupted.into());
            }
        };
        let scaling = local.scaling().map(|s| s.report());
        let cache = settled_cache_report(&local).await;
        let skipped = match manifest.pipeline.spec.skips_elements() {
            true => Some(settled_skips(&local).await),
            false => None,
        };
        // The consumer may have read every batch before the dispatcher heard of the completion
        // that failed the pipeline (one skip past spec.errors.maxSkipped in the last split): the
        // run fails all the same.
        let failed = local
            .dispatcher
            .failure(&local.pipeline)
            .map(|why| format!("pipeline `{}` failed: {why}", local.pipeline));
        // The only consumer is done: there is nothing left worth draining for.
        local.stop(END_OF_RUN_GRACE).await;
        if let (Ok(_), Some(failed)) = (&result, failed) {
            return Err(anyhow::anyhow!(failed));
        }
        result.map(|summary| RunSummary { scaling, ..summary }.with_cache(cache).with_skipped(skipped))
    })
}

/// The cache report once the dispatcher has counted every split of the last epoch: a worker
/// reports a split complete just after its consumer has the batches, so the report read right
/// after consuming may still miss the last splits. Waits at most a second.
async fn settled_cache_report(local: &service::LocalService) -> Option<granary_dispatcher::CacheReport> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let report = local.dispatcher.cache_report(&local.pipeline);
        let counted = |r: &granary_dispatcher::CacheReport| {
            let Some((splits, epochs)) = local.dispatcher.shape(&local.pipeline) else { return true };
            r.store.is_none()
                || r.epochs.iter().find(|e| e.epoch + 1 == epochs).is_some_and(|e| {
                    e.splits_read + e.splits_written + e.splits_computed + e.splits_bad >= splits
                })
        };
        if report.as_ref().is_none_or(counted) || tokio::time::Instant::now() >= deadline {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Elements skipped (`spec.errors.policy: skip`) once the dispatcher has heard of every split's
/// completion: as for [`settled_cache_report`], the last ones may arrive just after the consumer
/// is done. Waits at most a second.
async fn settled_skips(local: &service::LocalService) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let completed = local.dispatcher.split_counts(&local.pipeline).completed;
        let all = local
            .dispatcher
            .shape(&local.pipeline)
            .is_none_or(|(splits, epochs)| completed >= splits.saturating_mul(u64::from(epochs)));
        if all || tokio::time::Instant::now() >= deadline {
            return local.dispatcher.skipped(&local.pipeline);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `granary run --serve ADDR`: the local service for external clients.
pub fn serve(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let listen = args.serve.unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let rt = runtime()?;
    rt.block_on(async {
        let mut signals = StopSignals::listen()?;
        let options = options(manifest, args, listen)?;
        let kept = args.credentials.as_deref();
        let local = tokio::select! {
            local = service::LocalService::start_kept(manifest, &options, kept) => local?,
            _ = signals.recv() => return Ok(ExitCode::SUCCESS),
        };
        let mut ready =
            serde_json::json!({"dispatcher": local.address.to_string(), "pipeline": local.pipeline});
        if let Some(credentials) = local.credentials() {
            ready["tls_ca"] = credentials.ca_file().display().to_string().into();
            ready["token_file"] = credentials.trainer_token_file().display().to_string().into();
        }
        println!("{ready}");
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        // A dispatcher fenced off its journal stops serving: the process ends, in failure.
        let watched = local.dispatcher.clone();
        let halted = watched.halted();
        tokio::pin!(halted);
        let mut stopped = None;
        loop {
            tokio::select! {
                _ = signals.recv() => break,
                why = &mut halted => {
                    stopped = Some(why);
                    break;
                }
                _ = tick.tick() => {
                    if args.exit_when_done && local.done() {
                        break;
                    }
                }
            }
        }
        let scaling = local.scaling().map(|s| s.report());
        local.stop(DRAIN_GRACE).await;
        if let Some(why) = stopped {
            anyhow::bail!("the dispatcher stopped serving: {why}");
        }
        if let Some(scaling) = scaling {
            // What the autoscaler did, for whoever started the service.
            println!("{}", serde_json::json!({ "scaling": scaling }));
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::service::Sizing;
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn sizing_of(scaling: &str, flags: &[&str]) -> Sizing {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: p}}\nspec:\n  \
                 source: {{url: 'file:///data/', format: jsonl}}\n  stages: [{{op: test.sleep, ms: 0}}]\n  batch: {{size: 8}}\n{scaling}"
            ),
        )
        .unwrap();
        let manifest = granary_crds::load_manifest(&path, &[]).unwrap();
        let args = Cli::try_parse_from([&["granary", "p.yaml"][..], flags].concat()).unwrap().run;
        sizing(&manifest, &args).unwrap()
    }

    fn bounds(s: Sizing) -> (u32, u32) {
        match s {
            Sizing::Auto { pool, .. } => (pool.min_workers, pool.max_workers),
            Sizing::Fixed(n) => panic!("fixed {n}"),
        }
    }

    #[test]
    fn sizing_follows_the_flags_then_the_spec() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(matches!(sizing_of("", &["--workers", "3"]), Sizing::Fixed(3)));
        assert!(matches!(sizing_of("  scaling: {policy: fixed, replicas: 5}\n", &[]), Sizing::Fixed(5)));
        // Auto by default: from 1, at most the cores here.
        assert_eq!(bounds(sizing_of("", &[])), (1, cores));
        // maxWorkers above the cores is cut to them, below them is kept.
        assert_eq!(bounds(sizing_of("  scaling: {minWorkers: 1, maxWorkers: 64}\n", &[])), (1, cores));
        assert_eq!(bounds(sizing_of("  scaling: {minWorkers: 1, maxWorkers: 1}\n", &[])), (1, 1));
        // --max-workers lifts the local bound; never below minWorkers.
        assert_eq!(bounds(sizing_of("", &["--max-workers", "6"])), (1, 6));
        assert_eq!(
            bounds(sizing_of("  scaling: {minWorkers: 3, maxWorkers: 4}\n", &["--max-workers", "2"])),
            (3, 3)
        );
        let Sizing::Auto { period, .. } = sizing_of("", &["--policy-period", "0.5"]) else { panic!() };
        assert_eq!(period, std::time::Duration::from_millis(500));
    }

    #[test]
    fn a_bad_policy_period_is_an_error_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        std::fs::write(
            &path,
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
             source: {url: 'file:///data/', format: jsonl}\n  stages: [{op: test.sleep, ms: 0}]\n  batch: {size: 8}\n",
        )
        .unwrap();
        let manifest = granary_crds::load_manifest(&path, &[]).unwrap();
        for bad in ["--policy-period=0", "--policy-period=-1"] {
            let args = Cli::try_parse_from(["granary", "p.yaml", bad]).unwrap().run;
            let e = sizing(&manifest, &args).unwrap_err().to_string();
            assert!(e.contains("--policy-period"), "{e}");
        }
    }
}
