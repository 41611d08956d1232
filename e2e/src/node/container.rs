//! One container of a running pod: its process, restarts with back-off, and readiness.

use super::launch::Launch;
use super::probe::Prober;
use super::process;
use super::status::{ContainerView, Ended, State, now};
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::path::Path;
use std::process::Child;
use std::time::Duration;
use tokio::time::Instant;

/// The first restart delay; it doubles after each restart up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest restart delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run at least this long resets the back-off.
const STABLE_RUN: Duration = Duration::from_secs(60);

/// Whether a container that exited with `exit_code` runs again under `restart_policy`
/// (`Always`, the default, `OnFailure` or `Never`).
pub fn should_restart(restart_policy: Option<&str>, exit_code: i32) -> bool {
    match restart_policy.unwrap_or("Always") {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The delay before the next restart and the back-off after it, for a run that lasted `ran`.
pub fn backoff(current: Duration, ran: Duration) -> (Duration, Duration) {
    let delay = if ran >= STABLE_RUN { FIRST_BACKOFF } else { current };
    (delay, (delay * 2).min(MAX_BACKOFF))
}

/// A live process of a container.
pub struct Run {
    /// The child process (leader of its own process group).
    pub child: Child,
    /// When it started (API time).
    pub started: Time,
    /// When it started (monotonic).
    pub since: Instant,
}

/// The agent's view of one container of a pod.
pub struct ContainerRt {
    /// The container's spec.
    pub spec: Container,
    /// What is running, if anything.
    pub run: Option<Run>,
    /// Its state for the status.
    pub state: State,
    /// The previous run.
    pub last: Option<Ended>,
    /// How often it was restarted.
    pub restarts: i32,
    /// When to (re)start it; `None` once it is running or done for good.
    pub start_at: Option<Instant>,
    /// Readiness.
    pub prober: Prober,
    /// The program that ran last (for `imageID`).
    pub program: String,
    backoff: Duration,
}

impl ContainerRt {
    /// A container waiting for its first start.
    pub fn new(spec: Container, prober: Prober) -> Self {
        let state = State::Waiting { reason: "ContainerCreating".into(), message: None };
        let start_at = Some(Instant::now());
        Self {
            spec,
            run: None,
            state,
            last: None,
            restarts: 0,
            start_at,
            prober,
            program: String::new(),
            backoff: FIRST_BACKOFF,
        }
    }

    /// Starts the process of `launch` (a restart when it ran before); a failure to spawn counts as
    /// an exit with code 128.
    pub fn start(&mut self, launch: &Launch, dir: &Path, log: &Path, restart_policy: Option<&str>) {
        if self.last.is_some() {
            self.restarts += 1;
        }
        self.program = launch.program.display().to_string();
        self.start_at = None;
        match process::spawn(launch, dir, log) {
            Ok(child) => {
                let since = Instant::now();
                let started = now();
                self.state = State::Running { pid: child.id(), started: started.clone() };
                self.prober.restart(since);
                self.run = Some(Run { child, started, since });
            }
            Err(err) => {
                eprintln!("[node] cannot start {}: {err}", self.program);
                let t = now();
                let ended = Ended { exit_code: 128, started: t.clone(), finished: t, pid: 0 };
                self.ended(ended, Duration::ZERO, restart_policy);
            }
        }
    }

    /// Holds the container back with a configuration problem, to retry after `retry`.
    pub fn cannot_start(&mut self, reason: &str, message: String, retry: Duration) {
        self.state = State::Waiting { reason: reason.into(), message: Some(message) };
        self.start_at = Some(Instant::now() + retry);
    }

    /// Checks whether the process exited; if so, kills what is left of its group and schedules a
    /// restart as `restart_policy` says. True when something changed.
    pub fn poll(&mut self, restart_policy: Option<&str>) -> bool {
        let Some(run) = self.run.as_mut() else { return false };
        let Some(exit_code) = process::poll(&mut run.child) else { return false };
        let pid = run.child.id();
        process::signal_group(pid, libc::SIGKILL);
        let ran = run.since.elapsed();
        let ended = Ended { exit_code, started: run.started.clone(), finished: now(), pid };
        self.run = None;
        self.ended(ended, ran, restart_policy);
        true
    }

    fn ended(&mut self, ended: Ended, ran: Duration, restart_policy: Option<&str>) {
        if should_restart(restart_policy, ended.exit_code) {
            let (delay, next) = backoff(self.backoff, ran);
            self.backoff = next;
            let message =
                format!("back-off {}s restarting failed container={}", delay.as_secs(), self.spec.name);
            self.state = State::Waiting { reason: "CrashLoopBackOff".into(), message: Some(message) };
            self.start_at = Some(Instant::now() + delay);
            self.last = Some(ended);
        } else {
            self.state = State::Terminated(ended);
            self.start_at = None;
        }
    }

    /// Records the exit codes of a forced stop (pod deletion).
    pub fn stopped(&mut self, exit_code: Option<i32>) {
        if let Some(run) = self.run.take() {
            let pid = run.child.id();
            let code = exit_code.unwrap_or(128 + libc::SIGKILL);
            self.state =
                State::Terminated(Ended { exit_code: code, started: run.started, finished: now(), pid });
        }
        self.start_at = None;
    }

    /// What the status reports about this container.
    pub fn view(&self) -> ContainerView {
        ContainerView {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            program: self.program.clone(),
            state: self.state.clone(),
            last: self.last.clone(),
            restarts: self.restarts,
            ready: self.run.is_some() && self.prober.ready(),
            note: self.prober.note(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_policies() {
        assert!(should_restart(None, 0) && should_restart(Some("Always"), 1));
        assert!(should_restart(Some("OnFailure"), 2) && !should_restart(Some("OnFailure"), 0));
        assert!(!should_restart(Some("Never"), 1) && !should_restart(Some("Never"), 0));
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_resets_after_a_stable_run() {
        let mut current = FIRST_BACKOFF;
        let mut delays = Vec::new();
        for _ in 0..7 {
            let (delay, next) = backoff(current, Duration::from_secs(1));
            delays.push(delay.as_secs());
            current = next;
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(MAX_BACKOFF, STABLE_RUN), (FIRST_BACKOFF, Duration::from_secs(2)));
    }
}
