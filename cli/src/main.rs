//! `granary`: run ML input pipelines locally, validate specs, print the CRD, generate a demo.

mod args;
mod commands;
mod demo;
mod exit;
mod local;
mod summary;

use clap::{CommandFactory, Parser, Subcommand};

use std::process::ExitCode;

/// What `granary --help` opens with.
const ABOUT: &str = "Granary: ML input pipelines (read, decode, augment, tokenize, batch) as a service.

Runs an InputPipeline on this machine and reports its throughput, checks manifests before they are \
applied, benchmarks pipelines, runs the data-plane worker and the Kubernetes operator, compares \
autoscaling policies, manages the autocache, and generates demo data and shell completions.";

/// Granary: ML input data processing as a service.
#[derive(Parser)]
#[command(name = "granary", version, about = ABOUT, after_help = exit::TABLE)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline through the local service (or in this process with `--workers 0`) and
    /// report its throughput.
    Run(args::RunArgs),
    /// Measure a pipeline's steady-state throughput, with ratios against a baseline and the
    /// decode-only limit measured in the same run.
    Bench(commands::bench::BenchArgs),
    /// Check InputPipeline manifests (`-`: standard input); prints each problem as
    /// `FIELD_PATH: message`, or JSON lines with `--json`.
    Validate(commands::validate::ValidateArgs),
    /// Print the InputPipeline CustomResourceDefinition as YAML.
    Crd,
    /// Generate a small synthetic dataset and run every example pipeline on it.
    Demo(commands::demo::DemoArgs),
    /// Run a data-plane worker: lease splits from a dispatcher and stream batch parts to consumers.
    Worker(commands::worker::WorkerArgs),
    /// Run the Kubernetes operator: host the dispatcher, reconcile InputPipelines into worker
    /// Deployments and size them; replicas elect one leader.
    Operator(commands::operator::OperatorArgs),
    /// Compare the autoscaling policies (granary, cachew, hpa) against the oracle on the
    /// simulator's scenarios: a table of the four figures, JSON lines, decisions or plots.
    Simulate(commands::simulate::SimulateArgs),
    /// Look into and clean up an autocache store: list entries, inspect one, remove some.
    Cache(commands::cache::CacheArgs),
    /// Print a shell completion script: `granary completions bash > /etc/bash_completion.d/granary`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a pod's log (or any file) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Before anything links rustls a config (object stores, the Kubernetes client, gRPC).
    granary_security::provider::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(&args),
        Command::Bench(args) => commands::bench::bench(&args),
        Command::Validate(args) => return commands::validate::validate(&args),
        Command::Crd => commands::crd::crd().map(|yaml| {
            print!("{yaml}");
            ExitCode::SUCCESS
        }),
        Command::Demo(args) => commands::demo::demo(&args),
        Command::Worker(args) => commands::worker::worker(&args),
        Command::Operator(args) => commands::operator::operator(&args),
        Command::Simulate(args) => commands::simulate::simulate(&args),
        Command::Cache(args) => commands::cache::cache(&args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "granary", &mut std::io::stdout());
            Ok(exit::code(exit::OK))
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => exit::report(&e),
    }
}
