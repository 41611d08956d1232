use super::*;
use crate::node::launch::launch;
use crate::node::ports::PortMap;
use serde_json::json;

/// A worker pod as the operator renders it with `spec.python.configMap: code`, plus a volume
/// of each other kind the agent meets.
fn pod_with(volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "w-1", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "containers": [{
                "name": "worker",
                "args": ["worker", "--pipeline", "ns/p", "--code", "/etc/granary/python/augment.py"],
                "env": [
                    {"name": "PYTHONPATH", "value": "/etc/granary/python"},
                    {"name": "LIST", "value": "/opt/lib:/etc/granary/python/sub:/etc/granary/pythonic"},
                ],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    }))
    .unwrap()
}

fn worker_pod() -> Pod {
    pod_with(
        json!([
            {"name": "tmp", "emptyDir": {}},
            {"name": "python", "configMap": {"name": "code"}},
        ]),
        json!([
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "python", "mountPath": "/etc/granary/python/", "readOnly": true},
        ]),
    )
}

fn config_map(name: &str, pairs: &[(&str, &str)]) -> Sources {
    let data = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Sources { config_maps: [(name.to_string(), Some(data))].into(), ..Default::default() }
}

fn container(pod: &Pod) -> &Container {
    &pod.spec.as_ref().unwrap().containers[0]
}

#[test]
fn config_map_volumes_are_planned_from_their_keys_or_their_items() {
    let pod = worker_pod();
    let sources = config_map("code", &[("augment.py", "def f(e): return e\n"), ("util.py", "X = 1\n")]);
    let planned = plan(&pod, container(&pod), &sources).unwrap();
    assert_eq!(planned.len(), 1, "the emptyDir is not materialized: {planned:?}");
    let p = &planned[0];
    assert_eq!(
        (p.volume.as_str(), p.mount_path.as_str(), p.sub_path.as_str()),
        ("python", "/etc/granary/python", "")
    );
    assert_eq!(p.files.keys().collect::<Vec<_>>(), ["augment.py", "util.py"]);

    let pod = pod_with(
        json!([{"name": "python", "configMap": {"name": "code", "items": [{"key": "util.py", "path": "pkg/util.py"}]}}]),
        json!([{"name": "python", "mountPath": "/code", "subPath": "pkg"}]),
    );
    let planned = plan(&pod, container(&pod), &sources).unwrap();
    assert_eq!(planned[0].files, BTreeMap::from([("pkg/util.py".to_string(), "X = 1\n".to_string())]));
    assert_eq!(planned[0].sub_path, "pkg");
}

#[test]
fn missing_config_maps_and_keys_hold_the_container_back_unless_optional() {
    let pod = worker_pod();
    let err = plan(&pod, container(&pod), &Sources::default()).unwrap_err();
    assert!(err.contains("configmap \"code\" not found") && err.contains("\"python\""), "{err}");

    let optional = pod_with(
        json!([{"name": "python", "configMap": {"name": "code", "optional": true}}]),
        json!([{"name": "python", "mountPath": "/code"}]),
    );
    let planned = plan(&optional, container(&optional), &Sources::default()).unwrap();
    assert!(planned[0].files.is_empty(), "an optional missing ConfigMap is an empty folder");

    let items = pod_with(
        json!([{"name": "python", "configMap": {"name": "code", "items": [{"key": "nope", "path": "n.py"}]}}]),
        json!([{"name": "python", "mountPath": "/code"}]),
    );
    let err = plan(&items, container(&items), &config_map("code", &[("a.py", "")])).unwrap_err();
    assert!(err.contains("has no key \"nope\""), "{err}");

    let unknown = pod_with(json!([]), json!([{"name": "ghost", "mountPath": "/ghost"}]));
    assert!(plan(&unknown, container(&unknown), &Sources::default()).unwrap_err().contains("\"ghost\""));
}

#[test]
fn paths_that_leave_the_volume_are_refused() {
    let sources = config_map("code", &[("a.py", "")]);
    let escaping = pod_with(
        json!([{"name": "python", "configMap": {"name": "code", "items": [{"key": "a.py", "path": "../a.py"}]}}]),
        json!([{"name": "python", "mountPath": "/code"}]),
    );
    assert!(plan(&escaping, container(&escaping), &sources).unwrap_err().contains("../a.py"));
    let absolute = pod_with(
        json!([{"name": "python", "configMap": {"name": "code"}}]),
        json!([{"name": "python", "mountPath": "/code", "subPath": "/etc"}]),
    );
    assert!(plan(&absolute, container(&absolute), &sources).unwrap_err().contains("subPath"));
    let root = pod_with(
        json!([{"name": "python", "configMap": {"name": "code"}}]),
        json!([{"name": "python", "mountPath": "/"}]),
    );
    assert!(plan(&root, container(&root), &sources).unwrap_err().contains("mountPath"));
}

#[test]
fn materialized_files_appear_and_mount_paths_map_to_their_folder() {
    let dir = tempfile::tempdir().unwrap();
    let pod = worker_pod();
    let sources = config_map("code", &[("augment.py", "def f(e): return e\n"), ("old.py", "")]);
    let planned = plan(&pod, container(&pod), &sources).unwrap();
    let mounts = materialize(&planned, dir.path()).unwrap();
    let folder = dir.path().join("volumes/python");
    assert_eq!(std::fs::read_to_string(folder.join("augment.py")).unwrap(), "def f(e): return e\n");
    let host = folder.display().to_string();
    let table = [
        ("/etc/granary/python", host.clone()),
        ("/etc/granary/python/augment.py", format!("{host}/augment.py")),
        ("/opt/lib:/etc/granary/python/sub", format!("/opt/lib:{host}/sub")),
        ("/etc/granary/pythonic", "/etc/granary/pythonic".to_string()),
        ("x/etc/granary/python", "x/etc/granary/python".to_string()),
        ("127.0.0.1:7071", "127.0.0.1:7071".to_string()),
        ("", String::new()),
    ];
    for (value, expected) in table {
        assert_eq!(mounts.rewrite(value), expected, "{value}");
    }

    // A later start writes the ConfigMap as it is then: a removed key is gone.
    let sources = config_map("code", &[("augment.py", "def f(e): return dict(e)\n")]);
    materialize(&plan(&pod, container(&pod), &sources).unwrap(), dir.path()).unwrap();
    assert!(!folder.join("old.py").exists());
    assert_eq!(std::fs::read_to_string(folder.join("augment.py")).unwrap(), "def f(e): return dict(e)\n");
}

#[test]
fn nested_mounts_map_to_the_innermost_folder() {
    let mounts = Mounts {
        paths: vec![
            ("/etc/granary/python/extra".into(), "/h/extra".into()),
            ("/etc/granary/python".into(), "/h/code".into()),
        ],
    };
    assert_eq!(mounts.rewrite("/etc/granary/python/extra/m.py"), "/h/extra/m.py");
    assert_eq!(mounts.rewrite("/etc/granary/python/m.py"), "/h/code/m.py");
    let dir = tempfile::tempdir().unwrap();
    let planned = [
        Planned {
            volume: "a".into(),
            files: BTreeMap::new(),
            mount_path: "/a".into(),
            sub_path: String::new(),
        },
        Planned {
            volume: "b".into(),
            files: BTreeMap::new(),
            mount_path: "/a/b".into(),
            sub_path: String::new(),
        },
    ];
    let mounts = materialize(&planned, dir.path()).unwrap();
    assert_eq!(mounts.paths[0].0, "/a/b", "the longest mount path first: {mounts:?}");
}

#[test]
fn the_worker_process_sees_the_host_folder_in_its_env_and_args() {
    let dir = tempfile::tempdir().unwrap();
    let pod = worker_pod();
    let sources = config_map("code", &[("augment.py", "")]);
    let mounts = materialize(&plan(&pod, container(&pod), &sources).unwrap(), dir.path()).unwrap();
    let l = launch(
        &pod,
        container(&pod),
        &sources,
        &PortMap::default(),
        &mounts,
        &|_| None,
        Path::new("/b/granary"),
        BTreeMap::new(),
    )
    .unwrap();
    let host = dir.path().join("volumes/python").display().to_string();
    assert_eq!(l.env["PYTHONPATH"], host);
    assert_eq!(l.env["LIST"], format!("/opt/lib:{host}/sub:/etc/granary/pythonic"));
    assert_eq!(l.args.last().unwrap(), &format!("{host}/augment.py"));
}

#[test]
fn secret_volumes_are_written_for_the_agents_user_only_and_mapped_in_args() {
    let pod = pod_with(
        json!([{"name": "credentials", "secret": {"secretName": "p-granary-worker", "defaultMode": 288}}]),
        json!([{"name": "credentials", "mountPath": "/var/run/granary/credentials", "readOnly": true}]),
    );
    let missing = plan(&pod, container(&pod), &Sources::default()).unwrap_err();
    assert!(missing.contains("secret \"p-granary-worker\" not found"), "{missing}");
    let data = [("token", "gr1.x"), ("ca.crt", "PEM")].map(|(k, v)| (k.to_string(), v.to_string()));
    let sources = Sources {
        secrets: [("p-granary-worker".to_string(), Some(data.into()))].into(),
        ..Default::default()
    };
    let planned = plan(&pod, container(&pod), &sources).unwrap();
    assert_eq!(planned[0].files.keys().collect::<Vec<_>>(), ["ca.crt", "token"]);
    let dir = tempfile::tempdir().unwrap();
    let mounts = materialize(&planned, dir.path()).unwrap();
    let token = dir.path().join(VOLUMES_DIR).join("credentials").join("token");
    assert_eq!(std::fs::read_to_string(&token).unwrap(), "gr1.x");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(mounts.rewrite("/var/run/granary/credentials/token"), token.display().to_string());
}
