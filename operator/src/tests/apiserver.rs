//! A mocked API server (kube's `tower-test` pattern): the test awaits each request the code
//! makes, checks it, and answers it. Every request is recorded so that the RBAC table can be
//! checked against what the code really calls.

use crate::rbac;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use std::time::Duration;
use tower_test::mock::{Handle, pair};

/// How long a test waits for the next request before failing.
const WAIT: Duration = Duration::from_secs(10);

/// One request, as seen by the server.
#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: serde_json::Value,
}

impl Seen {
    /// The value of a query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    }
}

/// The server side of a mocked client.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    seen: Vec<(String, String, String, String)>,
}

impl ApiServer {
    /// A client whose requests this server answers.
    pub fn start() -> (kube::Client, ApiServer) {
        let (service, handle) = pair::<Request<Body>, Response<Body>>();
        (kube::Client::new(service, "default"), ApiServer { handle, seen: Vec::new() })
    }

    /// Awaits the next request; it must be `method path` (path without the query). Answers
    /// `reply(&seen)` with 200 and returns what was seen.
    pub async fn expect(
        &mut self,
        method: &str,
        path: &str,
        reply: impl FnOnce(&Seen) -> serde_json::Value,
    ) -> Seen {
        self.expect_status(method, path, StatusCode::OK, reply).await
    }

    /// As [`ApiServer::expect`], answering with `status`.
    pub async fn expect_status(
        &mut self,
        method: &str,
        path: &str,
        status: StatusCode,
        reply: impl FnOnce(&Seen) -> serde_json::Value,
    ) -> Seen {
        let next = tokio::time::timeout(WAIT, self.handle.next_request()).await;
        let Ok(Some((request, send))) = next else { panic!("expected {method} {path}; no request came") };
        let seen = seen(request).await;
        self.seen.push((
            seen.method.clone(),
            seen.path.clone(),
            seen.query.clone(),
            seen.content_type.clone(),
        ));
        assert_eq!(
            (seen.method.as_str(), seen.path.as_str()),
            (method, path),
            "unexpected request: {seen:?}"
        );
        let body = serde_json::to_vec(&reply(&seen)).expect("a JSON reply");
        send.send_response(Response::builder().status(status).body(Body::from(body)).expect("a response"));
        seen
    }

    /// Fails if a request comes within `quiet`.
    pub async fn expect_nothing(&mut self, quiet: Duration) {
        if let Ok(Some((request, _))) = tokio::time::timeout(quiet, self.handle.next_request()).await {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }

    /// Fails unless the RBAC table grants every request seen, in the scope the chart gives it.
    pub fn check_rbac(&self) {
        assert!(!self.seen.is_empty());
        for (method, path, query, content_type) in &self.seen {
            let Some((group, resource, verbs)) = rbac::needed(method, path, query, content_type) else {
                panic!("{method} {path} is not a resource request the table can cover")
            };
            for verb in verbs {
                assert!(
                    rbac::grant(&group, &resource, verb).is_some(),
                    "{method} {path} needs `{verb}` on `{resource}` in group `{group}`: add it to rbac::PERMISSIONS \
                     and to the chart's roles"
                );
            }
        }
    }
}

async fn seen(request: Request<Body>) -> Seen {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = request.into_body().collect_bytes().await.unwrap_or_default();
    let body = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Seen { method, path, query, content_type, body }
}
