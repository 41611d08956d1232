use super::*;
use serde_json::json;
use std::time::Duration;

fn container(probe: serde_json::Value) -> Container {
    serde_json::from_value(json!({
        "name": "c",
        "ports": [{"name": "data", "containerPort": 7071}],
        "readinessProbe": probe,
    }))
    .unwrap()
}

fn ports(host: u16) -> PortMap {
    PortMap { ports: [(7071, host)].into() }
}

#[test]
fn probes_resolve_their_kind_and_port() {
    let tcp = Prober::new(&container(json!({"tcpSocket": {"port": "data"}})), &ports(40001));
    assert_eq!(tcp.check, Check::Tcp(40001));
    let http = Prober::new(&container(json!({"httpGet": {"port": 7071, "path": "/ready"}})), &ports(40001));
    assert_eq!(http.check, Check::Http(40001, "/ready".into()));
    let exec = Prober::new(&container(json!({"exec": {"command": ["true"]}})), &ports(40001));
    assert!(exec.note().unwrap().contains("exec readiness probes are not supported"));
    let https = container(json!({"httpGet": {"port": 7071, "scheme": "HTTPS"}}));
    assert!(matches!(Prober::new(&https, &ports(1)).check, Check::Unsupported(_)));
    let unknown = container(json!({"tcpSocket": {"port": "nope"}}));
    assert!(Prober::new(&unknown, &ports(1)).note().unwrap().contains("not declared"));
    let mut none = Prober::new(&Container::default(), &ports(1));
    assert_eq!(none.check, Check::Always);
    none.restart(Instant::now());
    assert!(none.ready() && !none.due(Instant::now() + Duration::from_secs(100)));
}

#[test]
fn readiness_follows_thresholds_and_schedule() {
    let probe = json!({"tcpSocket": {"port": 7071}, "initialDelaySeconds": 2, "periodSeconds": 5,
                       "failureThreshold": 2, "successThreshold": 1});
    let mut p = Prober::new(&container(probe), &ports(40001));
    let t0 = Instant::now();
    p.restart(t0);
    assert!(!p.ready());
    assert!(!p.due(t0 + Duration::from_secs(1)));
    assert!(p.due(t0 + Duration::from_secs(2)));
    p.record(true, t0 + Duration::from_secs(2));
    assert!(p.ready());
    assert!(!p.due(t0 + Duration::from_secs(6)) && p.due(t0 + Duration::from_secs(7)));
    p.record(false, t0 + Duration::from_secs(7));
    assert!(p.ready(), "one failure is below the threshold");
    p.record(false, t0 + Duration::from_secs(12));
    assert!(!p.ready());
    p.restart(t0 + Duration::from_secs(20));
    assert!(!p.ready());
}

#[tokio::test]
async fn tcp_and_http_probes_talk_to_loopback() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let tcp = Prober::new(&container(json!({"tcpSocket": {"port": "data"}})), &ports(port));
    assert!(tcp.probe().await);
    // Take the probe's connection off the backlog.
    drop(listener.accept().await.unwrap());
    let server = tokio::spawn(async move {
        for answer in ["HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 500 Oops\r\n\r\n"] {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(answer.as_bytes()).await.unwrap();
        }
    });
    let http = Prober::new(&container(json!({"httpGet": {"port": "data", "path": "healthz"}})), &ports(port));
    assert!(http.probe().await);
    assert!(!http.probe().await);
    server.await.unwrap();
    // Nothing listens on tcpmux (a freed ephemeral port could be taken again by anyone).
    let closed = Prober::new(&container(json!({"tcpSocket": {"port": "data"}})), &ports(1));
    assert!(!closed.probe().await);
}
