//! What to run for one container: the program, its arguments and its environment.
//!
//! The image is ignored. A container without `command`, or whose `command[0]` is named `granary`,
//! runs the agent's `--granary-bin`; any other command runs as given (found on `PATH`).

use super::env::{Sources, container_env};
use super::expand::expand;
use super::ports::PortMap;
use super::services::{self, ServiceRef};
use super::volumes::Mounts;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `PATH` when the agent itself has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One container's process, ready to spawn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The program (a path, or a name looked up on the `PATH` of `env`).
    pub program: PathBuf,
    /// The arguments after the program.
    pub args: Vec<String>,
    /// The whole environment of the process.
    pub env: BTreeMap<String, String>,
}

/// The program and arguments for a container's (expanded) `command` and `args`.
pub fn program_and_args(command: &[String], args: &[String], granary_bin: &Path) -> (PathBuf, Vec<String>) {
    match command.split_first() {
        None => (granary_bin.to_path_buf(), args.to_vec()),
        Some((first, rest)) => {
            let program = if Path::new(first).file_name().is_some_and(|n| n == "granary") {
                granary_bin.to_path_buf()
            } else {
                PathBuf::from(first)
            };
            (program, rest.iter().chain(args).cloned().collect())
        }
    }
}

/// The agent's own variables its processes inherit, standing for what an image's environment
/// would set: `PATH`, the log level `GRANARY_LOG`, and the Python of `python.map` stages
/// (`GRANARY_PYTHON`, else `VIRTUAL_ENV`'s, as `granary worker` looks for it). A container's own
/// `env` overrides them.
pub const INHERITED: [&str; 4] = ["PATH", "GRANARY_LOG", "GRANARY_PYTHON", "VIRTUAL_ENV"];

/// The [`INHERITED`] variables the agent has (set and not empty).
pub fn inherited_env() -> BTreeMap<String, String> {
    INHERITED
        .iter()
        .filter_map(|name| Some((name.to_string(), std::env::var(name).ok().filter(|v| !v.is_empty())?)))
        .collect()
}

/// What a process gets before the container's own variables: `inherited` (the [`INHERITED`]
/// variables of the agent; `PATH` defaults to the usual folders), `HOME` and `TMPDIR` set to the
/// pod's tmp dir, `HOSTNAME`, and `NO_COLOR` (the output goes to a log file, as a container
/// runtime's would).
pub fn base_env(
    inherited: &BTreeMap<String, String>,
    tmp: &Path,
    hostname: &str,
) -> BTreeMap<String, String> {
    let tmp = tmp.to_string_lossy().into_owned();
    let mut env: BTreeMap<String, String> = inherited
        .iter()
        .filter(|(k, _)| INHERITED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.to_string());
    env.extend([
        ("HOME".to_string(), tmp.clone()),
        ("TMPDIR".to_string(), tmp),
        ("HOSTNAME".to_string(), hostname.to_string()),
        ("NO_COLOR".to_string(), "1".to_string()),
    ]);
    env
}

/// How a container reaches Services: the loopback address standing for a Service port, if any
/// ([`services`]).
pub type ServiceResolver<'a> = &'a dyn Fn(&ServiceRef) -> Option<String>;

/// The process for `container` of `pod`: its env built the Kubernetes way, `$(VAR)` expanded in
/// command and args, then every argument and env value rewritten: Service addresses through
/// `services`, the rest through `ports` and `mounts` (the program too through `mounts`). `base`
/// is the environment under the container's own. An error is a configuration problem of the pod.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    pod: &Pod,
    container: &Container,
    sources: &Sources,
    ports: &PortMap,
    mounts: &Mounts,
    services: ServiceResolver<'_>,
    granary_bin: &Path,
    base: BTreeMap<String, String>,
) -> Result<Launch, String> {
    let own = container_env(pod, container, sources)?;
    let lookup = |name: &str| own.get(name).map(String::as_str);
    let command: Vec<String> =
        container.command.iter().flatten().map(|c| mounts.rewrite(&expand(c, lookup))).collect();
    let args: Vec<String> = container.args.iter().flatten().map(|a| expand(a, lookup)).collect();
    let (program, args) = program_and_args(&command, &args, granary_bin);
    let rewrite =
        |value: &str| services::rewrite(value, services, |text: &str| mounts.rewrite(&ports.rewrite(text)));
    let args = args.iter().map(|a| rewrite(a)).collect();
    let mut env = base;
    env.extend(own.iter().map(|(k, v)| (k.clone(), rewrite(v))));
    Ok(Launch { program, args, env })
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
