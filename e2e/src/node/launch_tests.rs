use super::*;
use crate::node::env::field_value;
use crate::node::volumes::Mounts;
use serde_json::json;

/// A pod like the operator's worker pods (see `operator/src/objects.rs`).
pub(crate) fn worker_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "w-1", "namespace": "ns", "uid": "u-1", "labels": {"app": "w"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{
                "name": "worker",
                "image": "ghcr.io/granary-dev/granary:0.1.0",
                "args": ["worker", "--listen", "0.0.0.0:7071", "--pipeline", "ns/p",
                         "--metrics-addr", "0.0.0.0:9090"],
                "env": [
                    {"name": "GRANARY_DISPATCHER", "value": "granary-dispatcher.ns.svc:7070"},
                    {"name": "GRANARY_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "GRANARY_ADVERTISE", "value": "$(GRANARY_POD_IP):7071"},
                ],
                "envFrom": [{"secretRef": {"name": "creds", "optional": true}}],
                "ports": [{"name": "data", "containerPort": 7071}, {"name": "metrics", "containerPort": 9090}],
                "readinessProbe": {"tcpSocket": {"port": "data"}, "periodSeconds": 5},
            }],
        },
    }))
    .unwrap()
}

fn ports() -> PortMap {
    PortMap { ports: [(7071, 40001), (9090, 40002)].into() }
}

fn secret(name: &str, pairs: &[(&str, &str)]) -> Sources {
    let data = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Sources { secrets: [(name.to_string(), Some(data))].into(), ..Default::default() }
}

#[test]
fn the_worker_pod_runs_granary_bin_with_mapped_ports_and_expanded_env() {
    let pod = worker_pod();
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let agent =
        BTreeMap::from([("PATH".to_string(), "/bin".to_string()), ("GRANARY_LOG".into(), "debug".into())]);
    let base = base_env(&agent, Path::new("/state/tmp"), "w-1");
    let l = launch(
        &pod,
        c,
        &Sources::default(),
        &ports(),
        &Mounts::default(),
        &|_| None,
        Path::new("/b/granary"),
        base,
    )
    .unwrap();
    assert_eq!(l.program, Path::new("/b/granary"));
    let args =
        ["worker", "--listen", "127.0.0.1:40001", "--pipeline", "ns/p", "--metrics-addr", "127.0.0.1:40002"];
    assert_eq!(l.args, args);
    assert_eq!(l.env["GRANARY_ADVERTISE"], "127.0.0.1:40001");
    assert_eq!(l.env["GRANARY_POD_IP"], "127.0.0.1");
    assert_eq!(l.env["GRANARY_DISPATCHER"], "granary-dispatcher.ns.svc:7070");
    assert_eq!((l.env["PATH"].as_str(), l.env["GRANARY_LOG"].as_str()), ("/bin", "debug"));
    assert_eq!((l.env["HOME"].as_str(), l.env["TMPDIR"].as_str()), ("/state/tmp", "/state/tmp"));
    assert_eq!(l.env["NO_COLOR"], "1");
    assert_eq!(l.env.len(), 9);
}

#[test]
fn the_agents_python_reaches_the_processes_unless_the_container_sets_its_own() {
    let agent = BTreeMap::from([
        ("GRANARY_PYTHON".to_string(), "/venv/bin/python".to_string()),
        ("VIRTUAL_ENV".into(), "/venv".into()),
        ("PYTHONPATH".into(), "/agent/only".into()),
        ("SECRET_TOKEN".into(), "not inherited".into()),
    ]);
    let base = base_env(&agent, Path::new("/state/tmp"), "w-1");
    assert_eq!(base["GRANARY_PYTHON"], "/venv/bin/python");
    assert_eq!(base["VIRTUAL_ENV"], "/venv");
    assert!(base["PATH"].contains("/usr/bin"), "PATH defaults to the usual folders: {base:?}");
    assert!(!base.contains_key("PYTHONPATH") && !base.contains_key("SECRET_TOKEN"), "{base:?}");
    let mut pod = worker_pod();
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    c.env
        .get_or_insert_default()
        .push(serde_json::from_value(json!({"name": "GRANARY_PYTHON", "value": "/img/python"})).unwrap());
    let c = c.clone();
    let l = launch(
        &pod,
        &c,
        &Sources::default(),
        &ports(),
        &Mounts::default(),
        &|_| None,
        Path::new("/b/granary"),
        base,
    )
    .unwrap();
    assert_eq!(l.env["GRANARY_PYTHON"], "/img/python", "the container's own env wins");
    assert_eq!(l.env["VIRTUAL_ENV"], "/venv");
}

#[test]
fn the_program_is_granary_bin_unless_another_command_is_given() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let bin = Path::new("/b/granary");
    assert_eq!(program_and_args(&[], &s(&["worker"]), bin), (bin.into(), s(&["worker"])));
    let via_path = program_and_args(&s(&["/usr/local/bin/granary", "worker"]), &s(&["-v"]), bin);
    assert_eq!(via_path, (bin.into(), s(&["worker", "-v"])));
    let named = program_and_args(&s(&["granary"]), &s(&["run"]), bin);
    assert_eq!(named, (bin.into(), s(&["run"])));
    let sleep = program_and_args(&s(&["sleep", "300"]), &s(&["x"]), bin);
    assert_eq!(sleep, (PathBuf::from("sleep"), s(&["300", "x"])));
    let granaryd = program_and_args(&s(&["/bin/granaryd"]), &[], bin);
    assert_eq!(granaryd.0, Path::new("/bin/granaryd"));
}

#[test]
fn env_from_comes_first_and_env_overrides_and_expands_in_order() {
    let mut pod = worker_pod();
    let c = &mut pod.spec.as_mut().unwrap().containers[0];
    c.args = None;
    c.command = Some(vec!["sh".into(), "-c".into(), "echo $(TOKEN) $$(TOKEN) $(LATER)".into()]);
    c.env = Some(serde_json::from_value(json!([
        {"name": "A", "value": "$(TOKEN)-$(B)"},
        {"name": "B", "value": "b"},
        {"name": "TOKEN", "value": "override"},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}},
        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
        {"name": "LATER", "value": "l"},
        {"name": "EMPTY"},
    ])).unwrap());
    let c = c.clone();
    let sources = secret("creds", &[("TOKEN", "t"), ("k", "v"), ("1bad", "x")]);
    let l = launch(
        &pod,
        &c,
        &sources,
        &ports(),
        &Mounts::default(),
        &|_| None,
        Path::new("/b/granary"),
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(l.env["A"], "t-$(B)");
    assert_eq!(l.env["TOKEN"], "override");
    assert_eq!(l.env["KEY"], "v");
    assert!(!l.env.contains_key("OPT") && !l.env.contains_key("1bad"));
    assert_eq!(l.env["EMPTY"], "");
    // Command and args expand against the final environment.
    assert_eq!(l.args, ["-c", "echo override $(TOKEN) l"]);
}

#[test]
fn missing_required_sources_are_configuration_errors() {
    let pod = worker_pod();
    let mut c = pod.spec.as_ref().unwrap().containers[0].clone();
    // The optional envFrom secret may be missing.
    assert!(container_env(&pod, &c, &Sources::default()).is_ok());
    c.env_from = Some(serde_json::from_value(json!([{"configMapRef": {"name": "cfg"}}])).unwrap());
    let err = container_env(&pod, &c, &Sources::default()).unwrap_err();
    assert_eq!(err, "configmap \"cfg\" not found");
    c.env_from = None;
    c.env = Some(
        serde_json::from_value(json!([
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}},
        ]))
        .unwrap(),
    );
    let err = container_env(&pod, &c, &secret("creds", &[])).unwrap_err();
    assert_eq!(err, "couldn't find key nope in Secret creds");
    let err = container_env(&pod, &c, &Sources::default()).unwrap_err();
    assert_eq!(err, "secret \"creds\" not found");
}

#[test]
fn field_refs_cover_the_downward_api_subset() {
    let pod = worker_pod();
    assert_eq!(field_value(&pod, "metadata.name").unwrap(), "w-1");
    assert_eq!(field_value(&pod, "metadata.namespace").unwrap(), "ns");
    assert_eq!(field_value(&pod, "metadata.uid").unwrap(), "u-1");
    assert_eq!(field_value(&pod, "spec.nodeName").unwrap(), "node-1");
    assert_eq!(field_value(&pod, "spec.serviceAccountName").unwrap(), "");
    assert_eq!(field_value(&pod, "status.hostIP").unwrap(), "127.0.0.1");
    assert_eq!(field_value(&pod, "metadata.labels['app']").unwrap(), "w");
    assert_eq!(field_value(&pod, "metadata.annotations['x']").unwrap(), "");
    assert!(field_value(&pod, "spec.containers").unwrap_err().contains("unsupported"));
}

#[test]
fn service_addresses_become_the_agents_proxy_and_escape_the_port_map() {
    let mut pod = worker_pod();
    let spec = pod.spec.as_mut().unwrap();
    // The operator pod's case: its own Service's port is also one of its container ports.
    spec.containers[0]
        .ports
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(json!({"containerPort": 7070})).unwrap());
    let c = spec.containers[0].clone();
    let ports = PortMap { ports: [(7070, 40000), (7071, 40001), (9090, 40002)].into() };
    let proxy = |s: &crate::node::services::ServiceRef| {
        (s.namespace == "ns" && s.name == "granary-dispatcher" && s.port == 7070)
            .then(|| "127.0.0.1:45555".to_string())
    };
    let l = launch(
        &pod,
        &c,
        &Sources::default(),
        &ports,
        &Mounts::default(),
        &proxy,
        Path::new("/b/granary"),
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(l.env["GRANARY_DISPATCHER"], "127.0.0.1:45555");
    assert_eq!(l.env["GRANARY_ADVERTISE"], "127.0.0.1:40001", "the rest is still mapped");
}
