//! What `spec.workers` (and the chart's defaults of the same shape) add to a worker pod, as a
//! pure function: one layer of settings merged over the pod the operator builds. Maps merge key
//! by key and lists add entries, a later layer winning on the same key or name; `resources`,
//! `affinity`, `serviceAccountName` and `priorityClassName` replace what was there. What Granary
//! sets itself (its env variables, volumes and mounts) is never replaced, because validation
//! rejects layers that try; its selector labels are applied after every layer.

use granary_crds::WorkersSpec;
use k8s_openapi::api::core::v1::{Container, EnvVar, LocalObjectReference, PodSpec, Volume, VolumeMount};
use std::collections::BTreeMap;

/// Merges `layer` over `pod` and its worker `container` (the image is handled with the Python
/// image choice, in [`crate::python::worker_image`]), and over the pod template's `labels` and
/// `annotations`.
pub fn merge(
    pod: &mut PodSpec,
    container: &mut Container,
    labels: &mut BTreeMap<String, String>,
    annotations: &mut BTreeMap<String, String>,
    layer: &WorkersSpec,
) {
    if layer.resources.is_some() {
        container.resources = layer.resources.clone();
    }
    if !layer.node_selector.is_empty() {
        pod.node_selector.get_or_insert_default().extend(layer.node_selector.clone());
    }
    if !layer.tolerations.is_empty() {
        pod.tolerations.get_or_insert_default().extend(layer.tolerations.iter().cloned());
    }
    if layer.affinity.is_some() {
        pod.affinity = layer.affinity.clone();
    }
    if layer.service_account_name.is_some() {
        pod.service_account_name = layer.service_account_name.clone();
    }
    if layer.priority_class_name.is_some() {
        pod.priority_class_name = layer.priority_class_name.clone();
    }
    by_name(&mut pod.image_pull_secrets, &layer.image_pull_secrets, |s: &LocalObjectReference| {
        s.name.clone()
    });
    by_name(&mut container.env, &layer.env, |e: &EnvVar| e.name.clone());
    if !layer.env_from.is_empty() {
        container.env_from.get_or_insert_default().extend(layer.env_from.iter().cloned());
    }
    by_name(&mut pod.volumes, &layer.volumes, |v: &Volume| v.name.clone());
    by_name(&mut container.volume_mounts, &layer.volume_mounts, |m: &VolumeMount| m.mount_path.clone());
    labels.extend(layer.pod_labels.clone());
    annotations.extend(layer.pod_annotations.clone());
}

/// Adds `more` to `list`, each replacing an entry of the same key where there is one.
fn by_name<T: Clone>(list: &mut Option<Vec<T>>, more: &[T], key: impl Fn(&T) -> String) {
    if more.is_empty() {
        return;
    }
    let list = list.get_or_insert_default();
    for item in more {
        match list.iter_mut().find(|have| key(have) == key(item)) {
            Some(slot) => *slot = item.clone(),
            None => list.push(item.clone()),
        }
    }
}
