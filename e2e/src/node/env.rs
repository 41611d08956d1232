//! A container's environment as Kubernetes builds it: `envFrom` first, then `env` in order, each
//! value `$(VAR)`-expanded against the variables defined before it. Secrets and ConfigMaps are
//! read from the API up front ([`Sources::fetch`]) so that the building itself is pure.

use super::expand::expand;
use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVarSource, Pod, Secret};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};

/// The IP of every pod and of the node: everything runs on loopback.
pub const LOOPBACK: &str = "127.0.0.1";

/// The Secrets and ConfigMaps a pod's containers refer to; `None` for one that does not exist.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// Secret name → its decoded data.
    pub secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// ConfigMap name → its data.
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

impl Sources {
    /// Reads every Secret and ConfigMap that `pod`'s containers name in `envFrom` or `env`, and
    /// every ConfigMap and Secret of its `configMap` and `secret` volumes.
    pub async fn fetch(client: &Client, pod: &Pod) -> anyhow::Result<Self> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let (mut secret_names, mut map_names) = (BTreeSet::new(), BTreeSet::new());
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            map_names.extend(volume.config_map.as_ref().map(|c| c.name.clone()));
            secret_names.extend(volume.secret.as_ref().and_then(|s| s.secret_name.clone()));
        }
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            for from in c.env_from.iter().flatten() {
                secret_names.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
                map_names.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
            }
            for source in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
                secret_names.extend(source.secret_key_ref.as_ref().map(|r| r.name.clone()));
                map_names.extend(source.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            }
        }
        let mut sources = Sources::default();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        for name in secret_names {
            let secret = secrets.get_opt(&name).await.with_context(|| format!("reading secret {name}"))?;
            let data = secret.map(|s| {
                let decode = |(k, v): (String, k8s_openapi::ByteString)| {
                    (k, String::from_utf8_lossy(&v.0).into_owned())
                };
                s.data.unwrap_or_default().into_iter().map(decode).collect()
            });
            sources.secrets.insert(name, data);
        }
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        for name in map_names {
            let map = maps.get_opt(&name).await.with_context(|| format!("reading configmap {name}"))?;
            sources.config_maps.insert(name, map.map(|m| m.data.unwrap_or_default()));
        }
        Ok(sources)
    }
}

/// Whether Kubernetes accepts `name` as an env var name (`[-._a-zA-Z][-._a-zA-Z0-9]*`).
fn is_env_var_name(name: &str) -> bool {
    let ok = |c: char, first: bool| {
        c == '-' || c == '.' || c == '_' || c.is_ascii_alphabetic() || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// The variables `container` defines, or the reason it cannot start (Kubernetes reports that as
/// `CreateContainerConfigError`).
pub fn container_env(
    pod: &Pod,
    container: &Container,
    sources: &Sources,
) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, optional, found) = if let Some(r) = &from.secret_ref {
            ("secret", &r.name, r.optional, sources.secrets.get(&r.name))
        } else if let Some(r) = &from.config_map_ref {
            ("configmap", &r.name, r.optional, sources.config_maps.get(&r.name))
        } else {
            continue;
        };
        match found.and_then(Option::as_ref) {
            Some(data) => {
                for (key, value) in data {
                    let key = format!("{prefix}{key}");
                    if is_env_var_name(&key) {
                        env.insert(key, value.clone());
                    }
                }
            }
            None if optional == Some(true) => {}
            None => return Err(format!("{kind} \"{name}\" not found")),
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) if !value.is_empty() => expand(value, |n| env.get(n).map(String::as_str)),
            (_, Some(source)) => match value_from(pod, source, sources)? {
                Some(value) => value,
                None => continue,
            },
            _ => String::new(),
        };
        env.insert(var.name.clone(), value);
    }
    Ok(env)
}

/// The value of a `valueFrom`; `None` when an optional key or object is missing.
fn value_from(pod: &Pod, source: &EnvVarSource, sources: &Sources) -> Result<Option<String>, String> {
    let keyed = |kind: &str,
                 maps: &BTreeMap<String, Option<BTreeMap<String, String>>>,
                 name: &str,
                 key: &str,
                 optional: Option<bool>| {
        match maps.get(name).and_then(Option::as_ref) {
            Some(data) => match data.get(key) {
                Some(value) => Ok(Some(value.clone())),
                None if optional == Some(true) => Ok(None),
                None => Err(format!("couldn't find key {key} in {kind} {name}")),
            },
            None if optional == Some(true) => Ok(None),
            None => Err(format!("{} \"{name}\" not found", kind.to_lowercase())),
        }
    };
    if let Some(field) = &source.field_ref {
        return field_value(pod, &field.field_path).map(Some);
    }
    if let Some(r) = &source.secret_key_ref {
        return keyed("Secret", &sources.secrets, &r.name, &r.key, r.optional);
    }
    if let Some(r) = &source.config_map_key_ref {
        return keyed("ConfigMap", &sources.config_maps, &r.name, &r.key, r.optional);
    }
    Err("only fieldRef, secretKeyRef and configMapKeyRef are supported in valueFrom".into())
}

/// The value of a downward-API `fieldRef` path.
pub fn field_value(pod: &Pod, path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => LOOPBACK.into(),
        _ => keyed("metadata.labels['", &meta.labels)
            .or_else(|| keyed("metadata.annotations['", &meta.annotations))
            .ok_or_else(|| format!("unsupported fieldRef {path}"))?,
    };
    Ok(value)
}
