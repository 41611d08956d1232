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
    /// Print the plan a pipeline runs: its stages in order, the fields its source reads, each
    /// rewrite of the optimizer with its equivalence rule and gain, and the fused runs.
    Plan(commands::plan::PlanArgs),
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

/// The variable choosing the log lines' format: `text` (the default) or `json`.
const LOG_FORMAT_VAR: &str = "GRANARY_LOG_FORMAT";

/// Logs to stderr, filtered by `GRANARY_LOG` (default `warn`), as text or, with
/// `GRANARY_LOG_FORMAT=json`, one JSON object per line (for log collectors).
fn init_logging() {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr);
    let format = std::env::var(LOG_FORMAT_VAR).unwrap_or_default();
    match format.trim().to_ascii_lowercase().as_str() {
        "json" => builder.event_format(json_log::JsonLines).init(),
        other => {
            // Colours only on a terminal: a pod's log (or any file) gets plain text.
            builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
            if !other.is_empty() && other != "text" {
                tracing::warn!("{LOG_FORMAT_VAR}={format:?} is neither text nor json; logging text");
            }
        }
    }
}

fn main() -> ExitCode {
    summary::startup::mark();
    init_logging();
    // Before anything links rustls a config (object stores, the Kubernetes client, gRPC).
    granary_security::provider::install();
    let cli = Cli::parse();
    // Every thread this process starts serves, reads, or waits, and yields its core to the
    // engine's compute threads rather than preempt them (see `granary_worker::scheduling`).
    if let Err(e) = granary_worker::scheduling::serve_without_preempting() {
        tracing::debug!("threads keep the normal scheduling policy: {e}");
    }
    if matches!(cli.command, Command::Run(_) | Command::Bench(_) | Command::Demo(_) | Command::Worker(_))
        && granary_worker::allocator::keep_freed_memory()
    {
        tracing::debug!("the allocator keeps freed memory for the engine's images");
    }
    let result = match cli.command {
        Command::Run(args) => commands::run::run(&args),
        Command::Bench(args) => commands::bench::bench(&args),
        Command::Validate(args) => return commands::validate::validate(&args),
        Command::Plan(args) => commands::plan::plan(&args),
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

/// Log lines as JSON objects, for `GRANARY_LOG_FORMAT=json`.
mod json_log {
    use serde_json::{Map, Value};
    use std::fmt;
    use tracing::field::{Field, Visit};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    use tracing_subscriber::fmt::{FmtContext, FormattedFields};
    use tracing_subscriber::registry::LookupSpan;

    /// One JSON object per event: `timestamp` (RFC 3339, UTC), `level`, `target`, `message`,
    /// the event's other `fields`, and the `spans` it happened in (outermost first, each with its
    /// name and its fields as text).
    pub struct JsonLines;

    /// An event's fields as JSON values.
    struct Fields(Map<String, Value>);

    impl Visit for Fields {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_f64(&mut self, field: &Field, value: f64) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_bool(&mut self, field: &Field, value: bool) {
            self.0.insert(field.name().to_string(), Value::from(value));
        }
        fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
            self.0.insert(field.name().to_string(), Value::from(value.to_string()));
        }
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name().to_string(), Value::from(format!("{value:?}")));
        }
    }

    impl<S, N> FormatEvent<S, N> for JsonLines
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> fmt::Result {
            let mut timestamp = String::new();
            SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            let meta = event.metadata();
            let mut line = Map::new();
            line.insert("timestamp".into(), Value::from(timestamp));
            line.insert("level".into(), Value::from(meta.level().as_str()));
            line.insert("target".into(), Value::from(meta.target()));
            line.insert("message".into(), fields.0.remove("message").unwrap_or(Value::from("")));
            if !fields.0.is_empty() {
                line.insert("fields".into(), Value::Object(fields.0));
            }
            let spans: Vec<Value> = ctx
                .event_scope()
                .into_iter()
                .flat_map(|scope| scope.from_root())
                .map(|span| {
                    let extensions = span.extensions();
                    let text =
                        extensions.get::<FormattedFields<N>>().map(|f| f.fields.as_str()).unwrap_or("");
                    serde_json::json!({"name": span.name(), "fields": text})
                })
                .collect();
            if !spans.is_empty() {
                line.insert("spans".into(), Value::Array(spans));
            }
            writeln!(writer, "{}", Value::Object(line))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::sync::{Arc, Mutex};

        #[test]
        fn each_event_is_one_json_object_with_its_fields_and_spans() {
            let out = Arc::new(Mutex::new(Vec::<u8>::new()));
            let sink = out.clone();
            let subscriber = tracing_subscriber::fmt()
                .event_format(JsonLines)
                .with_writer(move || SharedBuffer(sink.clone()))
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!("reconcile", pipeline = "ns/p");
                let _entered = span.enter();
                tracing::warn!(workers = 3, ready = true, "scaled \"up\"");
            });
            let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 1, "{text}");
            let line: Value = serde_json::from_str(lines[0]).unwrap();
            assert_eq!(line["level"], "WARN");
            assert_eq!(line["message"], "scaled \"up\"");
            assert_eq!(line["fields"], serde_json::json!({"workers": 3, "ready": true}));
            assert_eq!(line["spans"][0]["name"], "reconcile");
            assert!(line["spans"][0]["fields"].as_str().unwrap().contains("ns/p"), "{line}");
            assert!(line["timestamp"].as_str().is_some_and(|t| t.contains('T')), "{line}");
            assert!(line["target"].as_str().is_some_and(|t| t.contains("json_log")), "{line}");
        }

        /// A writer into a shared buffer.
        struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

        impl std::io::Write for SharedBuffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
    }
}
