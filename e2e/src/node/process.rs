//! Container processes. Each runs in its own session (so its own process group, which every
//! signal goes to), in the pod's directory, with stdout and stderr appended to one log file, and
//! with `PR_SET_PDEATHSIG=SIGKILL` so that it dies with the agent. The agent runs them as its
//! own user: the pod's `securityContext` is ignored.

use super::launch::Launch;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// Starts `launch` in `dir`, appending its output to `log` after a line saying what starts.
///
/// The death signal fires when the *thread* that spawned the child exits, so call this from a
/// thread that lives as long as the agent (the agent runs on a current-thread runtime).
pub fn spawn(launch: &Launch, dir: &Path, log: &Path) -> std::io::Result<Child> {
    let mut out = OpenOptions::new().create(true).append(true).open(log)?;
    let stamp = super::status::now().0;
    writeln!(out, "--- {stamp} granary-e2e-node starts {} {:?}", launch.program.display(), launch.args)?;
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .env_clear()
        .envs(&launch.env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure only calls async-signal-safe functions (setsid, prctl, getppid).
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The agent died before the death signal was armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("granary-e2e-node exited"));
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Sends `signal` to the process group led by `pid` (errors, e.g. no such group, are ignored).
pub fn signal_group(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    if pid > 1 {
        // SAFETY: kill(2) on a process group this agent created.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

/// The exit code Kubernetes reports: the code, or 128 + the signal that killed the process.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Polls `child` for an exit; `None` while it runs (or when it cannot be polled).
pub fn poll(child: &mut Child) -> Option<i32> {
    match child.try_wait() {
        Ok(Some(status)) => Some(exit_code(status)),
        Ok(None) => None,
        // Already reaped elsewhere: report it as killed.
        Err(_) => Some(128 + libc::SIGKILL),
    }
}

/// Stops the process groups of `children`: SIGTERM, up to `grace` to exit, then SIGKILL (and up
/// to 5 s more to be reaped). Returns each child's exit code (`None` if it never got reaped).
pub async fn stop(children: &mut [&mut Child], grace: Duration) -> Vec<Option<i32>> {
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    for child in children.iter() {
        signal_group(child.id(), libc::SIGTERM);
    }
    let mut killed = false;
    let deadline = Instant::now() + grace;
    let hard_deadline = deadline + Duration::from_secs(5);
    loop {
        for (child, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                *code = poll(child);
            }
        }
        if codes.iter().all(Option::is_some) || Instant::now() >= hard_deadline {
            break;
        }
        if !killed && Instant::now() >= deadline {
            killed = true;
            for (child, code) in children.iter().zip(&codes) {
                if code.is_none() {
                    signal_group(child.id(), libc::SIGKILL);
                }
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    // Whatever is left in the groups (the leaders' children) goes too.
    for child in children.iter() {
        signal_group(child.id(), libc::SIGKILL);
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sh(script: &str) -> Launch {
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        Launch { program: "sh".into(), args: vec!["-c".into(), script.into()], env }
    }

    #[tokio::test]
    async fn processes_log_to_their_file_and_stop_gracefully_or_by_force() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("c.log");
        let mut quick =
            spawn(&sh("echo out; echo err >&2; echo $PATH; pwd; exit 3"), dir.path(), &log).unwrap();
        let start = Instant::now();
        let code = loop {
            if let Some(code) = poll(&mut quick) {
                break code;
            }
            assert!(start.elapsed() < Duration::from_secs(10));
            sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(code, 3);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("starts sh") && text.contains("out\nerr\n/usr/bin:/bin\n"), "{text}");

        let mut polite =
            spawn(&sh("trap 'exit 0' TERM; while :; do sleep 0.05; done"), dir.path(), &log).unwrap();
        let mut stubborn = spawn(&sh("trap '' TERM; sleep 30 & wait"), dir.path(), &log).unwrap();
        sleep(Duration::from_millis(300)).await;
        let codes = stop(&mut [&mut polite, &mut stubborn], Duration::from_millis(500)).await;
        assert_eq!(codes, [Some(0), Some(128 + libc::SIGKILL)]);
    }
}
