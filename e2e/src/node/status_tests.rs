use super::*;
use k8s_openapi::jiff::Timestamp;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn ended(exit_code: i32) -> Ended {
    Ended { exit_code, started: at(1), finished: at(2), pid: 42 }
}

fn view(state: State, ready: bool) -> ContainerView {
    ContainerView {
        name: "worker".into(),
        image: "img".into(),
        program: "/b/granary".into(),
        state,
        last: None,
        restarts: 0,
        ready,
        note: None,
    }
}

fn running(ready: bool) -> ContainerView {
    view(State::Running { pid: 7, started: at(1) }, ready)
}

fn waiting(reason: &str) -> State {
    State::Waiting { reason: reason.into(), message: None }
}

fn condition<'a>(status: &'a PodStatus, kind: &str) -> &'a PodCondition {
    status.conditions.iter().flatten().find(|c| c.type_ == kind).unwrap()
}

#[test]
fn phases_follow_the_containers() {
    assert_eq!(phase(&[view(waiting("ContainerCreating"), false)]), "Pending");
    assert_eq!(phase(&[running(false), view(waiting("CreateContainerConfigError"), false)]), "Pending");
    assert_eq!(phase(&[running(false)]), "Running");
    let mut backing_off = view(waiting("CrashLoopBackOff"), false);
    backing_off.last = Some(ended(1));
    assert_eq!(phase(&[backing_off]), "Running");
    assert_eq!(phase(&[view(State::Terminated(ended(0)), false), running(true)]), "Running");
    assert_eq!(phase(&[view(State::Terminated(ended(0)), false)]), "Succeeded");
    let mixed = [view(State::Terminated(ended(0)), false), view(State::Terminated(ended(137)), false)];
    assert_eq!(phase(&mixed), "Failed");
}

#[test]
fn ready_needs_every_container_ready_and_keeps_transition_times() {
    let mut transitions = Transitions::default();
    let status = pod_status(&[running(true), running(false)], None, &at(0), &mut transitions, &at(10));
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ready = condition(&status, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("ContainersNotReady")));
    assert_eq!(ready.message.as_deref(), Some("containers with unready status: [worker]"));
    assert_eq!(condition(&status, "Initialized").status, "True");
    assert_eq!(condition(&status, "PodScheduled").status, "True");

    let status = pod_status(&[running(true)], None, &at(0), &mut transitions, &at(20));
    for kind in ["Ready", "ContainersReady"] {
        let c = condition(&status, kind);
        assert_eq!((c.status.as_str(), c.last_transition_time.clone()), ("True", Some(at(20))));
        assert_eq!((c.reason.as_ref(), c.message.as_ref()), (None, None));
    }
    // Unchanged conditions keep their time.
    assert_eq!(condition(&status, "Initialized").last_transition_time, Some(at(10)));
    let status = pod_status(&[running(true)], None, &at(0), &mut transitions, &at(30));
    assert_eq!(condition(&status, "Ready").last_transition_time, Some(at(20)));

    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "127.0.0.1");
    assert_eq!(status.start_time, Some(at(0)));
}

#[test]
fn container_statuses_report_state_last_state_and_ids() {
    let mut c = running(true);
    c.restarts = 2;
    c.last = Some(ended(1));
    let status = pod_status(&[c], None, &at(0), &mut Transitions::default(), &at(5));
    let s = &status.container_statuses.as_ref().unwrap()[0];
    assert_eq!(
        (s.name.as_str(), s.image.as_str(), s.image_id.as_str()),
        ("worker", "img", "granary-e2e:///b/granary")
    );
    assert_eq!(s.container_id.as_deref(), Some("granary-e2e://7"));
    assert_eq!((s.ready, s.started, s.restart_count), (true, Some(true), 2));
    assert_eq!(s.state.as_ref().unwrap().running.as_ref().unwrap().started_at, Some(at(1)));
    let last = s.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
    assert_eq!(last.container_id.as_deref(), Some("granary-e2e://42"));

    let mut c = view(waiting("ContainerCreating"), false);
    c.note = Some("exec probes are not supported".into());
    let status = pod_status(&[c], None, &at(0), &mut Transitions::default(), &at(5));
    let s = &status.container_statuses.as_ref().unwrap()[0];
    let w = s.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(w.message.as_deref(), Some("exec probes are not supported"));
    assert_eq!((s.container_id.as_ref(), s.started), (None, Some(false)));
    assert_eq!(status.phase.as_deref(), Some("Pending"));

    let mut c = running(false);
    c.note = Some("exec probes are not supported".into());
    let status = pod_status(&[c], None, &at(0), &mut Transitions::default(), &at(5));
    let message = condition(&status, "Ready").message.clone().unwrap();
    assert_eq!(message, "containers with unready status: [worker]; worker: exec probes are not supported");
}

#[test]
fn failures_and_completion_end_the_pod_unready() {
    let mut t = Transitions::default();
    let status = pod_status(&[], Some(("Unsupported", "init containers")), &at(0), &mut t, &at(1));
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(
        (status.reason.as_deref(), status.message.as_deref()),
        (Some("Unsupported"), Some("init containers"))
    );
    let patch = status_patch(&status);
    assert_eq!(patch["status"]["reason"], "Unsupported");

    let done = view(State::Terminated(ended(0)), false);
    let status = pod_status(&[done], None, &at(0), &mut Transitions::default(), &at(1));
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    let ready = condition(&status, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("PodCompleted")));
    let terminated =
        status.container_statuses.as_ref().unwrap()[0].state.clone().unwrap().terminated.unwrap();
    assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (0, Some("Completed")));
    let patch = status_patch(&status);
    assert!(patch["status"]["reason"].is_null() && patch["status"].get("reason").is_some());
    assert_eq!(patch["status"]["phase"], "Succeeded");
}
