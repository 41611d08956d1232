//! `granary demo`: generate a small deterministic dataset and run every example pipeline on it.

use crate::args::RunArgs;
use crate::demo::data::{self, DataOptions};
use crate::summary::print_summary;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The example manifests, as shipped in `examples/`.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("imagenet-resnet50.yaml", include_str!("../../../examples/imagenet-resnet50.yaml")),
    ("imagenet-resnet50-uint8.yaml", include_str!("../../../examples/imagenet-resnet50-uint8.yaml")),
    ("bert-tokenize.yaml", include_str!("../../../examples/bert-tokenize.yaml")),
    ("parquet-features.yaml", include_str!("../../../examples/parquet-features.yaml")),
];

/// The data folder the examples name, relative to `examples/`.
const EXAMPLE_DATA: &str = "../granary-demo/";

/// Arguments of `granary demo`.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Folder for the generated data.
    #[arg(long, default_value = "granary-demo")]
    pub dir: PathBuf,
    /// Number of images to generate.
    #[arg(long, default_value_t = 256)]
    pub images: usize,
    /// Compute threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON line per example instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only generate the data; run nothing.
    #[arg(long)]
    pub no_run: bool,
    /// Scale image sides (160 to 400 pixels) by this factor: 6 makes camera-sized photos whose
    /// decode dominates, the case where caching a resized copy pays.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub image_scale: u32,
    /// Number of JSONL text records to generate (spread over 4 files): more for a benchmark.
    #[arg(long, default_value_t = DataOptions::default().text_lines)]
    pub text_lines: usize,
    /// Number of Parquet rows to generate: more for a benchmark.
    #[arg(long, default_value_t = DataOptions::default().table_rows)]
    pub table_rows: usize,
}

/// Runs `granary demo`.
pub fn demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = args.dir.canonicalize().with_context(|| format!("cannot resolve {}", args.dir.display()))?;
    let options = DataOptions {
        images: args.images,
        image_scale: args.image_scale,
        text_lines: args.text_lines,
        table_rows: args.table_rows,
        ..DataOptions::default()
    };
    let summary = data::generate(&dir, &options)?;
    if !args.json {
        println!("generated in {}:\n{summary}", dir.display());
    }
    if args.no_run {
        return Ok(ExitCode::SUCCESS);
    }
    for (name, text) in EXAMPLES {
        let mut manifest = example_manifest(text, &dir).with_context(|| format!("examples/{name}"))?;
        manifest.pipeline.spec.epochs = 1;
        let run_args = RunArgs {
            file: PathBuf::from(name),
            epochs: Some(1),
            limit_batches: None,
            threads: args.threads,
            prefetch_bytes: "auto".to_string(),
            python: crate::args::PythonArg::default(),
            json: true,
            digest: false,
            set: Vec::new(),
            workers: Some(1),
            policy_period: 5.0,
            max_workers: None,
            serve: None,
            exit_when_done: false,
            tls: false,
            credentials: None,
            journal: None,
            normalize_on_worker: false,
            images: None,
            metrics_addr: None,
            cache_max_bytes: None,
        };
        // Through the local service: dispatcher here, one worker process, the built-in client.
        let summary =
            crate::local::run(&manifest, &run_args).with_context(|| format!("running examples/{name}"))?;
        let summary = summary.with_plan(&manifest.pipeline.spec);
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            print_summary(&summary);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses an example with its data paths pointed at `dir`.
pub fn example_manifest(text: &str, dir: &Path) -> anyhow::Result<granary_crds::Manifest> {
    let dir = dir.to_string_lossy();
    let text = text
        .replace(&format!("file:{EXAMPLE_DATA}"), &format!("file://{dir}/"))
        .replace(EXAMPLE_DATA, &format!("{dir}/"));
    granary_crds::parse_manifest(&text, Path::new(dir.as_ref()), &[]).map_err(anyhow::Error::new)
}
