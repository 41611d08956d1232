//! `granary-e2e-node`: a test-only kubelet stand-in that registers a Node with a Kubernetes API
//! server and runs the pods bound to it as local processes on 127.0.0.1 (see
//! `granary_e2e::node`). Prints `{"node": "<name>"}` on stdout once the node is Ready, logs to
//! stderr, and stops every pod process on SIGTERM or SIGINT.

use anyhow::{Context, Result};
use clap::Parser;
use granary_e2e::node::{Settings, run};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::path::PathBuf;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(about = "A test-only node agent: runs the pods bound to a Node as local processes")]
struct Args {
    /// Kubeconfig with admin credentials.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The Node's name.
    #[arg(long, default_value = "granary-e2e-node")]
    node_name: String,
    /// The binary that stands for the image's `granary` entrypoint.
    #[arg(long)]
    granary_bin: PathBuf,
    /// Where per-pod working directories and logs go.
    #[arg(long)]
    state_dir: PathBuf,
    /// The CPU capacity the node reports (nominal).
    #[arg(long, default_value = "32")]
    cpu: String,
    /// The memory capacity the node reports (nominal).
    #[arg(long, default_value = "64Gi")]
    memory: String,
}

/// The named cluster entry of the current context of the kubeconfig at `path`, as the agent
/// writes it into pods' kubeconfigs.
fn current_cluster(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config: serde_json::Value =
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let context = config["current-context"].as_str().context("the kubeconfig has no current-context")?;
    let cluster = config["contexts"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == context))
        .and_then(|c| c["context"]["cluster"].as_str())
        .with_context(|| format!("the kubeconfig's context {context} names no cluster"))?;
    config["clusters"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == cluster))
        .cloned()
        .with_context(|| format!("the kubeconfig has no cluster {cluster}"))
}

async fn connect(path: &std::path::Path) -> Result<Client> {
    let file = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Client::try_from(config).context("building a Kubernetes client")
}

// One thread: pod processes get PR_SET_PDEATHSIG, which fires when the spawning thread exits.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let granary_bin = std::path::absolute(&args.granary_bin).context("resolving --granary-bin")?;
    let state_dir = std::path::absolute(&args.state_dir).context("resolving --state-dir")?;
    std::fs::create_dir_all(&state_dir).with_context(|| format!("creating {}", state_dir.display()))?;
    let client = connect(&args.kubeconfig).await?;
    let cluster = current_cluster(&args.kubeconfig)?;
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let settings = Settings {
        node_name: args.node_name,
        granary_bin,
        state_dir,
        cpu: args.cpu,
        memory: args.memory,
        cluster: Some(cluster),
    };
    run(client, settings, shutdown).await?;
    eprintln!("[node] stopped");
    Ok(())
}
