//! A pod's `status` as a kubelet would report it, built from what the agent knows about its
//! processes. The Deployment and ReplicaSet controllers count ready replicas by the `Ready`
//! condition, which is `True` exactly when every container runs and passes its readiness probe.

use super::env::LOOPBACK;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// The current time as Kubernetes writes it.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One run of a container that has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The exit code (128 + the signal number for a process killed by a signal).
    pub exit_code: i32,
    /// When it started.
    pub started: Time,
    /// When it ended.
    pub finished: Time,
    /// Its process id.
    pub pid: u32,
}

/// What a container is doing now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not running: not started yet, waiting for a restart, or unable to start.
    Waiting {
        /// A Kubernetes-style reason (`ContainerCreating`, `CrashLoopBackOff`, ...).
        reason: String,
        /// Details, if any.
        message: Option<String>,
    },
    /// Running as process `pid` since `started`.
    Running {
        /// The process id.
        pid: u32,
        /// When it started.
        started: Time,
    },
    /// Ended and not going to run again.
    Terminated(Ended),
}

/// What the status reports about one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerView {
    /// The container's name.
    pub name: String,
    /// The image named in the spec (never pulled).
    pub image: String,
    /// The program that stands for the image.
    pub program: String,
    /// The current state.
    pub state: State,
    /// The previous run, if there was one.
    pub last: Option<Ended>,
    /// How often the container was restarted.
    pub restarts: i32,
    /// Whether it runs and passes its readiness probe.
    pub ready: bool,
    /// A note on readiness (e.g. an unsupported probe), reported when the container waits or runs.
    pub note: Option<String>,
}

fn terminated(e: &Ended) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: e.exit_code,
        reason: Some(if e.exit_code == 0 { "Completed" } else { "Error" }.into()),
        started_at: Some(e.started.clone()),
        finished_at: Some(e.finished.clone()),
        container_id: Some(format!("granary-e2e://{}", e.pid)),
        ..Default::default()
    }
}

fn container_status(c: &ContainerView) -> ContainerStatus {
    let (state, pid) = match &c.state {
        State::Waiting { reason, message } => {
            let message = message.clone().or_else(|| c.note.clone());
            let waiting = ContainerStateWaiting { reason: Some(reason.clone()), message };
            (ContainerState { waiting: Some(waiting), ..Default::default() }, None)
        }
        State::Running { pid, started } => {
            let running = ContainerStateRunning { started_at: Some(started.clone()) };
            (ContainerState { running: Some(running), ..Default::default() }, Some(*pid))
        }
        State::Terminated(e) => {
            (ContainerState { terminated: Some(terminated(e)), ..Default::default() }, Some(e.pid))
        }
    };
    let last = ContainerState { terminated: c.last.as_ref().map(terminated), ..Default::default() };
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: format!("granary-e2e://{}", c.program),
        container_id: pid.map(|pid| format!("granary-e2e://{pid}")),
        ready: c.ready,
        started: Some(matches!(c.state, State::Running { .. })),
        restart_count: c.restarts,
        state: Some(state),
        last_state: Some(last),
        ..Default::default()
    }
}

/// The pod phase Kubernetes derives from its containers: `Pending` while one has never run,
/// `Running` while one runs or will be restarted, then `Succeeded` if all exited 0, else `Failed`.
pub fn phase(containers: &[ContainerView]) -> &'static str {
    let never_ran = |c: &ContainerView| matches!(c.state, State::Waiting { .. }) && c.last.is_none();
    let live = |c: &ContainerView| !matches!(c.state, State::Terminated(_));
    if containers.is_empty() || containers.iter().any(never_ran) {
        "Pending"
    } else if containers.iter().any(live) {
        "Running"
    } else if containers.iter().all(|c| matches!(&c.state, State::Terminated(e) if e.exit_code == 0)) {
        "Succeeded"
    } else {
        "Failed"
    }
}

/// The last transition time of each condition, kept across status updates.
#[derive(Clone, Debug, Default)]
pub struct Transitions(BTreeMap<String, (bool, Time)>);

impl Transitions {
    /// The condition `kind` with `status`, its transition time moved to `now` if it changed.
    pub fn condition(
        &mut self,
        kind: &str,
        status: bool,
        reason: Option<String>,
        now: &Time,
    ) -> PodCondition {
        let entry = self.0.entry(kind.into()).or_insert_with(|| (status, now.clone()));
        if entry.0 != status {
            *entry = (status, now.clone());
        }
        PodCondition {
            type_: kind.into(),
            status: if status { "True" } else { "False" }.into(),
            reason,
            last_transition_time: Some(entry.1.clone()),
            ..Default::default()
        }
    }
}

/// A pod's status. `failure` is a pod-level (reason, message) that fails the pod outright.
pub fn pod_status(
    containers: &[ContainerView],
    failure: Option<(&str, &str)>,
    start_time: &Time,
    transitions: &mut Transitions,
    now: &Time,
) -> PodStatus {
    let phase = if failure.is_some() { "Failed" } else { phase(containers) };
    let terminal = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<&str> = containers.iter().filter(|c| !c.ready).map(|c| c.name.as_str()).collect();
    let ready = !terminal && unready.is_empty() && !containers.is_empty();
    let not_ready_reason = || Some(if terminal { "PodCompleted" } else { "ContainersNotReady" }.to_string());
    let mut conditions = vec![
        transitions.condition("Initialized", true, None, now),
        transitions.condition("Ready", ready, (!ready).then(not_ready_reason).flatten(), now),
        transitions.condition("ContainersReady", ready, (!ready).then(not_ready_reason).flatten(), now),
        transitions.condition("PodScheduled", true, None, now),
    ];
    // Why a container cannot become ready goes with the list (a running state has no message).
    let notes: String = containers
        .iter()
        .filter_map(|c| c.note.as_ref().map(|note| format!("; {}: {note}", c.name)))
        .collect();
    for c in conditions.iter_mut().filter(|c| c.status == "False" && !terminal) {
        c.message = Some(format!("containers with unready status: [{}]{notes}", unready.join(" ")));
    }
    PodStatus {
        phase: Some(phase.into()),
        reason: failure.map(|f| f.0.to_string()),
        message: failure.map(|f| f.1.to_string()),
        host_ip: Some(LOOPBACK.into()),
        pod_ip: Some(LOOPBACK.into()),
        pod_ips: Some(vec![PodIP { ip: LOOPBACK.into() }]),
        start_time: Some(start_time.clone()),
        conditions: Some(conditions),
        container_statuses: Some(containers.iter().map(container_status).collect()),
        ..Default::default()
    }
}

/// The JSON merge patch that replaces a pod's status with `status`, clearing a stale
/// `reason`/`message` too.
pub fn status_patch(status: &PodStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.entry("reason").or_insert(serde_json::Value::Null);
        map.entry("message").or_insert(serde_json::Value::Null);
    }
    serde_json::json!({ "status": value })
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
