//! Loopback port mapping. Every pod on this node shares 127.0.0.1, so each declared
//! `containerPort` of a pod gets its own free host port, and the pod's args and env values are
//! rewritten to use it: the host `0.0.0.0` becomes `127.0.0.1`, and `:<containerPort>` at the end
//! of a `host:port` token (followed by the end of the string or a non-digit) becomes
//! `:<hostPort>`. A bare port number (`--port 7071`) is left alone.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};

/// The annotation the agent writes with a pod's host ports (`{"7071":40001,...}`).
pub const PORTS_ANNOTATION: &str = "e2e.granary.dev/host-ports";

/// The host ports of one pod, by container port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortMap {
    /// `containerPort` → host port on 127.0.0.1.
    pub ports: BTreeMap<u16, u16>,
}

impl PortMap {
    /// Picks a free host port on 127.0.0.1 for every TCP `containerPort` declared in `spec`.
    pub fn allocate(spec: &PodSpec) -> std::io::Result<Self> {
        let mut ports = BTreeMap::new();
        for container in &spec.containers {
            for port in container.ports.iter().flatten() {
                let Ok(number) = u16::try_from(port.container_port) else { continue };
                if number == 0 || ports.contains_key(&number) {
                    continue;
                }
                // Bind port 0, read what the kernel chose, and free it again.
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                ports.insert(number, listener.local_addr()?.port());
            }
        }
        Ok(Self { ports })
    }

    /// The host port of `port` as a probe names it: a container port's name in `container`, or a
    /// number (a declared container port maps to its host port; any other number stays).
    pub fn resolve(&self, container: &Container, port: &IntOrString) -> Option<u16> {
        let number = match port {
            IntOrString::Int(n) => u16::try_from(*n).ok()?,
            IntOrString::String(name) => match name.parse::<u16>() {
                Ok(n) => n,
                Err(_) => {
                    let declared =
                        container.ports.iter().flatten().find(|p| p.name.as_ref() == Some(name))?;
                    u16::try_from(declared.container_port).ok()?
                }
            },
        };
        Some(self.ports.get(&number).copied().unwrap_or(number))
    }

    /// `value` with `0.0.0.0` made `127.0.0.1` and every mapped `:<containerPort>` that ends a
    /// `host:port` token made `:<hostPort>`.
    pub fn rewrite(&self, value: &str) -> String {
        let value = value.replace("0.0.0.0", "127.0.0.1");
        let bytes = value.as_bytes();
        let mut out = String::with_capacity(value.len());
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b':' {
                let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
                let mapped =
                    value[i + 1..i + 1 + digits].parse::<u16>().ok().and_then(|p| self.ports.get(&p));
                if let (true, Some(host)) = (digits > 0, mapped) {
                    out.push_str(&value[copied..i]);
                    out.push(':');
                    out.push_str(&host.to_string());
                    copied = i + 1 + digits;
                }
                i += 1 + digits;
            } else {
                i += 1;
            }
        }
        out.push_str(&value[copied..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn map(pairs: &[(u16, u16)]) -> PortMap {
        PortMap { ports: pairs.iter().copied().collect() }
    }

    #[test]
    fn rewrite_maps_host_port_tokens_and_the_wildcard_host() {
        let m = map(&[(7071, 40001), (9090, 40002)]);
        assert_eq!(m.rewrite("0.0.0.0:7071"), "127.0.0.1:40001");
        assert_eq!(m.rewrite("127.0.0.1:9090"), "127.0.0.1:40002");
        assert_eq!(m.rewrite("http://host:9090/metrics"), "http://host:40002/metrics");
        assert_eq!(m.rewrite("a:7071,b:9090"), "a:40001,b:40002");
        // Longer numbers, other ports and bare numbers stay.
        assert_eq!(m.rewrite("127.0.0.1:70710"), "127.0.0.1:70710");
        assert_eq!(m.rewrite("127.0.0.1:7070"), "127.0.0.1:7070");
        assert_eq!(m.rewrite("7071"), "7071");
        assert_eq!(m.rewrite("ns/name"), "ns/name");
        assert_eq!(m.rewrite("trailing:"), "trailing:");
        assert_eq!(m.rewrite("::7071"), "::40001");
        assert_eq!(m.rewrite("é:7071é"), "é:40001é");
        assert_eq!(map(&[]).rewrite("0.0.0.0:1"), "127.0.0.1:1");
    }

    fn container() -> Container {
        let port = |name: &str, n: i32| ContainerPort {
            name: Some(name.into()),
            container_port: n,
            ..Default::default()
        };
        Container {
            name: "c".into(),
            ports: Some(vec![port("data", 7071), port("metrics", 9090)]),
            ..Default::default()
        }
    }

    #[test]
    fn allocate_gives_each_declared_port_a_distinct_free_host_port() {
        let spec = PodSpec { containers: vec![container()], ..Default::default() };
        let m = PortMap::allocate(&spec).unwrap();
        assert_eq!(m.ports.keys().copied().collect::<Vec<_>>(), [7071, 9090]);
        assert_ne!(m.ports[&7071], m.ports[&9090]);
        assert!(m.ports.values().all(|p| *p != 0));
    }

    #[test]
    fn probes_resolve_ports_by_name_or_number() {
        let m = map(&[(7071, 40001), (9090, 40002)]);
        let c = container();
        assert_eq!(m.resolve(&c, &IntOrString::String("data".into())), Some(40001));
        assert_eq!(m.resolve(&c, &IntOrString::Int(9090)), Some(40002));
        assert_eq!(m.resolve(&c, &IntOrString::String("9090".into())), Some(40002));
        assert_eq!(m.resolve(&c, &IntOrString::Int(8080)), Some(8080));
        assert_eq!(m.resolve(&c, &IntOrString::String("nope".into())), None);
        assert_eq!(m.resolve(&c, &IntOrString::Int(-1)), None);
    }
}
