//! The Node object and its heartbeats. The agent creates (or takes over) its Node, reports it
//! `Ready` with nominal capacity, and every [`HEARTBEAT`] refreshes the conditions' heartbeat
//! times on the `status` subresource and renews the node's Lease in `kube-node-lease`, as a
//! kubelet does; kube-controller-manager marks a node NotReady after 40 s without either.

use super::Settings;
use super::env::LOOPBACK;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// How often the node's status and Lease are renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The namespace of node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet version the node reports.
pub const KUBELET_VERSION: &str = "v1.20.2-granary-e2e";

/// The labels of the node.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The node's status: Ready since `since`, heartbeat `now`, with `settings`' nominal capacity.
pub fn node_status(settings: &Settings, since: &Time, now: &Time) -> NodeStatus {
    let condition = |kind: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: kind.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(since.clone()),
    };
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu", settings.cpu.as_str()),
        ("memory", settings.memory.as_str()),
        ("pods", "110"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    let info = |s: &str| s.to_string();
    NodeStatus {
        capacity: Some(capacity.clone()),
        allocatable: Some(capacity),
        addresses: Some(vec![
            NodeAddress { type_: "InternalIP".into(), address: LOOPBACK.into() },
            NodeAddress { type_: "Hostname".into(), address: settings.node_name.clone() },
        ]),
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            condition("Ready", "True", "KubeletReady", "granary-e2e-node is posting ready status"),
        ]),
        node_info: Some(NodeSystemInfo {
            architecture: info("amd64"),
            boot_id: info("granary-e2e"),
            container_runtime_version: info("granary-e2e://0.1.0"),
            kernel_version: info("granary-e2e"),
            kube_proxy_version: info(KUBELET_VERSION),
            kubelet_version: info(KUBELET_VERSION),
            machine_id: format!("granary-e2e-{}", settings.node_name),
            operating_system: info("linux"),
            os_image: info("granary-e2e-node (processes on loopback)"),
            system_uuid: format!("granary-e2e-{}", settings.node_name),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates the Node, or takes over an existing one of the same name (its labels are merged in).
/// Its status is written separately ([`heartbeat`]): creation may drop the status.
pub async fn register(client: &Client, settings: &Settings) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(settings.node_name.clone()),
            labels: Some(labels(&settings.node_name)),
            ..Default::default()
        },
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let patch = json!({"metadata": {"labels": labels(&settings.node_name)}});
            nodes.patch(&settings.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

/// Writes the node's status with fresh heartbeat times and renews its Lease (a failure of the
/// latter is only logged). A Node that disappeared is registered again.
pub async fn heartbeat(client: &Client, settings: &Settings, since: &Time) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = super::status::now();
    let patch = json!({"status": node_status(settings, since, &now)});
    let params = PatchParams::default();
    let node = match nodes.patch_status(&settings.node_name, &params, &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            register(client, settings).await?;
            nodes.patch_status(&settings.node_name, &params, &Patch::Merge(&patch)).await?
        }
        other => other?,
    };
    // A Lease that cannot be renewed is not fatal: the status heartbeat alone keeps the node Ready.
    if let Err(err) = renew_lease(client, settings, &node).await {
        super::log(format_args!("renewing the node Lease: {err:#}"));
    }
    Ok(())
}

/// Renews (or creates) the node's Lease, owned by the Node like a kubelet's.
async fn renew_lease(client: &Client, settings: &Settings, node: &Node) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let spec = LeaseSpec {
        holder_identity: Some(settings.node_name.clone()),
        lease_duration_seconds: Some(40),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    let patch = json!({"spec": spec});
    match leases.patch(&settings.node_name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: settings.node_name.clone(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(settings.node_name.clone()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    owner_references: Some(vec![owner]),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
            Ok(())
        }
        other => other.map(drop).map_err(Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn the_node_is_ready_on_loopback_with_its_labels() {
        let settings = Settings::for_tests();
        let (since, now) =
            (Time(Timestamp::from_second(1).unwrap()), Time(Timestamp::from_second(2).unwrap()));
        let status = node_status(&settings, &since, &now);
        let conditions = status.conditions.unwrap();
        let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
        assert_eq!(
            (ready.last_heartbeat_time.clone(), ready.last_transition_time.clone()),
            (Some(now), Some(since))
        );
        assert!(conditions.iter().filter(|c| c.type_ != "Ready").all(|c| c.status == "False"));
        assert_eq!(status.capacity.unwrap()["pods"].0, "110");
        assert_eq!(status.addresses.unwrap()[0].address, "127.0.0.1");
        assert_eq!(status.node_info.unwrap().kubelet_version, KUBELET_VERSION);
        let labels = labels("n1");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(
            (labels["kubernetes.io/os"].as_str(), labels["kubernetes.io/arch"].as_str()),
            ("linux", "amd64")
        );
    }
}
