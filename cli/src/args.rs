//! Arguments shared beyond their own command: those of `granary run` (the local service and
//! `granary demo` read them too) and the engine options from `--threads` and `--prefetch-bytes`
//! (`granary run`, `bench` and `worker`).

use crate::exit::InvalidInput;
use granary_worker::EngineOptions;
use std::path::PathBuf;

/// Where the images of a pipeline's fused image run are made (`--images`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Images {
    /// A share on the trainer's host while it has idle cores.
    Auto,
    /// All on the trainer's host.
    Client,
    /// All on the workers.
    Workers,
}

impl Images {
    /// The client's option.
    pub fn placement(self) -> granary_client::ImagePlacement {
        match self {
            Images::Auto => granary_client::ImagePlacement::Auto,
            Images::Client => granary_client::ImagePlacement::Client,
            Images::Workers => granary_client::ImagePlacement::Workers,
        }
    }
}

/// Arguments of `granary run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// InputPipeline manifest.
    pub file: PathBuf,
    /// Number of epochs (overrides spec.epochs).
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Stop after this many batches in all.
    #[arg(long)]
    pub limit_batches: Option<u64>,
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
    /// Print one JSON summary line on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// Also print a digest of every epoch's elements (keys, dtypes, shapes and tensor bytes), a
    /// SHA-256 in hex that does not depend on batching or on the order batches arrive in: the same
    /// data gives the same digest in this process (`--workers 0`) and through workers.
    #[arg(long)]
    pub digest: bool,
    /// Override a manifest field, e.g. `--set spec.batch.size=64` (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// Worker processes of the local service (dispatcher in this process), a fixed count; 0 runs
    /// the engine in this process instead. Default: as `spec.scaling` says. With `policy: auto`
    /// (the default) the autoscaler sizes the pool between `minWorkers` and `maxWorkers` (here
    /// at most the number of cores unless the spec sets it); with `fixed`, `replicas`.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Most worker processes the autoscaler may run here (default: `spec.scaling.maxWorkers`,
    /// at most the number of cores). Raise it for pipelines that wait on I/O rather than compute.
    #[arg(long, conflicts_with = "workers")]
    pub max_workers: Option<u32>,
    /// Seconds between autoscaling evaluations.
    #[arg(long, default_value_t = 5.0)]
    pub policy_period: f64,
    /// Serve the dispatcher API at ADDR for external clients instead of consuming; prints
    /// `{"dispatcher":"HOST:PORT","pipeline":NAME}` once ready and runs until SIGTERM or SIGINT (then exits 0).
    #[arg(long, value_name = "ADDR")]
    pub serve: Option<std::net::SocketAddr>,
    /// With `--serve`: exit once every consumer of every job delivered all epochs.
    #[arg(long, requires = "serve")]
    pub exit_when_done: bool,
    /// With `--serve`: TLS and authentication on every endpoint. The run makes a CA, the
    /// dispatcher's and workers' certificates and a trainer token in a private folder (removed
    /// at exit, unless `--credentials` names one) and adds `"tls_ca"` and `"token_file"` to the
    /// ready line: a trainer sets `GRANARY_TLS_CA` to the first and `GRANARY_TOKEN_FILE` to the
    /// second (or `GRANARY_TOKEN` to its contents).
    #[arg(long, requires = "serve")]
    pub tls: bool,
    /// With `--tls`: keep the run's CA and master key in DIR (created private when missing) and
    /// reuse them on later runs, so that trainers' tokens and CA survive a restart; the tokens and
    /// certificates are written there too. A folder with part of them, or damaged ones, is refused.
    #[arg(long, requires = "tls", value_name = "DIR")]
    pub credentials: Option<PathBuf>,
    /// With workers: apply a final `float32` `image.normalize` on the workers and send `float32`
    /// over the wire, instead of `uint8` that the client finishes (the default; same values).
    #[arg(long)]
    pub normalize_on_worker: bool,
    /// With workers: where the images of a pipeline's final fused image run (decode, crop or
    /// resize, flip) are made: `auto` (a share on the trainer's host while it has idle cores),
    /// `client` (all on the trainer's host, from the workers' plans) or `workers`. The pixels
    /// are the same bytes either way. Default: `$GRANARY_IMAGES`, else `auto`.
    #[arg(long, value_enum, value_name = "WHERE")]
    pub images: Option<Images>,
    /// Serve the dispatcher's Prometheus metrics at `GET /metrics` on ADDR (needs the local
    /// service: `--workers` of 1 or more, or `--serve`).
    #[arg(long, env = "GRANARY_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where the dispatcher journals its state (a local path or an object-store URL).
    #[arg(long, value_name = "URL")]
    pub journal: Option<String>,
    /// Store-wide budget of the cache store(s) in use, in bytes or with a suffix (`20Gi`): the
    /// least recently used entries not in use are evicted beyond it.
    #[arg(long, value_name = "BYTES")]
    pub cache_max_bytes: Option<String>,
}

/// `--python PATH` (or `GRANARY_PYTHON`), shared by every command that runs or checks
/// `python.map` stages.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PythonArg {
    /// The Python interpreter of `python.map` stages (default: `$VIRTUAL_ENV/bin/python`, else
    /// `python3` on PATH). It needs NumPy.
    #[arg(long = "python", env = "GRANARY_PYTHON", value_name = "PATH")]
    pub path: Option<PathBuf>,
}

/// Engine options from `--threads` and `--prefetch-bytes`; a bad value is invalid input (exit
/// status 2), naming the flag.
pub fn engine_options(
    threads: Option<usize>,
    prefetch_bytes: &str,
    python: Option<&std::path::Path>,
) -> Result<EngineOptions, InvalidInput> {
    let mut options =
        EngineOptions { python: python.map(std::path::Path::to_path_buf), ..EngineOptions::default() };
    if let Some(t) = threads {
        if t == 0 {
            return Err(InvalidInput("--threads must be at least 1".to_string()));
        }
        options.threads = t;
    }
    if prefetch_bytes != "auto" {
        options.prefetch_bytes = granary_crds::quantity::parse_bytes(prefetch_bytes)
            .map_err(|e| InvalidInput(format!("--prefetch-bytes: {e} (or `auto`)")))?
            as usize;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefetch_budget_is_auto_or_a_quantity_named_in_its_error() {
        let auto = engine_options(None, "auto", None).unwrap();
        assert_eq!(auto.prefetch_bytes, granary_worker::memory::default_prefetch_bytes());
        assert_eq!(engine_options(Some(3), "64Mi", None).unwrap().prefetch_bytes, 64 << 20);
        let bad = engine_options(None, "lots", None).unwrap_err().0;
        assert!(bad.contains("--prefetch-bytes") && bad.contains("auto"), "{bad}");
        let zero = engine_options(Some(0), "auto", None).unwrap_err().0;
        assert!(zero.contains("--threads"), "{zero}");
    }
}
