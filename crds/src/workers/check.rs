//! What the schema cannot say about `spec.workers`: names in Kubernetes' forms, mounts that name
//! a volume, one source per volume, and nothing that overrides what Granary sets in the pod.

use super::WorkersSpec;
use super::names::{
    is_dns_label, is_dns_subdomain, is_env_name, is_label_value, is_qualified_name, is_quantity,
};
use crate::Problem;
use std::collections::BTreeSet;

/// Environment variables the operator sets in every worker container (and `PYTHONPATH` with
/// `spec.python`): `spec.workers.env` cannot give them.
pub const RESERVED_ENV: &[&str] =
    &["GRANARY_DISPATCHER", "GRANARY_POD_IP", "GRANARY_ADVERTISE", "PYTHONPATH"];
/// Volumes the operator adds to every worker pod (`tmp`, an emptyDir at `/tmp`) or with
/// `spec.python` (`python`, the code ConfigMap at [`PYTHON_MOUNT`]), by name.
pub const RESERVED_VOLUMES: &[&str] = &[TMP_VOLUME, PYTHON_VOLUME];
/// The worker's scratch volume.
pub const TMP_VOLUME: &str = "tmp";
/// Where the worker's scratch volume is mounted.
pub const TMP_MOUNT: &str = "/tmp";
/// The volume of the `spec.python.configMap` code.
pub const PYTHON_VOLUME: &str = "python";
/// Where the `spec.python.configMap` code is mounted, read-only; `PYTHONPATH` names it.
pub const PYTHON_MOUNT: &str = "/etc/granary/python";
/// Labels the operator selects and describes worker pods by.
const RESERVED_LABELS: &[&str] = &[
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "granary.dev/pipeline",
];
const TOLERATION_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl WorkersSpec {
    /// The problems of `self` given as the operator's defaults for every pipeline (the chart's
    /// `workers.pod`), each named under `field` instead of `spec.workers`. `image` and
    /// `resources` have chart values of their own, so they are refused here.
    pub fn problems_as_defaults(&self, field: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        self.check(&mut problems);
        for (given, value) in [("image", self.image.is_some()), ("resources", self.resources.is_some())] {
            if value {
                problems.push(Problem::new(
                    format!("spec.workers.{given}"),
                    format!("has a chart value of its own: set `workers.{given}` instead"),
                ));
            }
        }
        for p in &mut problems {
            if let Some(rest) = p.path.strip_prefix("spec.workers") {
                p.path = format!("{field}{rest}");
            }
        }
        problems
    }

    pub(crate) fn check(&self, problems: &mut Vec<Problem>) {
        let mut problem = |path: String, message: String| problems.push(Problem::new(path, message));
        if let Some(image) = &self.image
            && (image.trim().is_empty() || image.chars().any(char::is_whitespace))
        {
            problem(
                "spec.workers.image".into(),
                format!(
                    "is `{image}`; give an image reference such as `registry.example.com/team/granary-augment:1.2`"
                ),
            );
        }
        check_resources(self, &mut problem);
        for (key, value) in &self.node_selector {
            check_label("spec.workers.nodeSelector", key, value, &mut problem);
        }
        check_tolerations(self, &mut problem);
        for (field, name) in [
            ("serviceAccountName", &self.service_account_name),
            ("priorityClassName", &self.priority_class_name),
        ] {
            if let Some(name) = name
                && !is_dns_subdomain(name)
            {
                problem(format!("spec.workers.{field}"), subdomain_message(name));
            }
        }
        for (i, secret) in self.image_pull_secrets.iter().enumerate() {
            if !is_dns_subdomain(&secret.name) {
                problem(format!("spec.workers.imagePullSecrets[{i}].name"), subdomain_message(&secret.name));
            }
        }
        check_env(self, &mut problem);
        check_volumes(self, &mut problem);
        for (key, value) in &self.pod_labels {
            check_label("spec.workers.podLabels", key, value, &mut problem);
            if RESERVED_LABELS.contains(&key.as_str()) {
                problem(
                    format!("spec.workers.podLabels.{key}"),
                    "is set by Granary, which selects the worker pods by it; use another key".into(),
                );
            }
        }
        for key in self.pod_annotations.keys() {
            if !is_qualified_name(key) {
                problem(format!("spec.workers.podAnnotations.{key}"), qualified_message(key));
            }
        }
    }
}

fn subdomain_message(name: &str) -> String {
    format!(
        "is `{name}`; a name here is lowercase letters, digits, `-` and `.`, starting and ending with a \
         letter or digit, at most 253 characters"
    )
}

fn qualified_message(key: &str) -> String {
    format!(
        "`{key}` is not a valid key: `[prefix/]name`, the name at most 63 letters, digits, `-`, `_` and `.` \
         starting and ending with a letter or digit, the prefix a DNS subdomain such as `example.com`"
    )
}

fn check_label(field: &str, key: &str, value: &str, problem: &mut impl FnMut(String, String)) {
    if !is_qualified_name(key) {
        problem(format!("{field}.{key}"), qualified_message(key));
    }
    if !is_label_value(value) {
        problem(
            format!("{field}.{key}"),
            format!(
                "`{value}` is not a valid label value: at most 63 letters, digits, `-`, `_` and `.`, starting and \
                 ending with a letter or digit"
            ),
        );
    }
}

fn check_resources(spec: &WorkersSpec, problem: &mut impl FnMut(String, String)) {
    let Some(resources) = &spec.resources else { return };
    for (part, map) in [("limits", &resources.limits), ("requests", &resources.requests)] {
        for (name, quantity) in map.iter().flatten() {
            if !is_quantity(&quantity.0) {
                problem(
                    format!("spec.workers.resources.{part}.{name}"),
                    format!(
                        "`{}` is not a quantity; write e.g. `4`, `500m` (CPU) or `8Gi` (memory)",
                        quantity.0
                    ),
                );
            }
        }
    }
}

fn check_tolerations(spec: &WorkersSpec, problem: &mut impl FnMut(String, String)) {
    for (i, t) in spec.tolerations.iter().enumerate() {
        let path = format!("spec.workers.tolerations[{i}]");
        let operator = t.operator.as_deref().unwrap_or("Equal");
        match operator {
            "Equal" if t.key.as_deref().unwrap_or_default().is_empty() => problem(
                format!("{path}.key"),
                "is empty, which only `operator: Exists` allows (it tolerates every taint); give the taint's key"
                    .into(),
            ),
            "Exists" if t.value.as_deref().is_some_and(|v| !v.is_empty()) => problem(
                format!("{path}.value"),
                "must be empty with `operator: Exists`; remove it, or use `operator: Equal`".into(),
            ),
            "Equal" | "Exists" => {}
            other => problem(format!("{path}.operator"), format!("is `{other}`; use `Equal` or `Exists`")),
        }
        if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty())
            && !is_qualified_name(key)
        {
            problem(format!("{path}.key"), qualified_message(key));
        }
        let effect = t.effect.as_deref().unwrap_or_default();
        if !effect.is_empty() && !TOLERATION_EFFECTS.contains(&effect) {
            problem(
                format!("{path}.effect"),
                format!(
                    "is `{effect}`; use one of {}, or leave it out for all",
                    TOLERATION_EFFECTS.join(", ")
                ),
            );
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            problem(
                format!("{path}.tolerationSeconds"),
                "applies only to `effect: NoExecute`; remove it, or set that effect".into(),
            );
        }
    }
}

fn check_env(spec: &WorkersSpec, problem: &mut impl FnMut(String, String)) {
    let mut seen = BTreeSet::new();
    for (i, var) in spec.env.iter().enumerate() {
        let path = format!("spec.workers.env[{i}]");
        if !is_env_name(&var.name) {
            problem(
                format!("{path}.name"),
                format!(
                    "`{}` is not a variable name: letters, digits, `_`, `-` and `.`, not starting with a digit",
                    var.name
                ),
            );
        } else if RESERVED_ENV.contains(&var.name.as_str()) {
            problem(format!("{path}.name"), format!("`{}` is set by Granary; use another name", var.name));
        } else if !seen.insert(var.name.as_str()) {
            problem(format!("{path}.name"), format!("`{}` is given twice; keep one", var.name));
        }
        if var.value.is_some() && var.value_from.is_some() {
            problem(path, "gives both `value` and `valueFrom`; keep one".into());
        }
    }
    for (i, from) in spec.env_from.iter().enumerate() {
        let path = format!("spec.workers.envFrom[{i}]");
        let names =
            [from.config_map_ref.as_ref().map(|r| &r.name), from.secret_ref.as_ref().map(|r| &r.name)];
        match names {
            [Some(_), Some(_)] | [None, None] => {
                problem(path, "needs exactly one of `configMapRef` and `secretRef`".into());
            }
            [Some(name), None] | [None, Some(name)] if !is_dns_subdomain(name) => {
                problem(path, subdomain_message(name));
            }
            _ => {}
        }
    }
}

fn check_volumes(spec: &WorkersSpec, problem: &mut impl FnMut(String, String)) {
    let mut names = BTreeSet::new();
    for (i, volume) in spec.volumes.iter().enumerate() {
        let path = format!("spec.workers.volumes[{i}]");
        if !is_dns_label(&volume.name, 63) {
            problem(
                format!("{path}.name"),
                format!(
                    "`{}` is not a volume name: at most 63 lowercase letters, digits and `-`, starting and ending \
                     with a letter or digit",
                    volume.name
                ),
            );
        } else if RESERVED_VOLUMES.contains(&volume.name.as_str()) {
            problem(
                format!("{path}.name"),
                format!("`{}` is the name of a volume Granary adds; use another name", volume.name),
            );
        } else if !names.insert(volume.name.as_str()) {
            problem(format!("{path}.name"), format!("`{}` is given twice; keep one", volume.name));
        }
        // One source per volume: the serialized volume holds `name` and exactly one other key.
        let sources = serde_json::to_value(volume)
            .ok()
            .and_then(|v| {
                v.as_object().map(|o| o.keys().filter(|k| *k != "name").cloned().collect::<Vec<_>>())
            })
            .unwrap_or_default();
        if sources.len() != 1 {
            problem(
                path,
                format!(
                    "needs exactly one source (such as `persistentVolumeClaim`, `secret`, `csi`), has {}",
                    if sources.is_empty() { "none".to_string() } else { sources.join(", ") }
                ),
            );
        }
    }
    let mut paths = BTreeSet::new();
    for (i, mount) in spec.volume_mounts.iter().enumerate() {
        let path = format!("spec.workers.volumeMounts[{i}]");
        if !names.contains(mount.name.as_str()) {
            problem(
                format!("{path}.name"),
                format!(
                    "`{}` names no volume in `spec.workers.volumes`; add it there, or fix the name",
                    mount.name
                ),
            );
        }
        let at = mount.mount_path.trim_end_matches('/');
        if !mount.mount_path.starts_with('/') {
            problem(format!("{path}.mountPath"), format!("`{}` must be an absolute path", mount.mount_path));
        } else if [TMP_MOUNT, PYTHON_MOUNT].iter().any(|own| at == *own || at.starts_with(&format!("{own}/")))
        {
            problem(
                format!("{path}.mountPath"),
                format!("`{}` is where Granary mounts its own volume; choose another path", mount.mount_path),
            );
        } else if !paths.insert(at) {
            problem(
                format!("{path}.mountPath"),
                format!("`{}` is mounted twice; keep one", mount.mount_path),
            );
        }
    }
}
