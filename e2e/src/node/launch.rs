//! What to run for one container: the program, its arguments and its environment.
//!
//! The image is ignored. A container without `command`, or whose `command[0]` is named `granary`,
//! runs the agent's `--granary-bin`; any other command runs as given (found on `PATH`).

use super::env::{Sources, container_env};
use super::expand::expand;
use super::ports::PortMap;
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

/// What a process gets before the container's own variables: `PATH` and `GRANARY_LOG` from the
/// agent (`path`, `granary_log`), `HOME` and `TMPDIR` set to the pod's tmp dir, `HOSTNAME`, and
/// `NO_COLOR` (the output goes to a log file, as a container runtime's would).
pub fn base_env(
    path: Option<&str>,
    granary_log: Option<&str>,
    tmp: &Path,
    hostname: &str,
) -> BTreeMap<String, String> {
    let tmp = tmp.to_string_lossy().into_owned();
    let mut env = BTreeMap::from([
        ("PATH".to_string(), path.unwrap_or(DEFAULT_PATH).to_string()),
        ("HOME".to_string(), tmp.clone()),
        ("TMPDIR".to_string(), tmp),
        ("HOSTNAME".to_string(), hostname.to_string()),
        ("NO_COLOR".to_string(), "1".to_string()),
    ]);
    if let Some(level) = granary_log {
        env.insert("GRANARY_LOG".into(), level.into());
    }
    env
}

/// The process for `container` of `pod`: its env built the Kubernetes way, `$(VAR)` expanded in
/// command and args, then every argument and env value rewritten through `ports`. `base` is the
/// environment under the container's own. An error is a configuration problem of the pod.
pub fn launch(
    pod: &Pod,
    container: &Container,
    sources: &Sources,
    ports: &PortMap,
    granary_bin: &Path,
    base: BTreeMap<String, String>,
) -> Result<Launch, String> {
    let own = container_env(pod, container, sources)?;
    let lookup = |name: &str| own.get(name).map(String::as_str);
    let command: Vec<String> = container.command.iter().flatten().map(|c| expand(c, lookup)).collect();
    let args: Vec<String> = container.args.iter().flatten().map(|a| expand(a, lookup)).collect();
    let (program, args) = program_and_args(&command, &args, granary_bin);
    let args = args.iter().map(|a| ports.rewrite(a)).collect();
    let mut env = base;
    env.extend(own.iter().map(|(k, v)| (k.clone(), ports.rewrite(v))));
    Ok(Launch { program, args, env })
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
