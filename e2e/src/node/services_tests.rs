use super::*;
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn service(namespace: &str, name: &str, port: u16) -> ServiceRef {
    ServiceRef { namespace: namespace.into(), name: name.into(), port }
}

#[test]
fn service_addresses_are_found_in_every_form() {
    let found = |value: &str| -> Vec<ServiceRef> {
        pieces(value)
            .into_iter()
            .filter_map(|p| match p {
                Piece::Service(s, _) => Some(s),
                Piece::Text(_) => None,
            })
            .collect()
    };
    assert_eq!(found("g-granary-dispatcher.team.svc:7070"), [service("team", "g-granary-dispatcher", 7070)]);
    assert_eq!(found("http://m.ns.svc.cluster.local:9090/metrics"), [service("ns", "m", 9090)]);
    assert_eq!(found("a.x.svc:1,b.y.svc:2"), [service("x", "a", 1), service("y", "b", 2)]);
    // Not addresses: no port, a third label, upper case, a longer word, a name alone.
    for value in [
        "a.x.svc",
        "a.b.x.svc:1",
        "A.x.svc:1",
        "a.x.svcs:1",
        "a.x.svc:1a",
        "granary-dispatcher",
        "",
        "x.svc:1",
    ] {
        assert_eq!(found(value), [], "{value}");
    }
}

#[test]
fn rewrite_replaces_addresses_and_passes_the_rest_through() {
    let resolve = |s: &ServiceRef| (s.name == "d").then(|| format!("127.0.0.1:{}", 40000 + s.port));
    let upper = |t: &str| t.to_uppercase();
    assert_eq!(rewrite("tcp://d.ns.svc:7070/x", &resolve, upper), "TCP://127.0.0.1:47070/X");
    assert_eq!(
        rewrite("d.ns.svc.cluster.local:1,e.ns.svc:2", &resolve, |t| t.to_string()),
        "127.0.0.1:40001,e.ns.svc:2"
    );
    assert_eq!(rewrite("plain", &resolve, upper), "PLAIN");
    assert_eq!(rewrite("", &resolve, upper), "");
}

#[test]
fn the_host_port_follows_the_target_port_by_name_or_number() {
    let pod = Pod {
        metadata: ObjectMeta {
            annotations: Some(
                [(PORTS_ANNOTATION.to_string(), r#"{"7070":40001,"9090":40002}"#.to_string())].into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                ports: Some(vec![ContainerPort {
                    name: Some("grpc".into()),
                    container_port: 7070,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    assert_eq!(host_port(&pod, &IntOrString::String("grpc".into())), Some(40001));
    assert_eq!(host_port(&pod, &IntOrString::Int(9090)), Some(40002));
    assert_eq!(host_port(&pod, &IntOrString::Int(8080)), None);
    assert_eq!(host_port(&pod, &IntOrString::String("metrics".into())), None);
}
