//! A test-only node agent, a kubelet stand-in: it lets a real Kubernetes control plane without
//! kubelet or container runtime run pods, as local processes on 127.0.0.1. Nothing of it ships in
//! the product; the `granary-e2e-node` binary runs it.
//!
//! What it does:
//! - **Node**: registers a Node (labels `kubernetes.io/{hostname,os,arch}`, InternalIP 127.0.0.1,
//!   nominal capacity), reports it `Ready`, and every 10 s refreshes its status heartbeat and
//!   renews its Lease in `kube-node-lease` ([`registration`]).
//! - **Pods**: watches the pods bound to the node (`spec.nodeName`) and runs each container as a
//!   process. The image is ignored: a container without `command`, or whose `command[0]` is
//!   named `granary`, runs the agent's `--granary-bin`; any other command runs as given
//!   ([`launch`]). The environment is built as Kubernetes builds it, `envFrom` and `env` with
//!   `$(VAR)` expansion, `fieldRef`s, and Secret/ConfigMap keys read from the API ([`env`]), over
//!   what stands for the image's environment: the agent's own `PATH`, `GRANARY_LOG`,
//!   `GRANARY_PYTHON` and `VIRTUAL_ENV` ([`launch::INHERITED`]), so `python.map` stages run with
//!   the Python the agent was started with (scripts/test exports `GRANARY_PYTHON`, a venv with
//!   NumPy, before e2e/cluster/up starts the agent).
//! - **ConfigMap and Secret volumes**: each `configMap` and `secret` volume a container mounts
//!   is written out as files (Secrets' readable by the agent's user only)
//!   under the pod's directory, and its `mountPath` is mapped to that folder in the command, args
//!   and env values: a value (or `:`-separated element) equal to the `mountPath` or under it
//!   names the host folder instead ([`volumes`]). So `PYTHONPATH=/etc/granary/python` finds the
//!   modules of the ConfigMap mounted there.
//! - **Loopback ports**: all pods share 127.0.0.1, so each declared `containerPort` of a pod is
//!   given a free host port, and the pod's args and env values are rewritten: `0.0.0.0` becomes
//!   `127.0.0.1` and `:<containerPort>` becomes `:<hostPort>` ([`ports`]). A pod thus sees its
//!   container ports remapped; the mapping is logged and written to the pod annotation
//!   [`ports::PORTS_ANNOTATION`]. The pod IP and host IP are 127.0.0.1.
//! - **Services**: every `<service>.<namespace>.svc[.cluster.local]:<port>` in a pod's args and env
//!   values becomes `127.0.0.1:<port>` of a TCP proxy the agent runs for that Service port, which
//!   joins each connection to a Ready pod the Service selects ([`services`]); the address is
//!   stable for the agent's lifetime and written to the Service's annotation
//!   [`services::ADDRESSES_ANNOTATION`]. A kube-proxy and cluster-DNS stand-in: the endpoints
//!   controller publishes no loopback address, and nothing resolves `*.svc` names here.
//! - **ServiceAccount credentials**: a pod that mounts its ServiceAccount's token (the default)
//!   gets `KUBECONFIG`, a kubeconfig naming the agent's API server and reading a token of its
//!   ServiceAccount, bound to the pod, from the TokenRequest API, refreshed every 20 minutes
//!   ([`credentials`]). One host cannot give each process the fixed in-cluster token path.
//! - **Readiness**: `tcpSocket` and `httpGet` readiness probes on the mapped ports ([`probe`]);
//!   the pod's `Ready` condition is what Deployments count.
//! - **Status and restarts**: the pod status (phase, conditions, container states, restart
//!   counts) is patched whenever it changes ([`status`]); exited containers restart as the pod's
//!   `restartPolicy` says, after a back-off of 1 s doubling up to 30 s ([`container`]).
//! - **Deletion**: a pod with a `deletionTimestamp` gets SIGTERM to each process group, then
//!   SIGKILL after its grace period (at least 2 s), and is then deleted with grace period 0 and a
//!   uid precondition, as kubelets do. A pod that vanishes from the API (force deletion, or a
//!   relist without it) loses its processes within 2 s.
//! - **Agent exit**: on SIGTERM/SIGINT every pod's process groups are stopped (API objects are left
//!   alone). If the agent is SIGKILLed, `PR_SET_PDEATHSIG` kills the container processes, but not
//!   processes they started themselves (e.g. a `sh -c` pipeline's children).
//!
//! Each pod lives in `<state-dir>/pods/<namespace>_<name>_<uid prefix>/`: the working directory of
//! its processes, `tmp/` (their `HOME` and `TMPDIR`, standing for an `emptyDir` at /tmp),
//! `volumes/<volume>/` (its ConfigMap and Secret volumes' files), and one `<container>.log` per container
//! with its stdout and stderr.
//!
//! Not supported: init and ephemeral containers (the pod fails with reason `Unsupported`), exec
//! and HTTPS probes (the container never becomes ready, and its status says so), liveness and
//! startup probes (ignored), volumes other than ConfigMaps, Secrets and the pod's tmp dir (their
//! mounts are ignored), a ConfigMap's `binaryData`, resource limits, and `securityContext`: processes
//! run as the agent's own user. Bare port numbers in args (`--port 7071`) are not remapped, and
//! mapped mount paths are visible to a process only where it reads them from its args or env.

pub mod agent;
pub mod api;
pub mod container;
pub mod credentials;
pub mod env;
pub mod expand;
pub mod launch;
pub mod pod;
pub mod ports;
pub mod probe;
pub mod process;
pub mod registration;
pub mod services;
pub mod status;
pub mod volumes;

use k8s_openapi::api::core::v1::Pod;
use std::fmt::Arguments;
use std::path::PathBuf;

pub use agent::run;

/// The agent's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The Node's name.
    pub node_name: String,
    /// The program that stands for the image's `granary` entrypoint.
    pub granary_bin: PathBuf,
    /// Where per-pod directories and logs go.
    pub state_dir: PathBuf,
    /// The CPU capacity the node reports (nominal: nothing is enforced).
    pub cpu: String,
    /// The memory capacity the node reports (nominal: nothing is enforced).
    pub memory: String,
    /// The API server as a kubeconfig's named cluster entry (`{name, cluster: {server, ...}}`),
    /// for the kubeconfigs of pods' ServiceAccounts; `None`: pods get no credentials.
    pub cluster: Option<serde_json::Value>,
}

impl Settings {
    /// Settings for unit tests.
    #[cfg(test)]
    pub fn for_tests() -> Self {
        Self {
            node_name: "node-1".into(),
            granary_bin: "/b/granary".into(),
            state_dir: "/tmp/state".into(),
            cpu: "32".into(),
            memory: "64Gi".into(),
            cluster: None,
        }
    }
}

/// What a pod's supervisor learns from the agent.
#[derive(Clone, Debug)]
pub enum Update {
    /// The pod's latest version.
    Pod(Box<Pod>),
    /// The pod vanished from the API: stop its processes at once.
    Gone,
    /// The agent stops: stop the processes, leave the API object alone.
    Shutdown,
}

/// Logs one line on stderr with the `[node]` prefix.
pub fn log(args: Arguments<'_>) {
    eprintln!("[node] {args}");
}
