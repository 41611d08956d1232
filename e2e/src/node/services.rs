//! Services on loopback, a kube-proxy and cluster-DNS stand-in. There is no DNS for
//! `*.svc` names on this host, and the endpoints controller publishes no loopback pod address,
//! so a pod could not reach a Service. Instead, every `<service>.<namespace>.svc[.cluster.local]:<port>`
//! in a pod's args or env values is rewritten to `127.0.0.1:<proxy port>`, where the agent runs a
//! TCP proxy for that Service port: one per Service port, kept for the agent's lifetime, so the
//! address stays the same when the pods behind it are replaced (a `helm upgrade`). Each accepted
//! connection goes to a pod the Service selects, running and Ready (any, with
//! `publishNotReadyAddresses`), at the host port the agent gave the container port its
//! `targetPort` names ([`super::ports::PORTS_ANNOTATION`]); with none, the connection is closed,
//! as a Service without endpoints refuses it. The agent also writes the proxy's address to the
//! Service's annotation [`ADDRESSES_ANNOTATION`], for tests that dial a Service from outside.

use super::log;
use super::ports::PORTS_ANNOTATION;
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, TcpListener as StdListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// The Service annotation with the loopback address of each proxied port (`{"7070": "127.0.0.1:40123"}`).
pub const ADDRESSES_ANNOTATION: &str = "e2e.granary.dev/loopback-addresses";
/// How long finding a backend and connecting to it may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// A Service port named in a pod's values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Its port (`spec.ports[].port`).
    pub port: u16,
}

/// A part of a value: text, or a Service address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Anything else.
    Text(&'a str),
    /// A `<service>.<namespace>.svc[.cluster.local]:<port>`, and its text.
    Service(ServiceRef, &'a str),
}

/// Whether `c` may be part of a DNS label.
fn label_char(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
}

/// Whether `s` is a DNS label (lower case).
fn is_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.bytes().all(label_char) && !s.starts_with('-') && !s.ends_with('-')
}

/// The Service address ending at `.svc` at byte `at` of `value`: `(start, end, service)`.
fn address_at(value: &str, at: usize) -> Option<(usize, usize, ServiceRef)> {
    let bytes = value.as_bytes();
    let mut start = at;
    while start > 0 && (label_char(bytes[start - 1]) || bytes[start - 1] == b'.') {
        start -= 1;
    }
    if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
        return None;
    }
    let (name, namespace) = value[start..at].split_once('.')?;
    if !is_label(name) || !is_label(namespace) {
        return None;
    }
    let mut end = at + ".svc".len();
    if value[end..].starts_with(".cluster.local") {
        end += ".cluster.local".len();
    }
    let rest = value[end..].strip_prefix(':')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let port: u16 = rest[..digits].parse().ok()?;
    let end = end + 1 + digits;
    if value[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.') {
        return None;
    }
    Some((start, end, ServiceRef { namespace: namespace.into(), name: name.into(), port }))
}

/// `value` split into text and Service addresses.
pub fn pieces(value: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = value[from..].find(".svc") {
        let at = from + found;
        match address_at(value, at) {
            Some((start, end, service)) if start >= copied => {
                if start > copied {
                    out.push(Piece::Text(&value[copied..start]));
                }
                out.push(Piece::Service(service, &value[start..end]));
                copied = end;
                from = end;
            }
            _ => from = at + 1,
        }
    }
    if copied < value.len() || out.is_empty() {
        out.push(Piece::Text(&value[copied..]));
    }
    out
}

/// `value` with each Service address replaced by what `resolve` gives for it (kept as it is when
/// that is `None`), and the text in between passed through `text`.
pub fn rewrite(
    value: &str,
    resolve: &dyn Fn(&ServiceRef) -> Option<String>,
    text: impl Fn(&str) -> String,
) -> String {
    let mut out = String::with_capacity(value.len());
    for piece in pieces(value) {
        match piece {
            Piece::Text(t) => out.push_str(&text(t)),
            Piece::Service(service, original) => match resolve(&service) {
                Some(address) => out.push_str(&address),
                None => out.push_str(&text(original)),
            },
        }
    }
    out
}

/// The agent's Service proxies, one per Service port, started on first use.
pub struct Proxies {
    client: Client,
    ports: Mutex<HashMap<ServiceRef, u16>>,
}

impl Proxies {
    /// No proxies yet.
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self { client, ports: Mutex::new(HashMap::new()) })
    }

    /// `127.0.0.1:<port>` of the proxy of `service`, started now if it is not running; `None`
    /// when no port could be bound (the value is then left alone). Call it within the runtime.
    pub fn address(self: &Arc<Self>, service: &ServiceRef) -> Option<String> {
        let mut ports = self.ports.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(port) = ports.get(service) {
            return Some(format!("127.0.0.1:{port}"));
        }
        let listener = match bind() {
            Ok(listener) => listener,
            Err(err) => {
                log(format_args!("cannot start a proxy for {service:?}: {err:#}"));
                return None;
            }
        };
        let port = listener.local_addr().ok()?.port();
        ports.insert(service.clone(), port);
        log(format_args!(
            "service {}/{} port {} is 127.0.0.1:{port} on this node",
            service.namespace, service.name, service.port
        ));
        tokio::spawn(serve(self.client.clone(), service.clone(), listener));
        tokio::spawn(annotate(self.client.clone(), service.clone(), port));
        Some(format!("127.0.0.1:{port}"))
    }
}

fn bind() -> anyhow::Result<TcpListener> {
    let listener = StdListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding 127.0.0.1:0")?;
    listener.set_nonblocking(true).context("a non-blocking listener")?;
    TcpListener::from_std(listener).context("registering the listener")
}

/// Writes the proxy's address into the Service's annotation (retrying while the Service is not
/// there yet, for up to a minute).
async fn annotate(client: Client, service: ServiceRef, port: u16) {
    let api: Api<Service> = Api::namespaced(client, &service.namespace);
    for _ in 0..60 {
        if let Ok(Some(current)) = api.get_opt(&service.name).await {
            let annotations = current.metadata.annotations.unwrap_or_default();
            let mut addresses: BTreeMap<String, String> = annotations
                .get(ADDRESSES_ANNOTATION)
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_default();
            addresses.insert(service.port.to_string(), format!("127.0.0.1:{port}"));
            let value = serde_json::to_string(&addresses).unwrap_or_default();
            let patch = json!({"metadata": {"annotations": {ADDRESSES_ANNOTATION: value}}});
            if api.patch(&service.name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Accepts connections for `service` and joins each to a backend.
async fn serve(client: Client, service: ServiceRef, listener: TcpListener) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else { continue };
        let (client, service) = (client.clone(), service.clone());
        tokio::spawn(async move {
            let outbound =
                tokio::time::timeout(CONNECT_DEADLINE, connect(&client, &service)).await.unwrap_or_else(
                    |_| Err(anyhow::anyhow!("no backend within {}s", CONNECT_DEADLINE.as_secs())),
                );
            match outbound {
                Ok(mut outbound) => {
                    let mut inbound = inbound;
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(err) => log(format_args!(
                    "service {}/{} port {}: {err:#}; connection closed",
                    service.namespace, service.name, service.port
                )),
            }
        });
    }
}

/// A connection to a backend of `service`.
async fn connect(client: &Client, service: &ServiceRef) -> anyhow::Result<TcpStream> {
    let port = backend(client, service).await?;
    TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))
}

/// The host port of a pod serving `service`'s port.
async fn backend(client: &Client, service: &ServiceRef) -> anyhow::Result<u16> {
    let services: Api<Service> = Api::namespaced(client.clone(), &service.namespace);
    let object = services.get(&service.name).await.context("reading the Service")?;
    let spec = object.spec.unwrap_or_default();
    let port = spec.ports.iter().flatten().find(|p| i64::from(p.port) == i64::from(service.port));
    let port = port.context("the Service has no such port")?;
    let target = port.target_port.clone().unwrap_or(IntOrString::Int(port.port));
    let selector = spec.selector.unwrap_or_default();
    if selector.is_empty() {
        bail!("the Service selects no pods");
    }
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &service.namespace);
    let listed = pods.list(&ListParams::default().labels(&labels.join(","))).await.context("listing pods")?;
    let any_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| any_ready || is_ready(p))
        .find_map(|p| host_port(p, &target))
        .context("no Ready pod serves it")
}

/// Whether `pod` runs and is Ready.
fn is_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The host port the agent gave `pod`'s container port `target` (a number or a port name).
pub fn host_port(pod: &Pod, target: &IntOrString) -> Option<u16> {
    let number = match target {
        IntOrString::Int(n) => u16::try_from(*n).ok()?,
        IntOrString::String(name) => {
            let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
            let declared = containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name.as_str()))?;
            u16::try_from(declared.container_port).ok()?
        }
    };
    let annotation = pod.metadata.annotations.as_ref()?.get(PORTS_ANNOTATION)?;
    let ports: BTreeMap<String, u16> = serde_json::from_str(annotation).ok()?;
    ports.get(&number.to_string()).copied()
}

#[cfg(test)]
#[path = "services_tests.rs"]
mod tests;
