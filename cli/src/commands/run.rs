//! `granary run`: the local service (or, with `--workers 0`, the engine in this process), a
//! progress bar and a summary.

use crate::args::{RunArgs, engine_options};
use crate::local::interrupt::Interrupted;
use crate::summary::digest::TensorRows;
use crate::summary::tally::{Delivered, Tally};
use crate::summary::{RunSummary, print_summary};
use anyhow::Context;
use granary_crds::load_manifest;
use granary_worker::Engine;
use std::path::Path;
use std::process::ExitCode;

/// Loads a manifest with `--set` overrides; when it is invalid, prints every problem to stderr
/// and returns `None` (exit code 2).
pub fn load_or_report(file: &Path, set: &[String]) -> Option<granary_crds::Manifest> {
    match load_manifest(file, set) {
        Ok(m) => Some(m),
        Err(problems) => {
            // A file that cannot be read is one problem at the file's own path: said once.
            let unreadable = matches!(&problems.0[..], [p] if p.path == file.display().to_string());
            if !unreadable {
                let n = problems.0.len();
                eprintln!("{}: invalid ({n} problem{})", file.display(), if n == 1 { "" } else { "s" });
            }
            for p in &problems.0 {
                eprintln!("{p}");
            }
            None
        }
    }
}

/// Mixed sources are laid out by the dispatcher's epoch plan, which the engine alone (in this
/// process) does not have: such a pipeline runs through the local service.
pub fn refuse_mixing_in_process(manifest: &granary_crds::Manifest, how: &str) -> anyhow::Result<()> {
    if manifest.pipeline.spec.is_mixed() {
        anyhow::bail!(
            "spec.sources: mixed sources run through the service (the dispatcher plans the mix), not in \
             this process ({how}); use `granary run` with --workers 1 or more"
        );
    }
    Ok(())
}

/// Runs `granary run`. A run that SIGTERM or SIGINT ends stops its workers, prints no summary
/// and exits with 128 + the signal's number (143 or 130).
pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let mut set = args.set.clone();
    if let Some(epochs) = args.epochs {
        set.push(format!("spec.epochs={epochs}"));
    }
    let Some(manifest) = load_or_report(&args.file, &set) else {
        return Ok(ExitCode::from(2));
    };
    if args.serve.is_some() {
        return crate::local::serve(&manifest, args);
    }
    if args.workers == Some(0) && args.serve.is_none() && args.metrics_addr.is_some() {
        anyhow::bail!(
            "--metrics-addr (or GRANARY_METRICS_ADDR) serves the dispatcher's metrics, and --workers 0 runs \
             without one: use --workers 1 or more, or --serve, or unset it"
        );
    }
    let summary =
        if args.workers == Some(0) { execute(&manifest, args) } else { crate::local::run(&manifest, args) };
    let summary = match summary {
        Ok(summary) => summary.with_plan(&manifest.pipeline.spec),
        Err(e) => {
            if let Some(interrupted) = e.downcast_ref::<Interrupted>() {
                eprintln!("granary run: {interrupted}; the workers are stopped");
                return Ok(interrupted.exit_code());
            }
            return Err(e);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs a loaded manifest in this process with the options of `args` and returns the figures.
pub fn execute(manifest: &granary_crds::Manifest, args: &RunArgs) -> anyhow::Result<RunSummary> {
    refuse_mixing_in_process(manifest, "--workers 0")?;
    let options = engine_options(args.threads, &args.prefetch_bytes, args.python.path.as_deref())?;
    let threads = options.threads;
    let engine = Engine::open(manifest, options)?;
    let epochs = args.epochs.unwrap_or(engine.spec().epochs);
    let name = manifest.pipeline.metadata.name.clone().unwrap_or_default();
    let mut tally = Tally::new(name, threads, epochs, args).count_padding(manifest);
    let mut skipped = 0;
    if epochs > 0 {
        let mut batches = engine.run_epochs(0..epochs);
        for batch in batches.by_ref() {
            let batch = batch.with_context(|| format!("after {} batches", tally.batches()))?;
            let tensors = batch
                .tensors
                .iter()
                .map(|t| TensorRows { name: &t.name, dtype: t.dtype.name(), shape: &t.shape, data: &t.data })
                .collect();
            tally.record(Delivered {
                epoch: batch.epoch,
                rows: batch.len() as u64,
                keys: &batch.keys,
                tensors,
            })?;
            if tally.is_full() {
                break;
            }
        }
        skipped = batches.skipped();
    }
    let skipped = manifest.pipeline.spec.skips_elements().then_some(skipped);
    Ok(tally.finish().with_skipped(skipped))
}
