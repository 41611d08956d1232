//! `granary plan FILE`: the plan a pipeline runs, like a database's EXPLAIN: its stages in the
//! order they run, the fields its source reads, each rewrite of the optimizer with the rule that
//! keeps the output the same and the gain modelled for it, and the runs of stages the worker
//! fuses into one operator, and what the worker tunes while it runs. Nothing is read from the
//! source.
//!
//! Exit status ([`crate::exit`]): 0, or 2 when the manifest is invalid.

use crate::commands::run::load_or_report;
use granary_worker::ImagePath;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `granary plan`.
#[derive(clap::Args, Clone, Debug)]
pub struct PlanArgs {
    /// The manifest.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Override a spec field before planning, e.g. `--set spec.optimize=false` (repeatable).
    #[arg(long, value_name = "PATH=VALUE")]
    pub set: Vec<String>,
}

/// Prints the plan of `args.file`.
pub fn plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let Some(manifest) = load_or_report(&args.file, &args.set) else {
        return Ok(ExitCode::from(2));
    };
    print!("{}", explain(&manifest, &args.file.display().to_string()));
    Ok(ExitCode::SUCCESS)
}

/// The text `granary plan` prints for `manifest`, read from `file`.
pub fn explain(manifest: &granary_crds::Manifest, file: &str) -> String {
    let written = &manifest.pipeline.spec;
    let plan = granary_optimizer::optimize(written);
    let spec = plan.apply(written);
    let name = manifest.pipeline.metadata.name.as_deref().unwrap_or("(unnamed)");
    let mut out = format!("plan of {file} (pipeline {name})\n");
    out.push_str(&plan.explain(written));
    let runs = granary_worker::fused_runs(&spec, ImagePath::Fused);
    if runs.is_empty() {
        out.push_str("fused: none (every stage runs as its own operator)\n");
    }
    for run in runs {
        let stages: Vec<String> = plan.stages[run]
            .iter()
            .map(|s| format!("spec.stages[{}] {}", s.origin, s.stage.display_name()))
            .collect();
        out.push_str(&format!("fused into one operator: {}\n", stages.join(" → ")));
    }
    out.push_str(&tuning(&spec));
    if let Some(last) = spec.stages.last()
        && let Ok(granary_crds::OpConfig::ImageNormalize(n)) = granary_crds::OpConfig::parse(last, "")
        && n.dtype == granary_crds::ops::ImageDType::Float32
    {
        out.push_str(
            "placement: when served, the final float32 normalization runs in the trainer's client while \
             its host has idle cores, so the wire carries uint8 pixels (a quarter of the bytes), and on \
             the workers while it has none; the result is bit-identical\n",
        );
    }
    out
}

/// The line naming what the worker tunes while the pipeline runs (`docs/optimizer.md`,
/// *Tuning*); empty when it tunes nothing, as with the optimizer off.
fn tuning(spec: &granary_crds::InputPipelineSpec) -> String {
    if !spec.optimize {
        return String::new();
    }
    let mut tuned = Vec::new();
    let python = spec
        .stages
        .iter()
        .any(|s| granary_crds::OpConfig::parse(s, "").is_ok_and(|c| c.python_call().is_some()));
    if python {
        tuned.push("compute threads (the Python stage's calls wait on its runners)");
    }
    if spec.inputs().iter().any(|input| input.source.format == granary_crds::SourceFormat::Files) {
        tuned.push("reads in flight (format: files reads one object per sample)");
    }
    if tuned.is_empty() { String::new() } else { format!("tuned while running: {}\n", tuned.join("; ")) }
}
