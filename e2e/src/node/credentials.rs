//! API credentials for a pod's ServiceAccount. A kubelet projects a token into every pod at the
//! fixed path `/var/run/secrets/kubernetes.io/serviceaccount/token`, which one host cannot give
//! each of its processes. Instead the agent asks the TokenRequest API for a token of the pod's
//! ServiceAccount, bound to the pod (it stops working once the pod is deleted), writes it to the
//! pod's directory, and gives the pod's containers `KUBECONFIG` pointing at a kubeconfig that
//! names the agent's own API server and CA and reads that token file (which Kubernetes clients
//! re-read, so the agent refreshes it in place). Pods with `automountServiceAccountToken: false`
//! (on the pod or, when the pod leaves it unset, on its ServiceAccount) get nothing, as with a
//! kubelet.

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long each token is valid.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// How often the agent replaces a running pod's token (well before it expires).
pub const REFRESH: Duration = Duration::from_secs(20 * 60);
/// The variable pointing a pod's processes at their kubeconfig.
pub const KUBECONFIG_VAR: &str = "KUBECONFIG";

/// The pod's ServiceAccount (`default` when unset).
pub fn service_account(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// Whether the pod gets credentials: its own `automountServiceAccountToken`, else its
/// ServiceAccount's (`account`), else yes.
pub fn wants_token(pod: &Pod, account: Option<&ServiceAccount>) -> bool {
    let own = pod.spec.as_ref().and_then(|s| s.automount_service_account_token);
    own.or_else(|| account.and_then(|a| a.automount_service_account_token)).unwrap_or(true)
}

/// The kubeconfig of a pod: `cluster` (a named cluster entry of a kubeconfig, `{name, cluster}`),
/// a user reading `token_file`, and `namespace` as the context's namespace.
pub fn kubeconfig(cluster: &Value, token_file: &Path, namespace: &str) -> Value {
    let name = cluster["name"].as_str().unwrap_or("cluster");
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "service-account", "user": {"tokenFile": token_file}}],
        "contexts": [{
            "name": "pod",
            "context": {"cluster": name, "user": "service-account", "namespace": namespace},
        }],
        "current-context": "pod",
    })
}

/// The files of one pod's credentials, under its directory.
#[derive(Clone, Debug)]
pub struct Projected {
    /// The token file the kubeconfig reads.
    pub token: PathBuf,
    /// The kubeconfig.
    pub kubeconfig: PathBuf,
}

impl Projected {
    /// The places under the pod directory `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        let folder = dir.join("serviceaccount");
        Self { token: folder.join("token"), kubeconfig: folder.join("kubeconfig") }
    }
}

/// Requests a token for `pod`'s ServiceAccount, bound to the pod.
pub async fn request_token(client: &Client, pod: &Pod) -> anyhow::Result<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let account = service_account(pod);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": TOKEN_LIFETIME.as_secs(),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name.clone().unwrap_or_default(),
                "uid": pod.metadata.uid.clone().unwrap_or_default(),
            },
        },
    });
    let issued: Value = accounts
        .create_subresource("token", &account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{account}"))?;
    let token = issued["status"]["token"].as_str().context("the TokenRequest returned no token")?;
    Ok(token.to_string())
}

/// Gives `pod` (whose directory is `dir`) credentials when it wants them: writes a fresh token
/// (readable by the agent's user only) and, the first time, the kubeconfig naming `cluster`.
/// `None` for a pod that gets no token.
pub async fn project(
    client: &Client,
    cluster: &Value,
    pod: &Pod,
    dir: &Path,
) -> anyhow::Result<Option<Projected>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if pod.spec.as_ref().and_then(|s| s.automount_service_account_token).is_none() {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let name = service_account(pod);
        let account =
            accounts.get_opt(&name).await.with_context(|| format!("reading ServiceAccount {name}"))?;
        if !wants_token(pod, account.as_ref()) {
            return Ok(None);
        }
    } else if !wants_token(pod, None) {
        return Ok(None);
    }
    let token = request_token(client, pod).await?;
    let files = Projected::in_dir(dir);
    write_private(&files.token, token.as_bytes())?;
    if !files.kubeconfig.exists() {
        let config = kubeconfig(cluster, &files.token, namespace);
        write_private(&files.kubeconfig, config.to_string().as_bytes())?;
    }
    Ok(Some(files))
}

/// Replaces `path` with `bytes` at once (a reader sees the old or the new file), mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let folder = path.parent().context("a file without a folder")?;
    std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    let fresh = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&fresh)
        .with_context(|| format!("writing {}", fresh.display()))?;
    file.write_all(bytes).with_context(|| format!("writing {}", fresh.display()))?;
    std::fs::rename(&fresh, path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(automount: Option<bool>, account: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                automount_service_account_token: automount,
                service_account_name: account.map(str::to_string),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_pod_decides_then_its_service_account_then_yes() {
        let no = ServiceAccount { automount_service_account_token: Some(false), ..Default::default() };
        assert!(wants_token(&pod(None, None), None));
        assert!(!wants_token(&pod(None, None), Some(&no)));
        assert!(wants_token(&pod(Some(true), None), Some(&no)));
        assert!(!wants_token(&pod(Some(false), None), None));
        assert_eq!(service_account(&pod(None, None)), "default");
        assert_eq!(service_account(&pod(None, Some("op"))), "op");
    }

    #[test]
    fn the_kubeconfig_names_the_cluster_and_reads_the_token_file() {
        let cluster = json!({"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}});
        let config = kubeconfig(&cluster, Path::new("/pods/x/serviceaccount/token"), "ns");
        assert_eq!(config["clusters"][0], cluster);
        assert_eq!(config["users"][0]["user"]["tokenFile"], "/pods/x/serviceaccount/token");
        assert_eq!(config["contexts"][0]["context"]["cluster"], "c");
        assert_eq!(config["contexts"][0]["context"]["namespace"], "ns");
        assert_eq!(config["current-context"], "pod");
        let parsed: kube::config::Kubeconfig = serde_json::from_value(config).unwrap();
        assert_eq!(
            parsed.auth_infos[0].auth_info.as_ref().and_then(|a| a.token_file.clone()).as_deref(),
            Some("/pods/x/serviceaccount/token")
        );
    }

    #[test]
    fn files_are_replaced_whole_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let files = Projected::in_dir(dir.path());
        write_private(&files.token, b"one").unwrap();
        write_private(&files.token, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&files.token).unwrap(), "two");
        let mode = std::fs::metadata(&files.token).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
