//! Volumes, as far as a kubelet that runs processes can give them: the `configMap` and `secret`
//! volumes a container mounts are written out as files (readable by the agent's user only) under the pod's directory
//! (`<pod dir>/volumes/<volume>/<key>`, or each `items` entry at its `path`), and the
//! container's `mountPath` is mapped to that folder in its command, args and env values. There is
//! no mount namespace, so a value naming a path under a `mountPath` is what gets mapped: the
//! value itself, or each `:`-separated element of it (for `PYTHONPATH=/etc/code:/opt/lib`),
//! when it equals the `mountPath` or starts with it and a `/`.
//!
//! The files are written again at each start of a container, from the ConfigMap as read then
//! (a kubelet updates mounted ConfigMaps in place; here a restart does). Other volume types are
//! not materialized and their mount paths are left alone (the pod's tmp dir already stands for
//! the `emptyDir` at /tmp); a ConfigMap's `binaryData` is not written.

use super::env::Sources;
use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// The folder, under the pod's directory, of its materialized volumes.
pub const VOLUMES_DIR: &str = "volumes";

/// One `configMap` or `secret` volume a container mounts, ready to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// The pod volume's name (its folder under [`VOLUMES_DIR`]).
    pub volume: String,
    /// Its files: path relative to the volume's folder → content.
    pub files: BTreeMap<String, String>,
    /// Where the container sees it (`mountPath`, without a trailing `/`).
    pub mount_path: String,
    /// The part of the volume mounted there (`subPath`; empty for all of it).
    pub sub_path: String,
}

/// Where a container's mounts are on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// `(mountPath, host folder)`, the longest mount path first, so nested mounts win.
    pub paths: Vec<(String, PathBuf)>,
}

impl Mounts {
    /// `value` with each `:`-separated element that equals a mount path, or starts with one
    /// followed by `/`, moved to the host folder of that mount.
    pub fn rewrite(&self, value: &str) -> String {
        if self.paths.is_empty() {
            return value.to_string();
        }
        value.split(':').map(|element| self.rewrite_path(element)).collect::<Vec<_>>().join(":")
    }

    fn rewrite_path(&self, element: &str) -> String {
        for (mount, host) in &self.paths {
            let rest = match element.strip_prefix(mount.as_str()) {
                Some("") => "",
                Some(rest) if rest.starts_with('/') => rest,
                _ => continue,
            };
            return format!("{}{rest}", host.display());
        }
        element.to_string()
    }
}

/// The `configMap` and `secret` volumes `container` of `pod` mounts, with their files from
/// `sources`; or why the container cannot start (a required ConfigMap, Secret or key is missing,
/// a path escapes its volume).
pub fn plan(pod: &Pod, container: &Container, sources: &Sources) -> Result<Vec<Planned>, String> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut planned = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let Some(volume) = volumes.into_iter().flatten().find(|v| v.name == mount.name) else {
            return Err(format!("volumeMount {:?} names no volume of the pod", mount.name));
        };
        let files = if let Some(source) = &volume.config_map {
            let data = sources.config_maps.get(&source.name).and_then(Option::as_ref);
            let source = Source {
                kind: "configmap",
                name: &source.name,
                items: &source.items,
                optional: source.optional,
            };
            files_of(&volume.name, &source, data)?
        } else if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let data = sources.secrets.get(&name).and_then(Option::as_ref);
            let source =
                Source { kind: "secret", name: &name, items: &source.items, optional: source.optional };
            files_of(&volume.name, &source, data)?
        } else {
            continue;
        };
        let mount_path = mount.mount_path.trim_end_matches('/').to_string();
        if mount_path.is_empty() || !mount_path.starts_with('/') {
            return Err(format!(
                "volumeMount {:?}: mountPath {:?} must be absolute, not /",
                mount.name, mount.mount_path
            ));
        }
        let sub_path = mount.sub_path.clone().unwrap_or_default();
        if !sub_path.is_empty() && !is_relative_inside(&sub_path) {
            return Err(format!(
                "volumeMount {:?}: subPath {sub_path:?} must be relative, without `..`",
                mount.name
            ));
        }
        planned.push(Planned { volume: volume.name.clone(), files, mount_path, sub_path });
    }
    Ok(planned)
}

/// A `configMap` or `secret` volume source.
struct Source<'a> {
    /// `configmap` or `secret`, as the kubelet's messages say.
    kind: &'static str,
    name: &'a str,
    items: &'a Option<Vec<KeyToPath>>,
    optional: Option<bool>,
}

/// The files of a `configMap` or `secret` volume source, whose object holds `data` (`None`: it
/// does not exist): every key, or each of `items` at its `path`.
fn files_of(
    volume: &str,
    source: &Source<'_>,
    data: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, String> {
    let (kind, name) = (source.kind, source.name);
    let optional = source.optional == Some(true);
    let Some(data) = data else {
        return if optional {
            Ok(BTreeMap::new())
        } else {
            Err(format!("MountVolume.SetUp failed for volume {volume:?}: {kind} {name:?} not found"))
        };
    };
    let Some(items) = &source.items else {
        if let Some(key) = data.keys().find(|k| !is_relative_inside(k) || k.contains('/')) {
            return Err(format!(
                "volume {volume:?}: {kind} {name:?} has key {key:?}, which is not a file name"
            ));
        }
        return Ok(data.clone());
    };
    let mut files = BTreeMap::new();
    for item in items {
        if !is_relative_inside(&item.path) {
            return Err(format!(
                "volume {volume:?}: items path {:?} must be relative, without `..`",
                item.path
            ));
        }
        match data.get(&item.key) {
            Some(value) => {
                files.insert(item.path.clone(), value.clone());
            }
            None if optional => {}
            None => {
                return Err(format!(
                    "MountVolume.SetUp failed for volume {volume:?}: {kind} {name:?} has no key {:?}",
                    item.key
                ));
            }
        }
    }
    Ok(files)
}

/// Writes `content` to `file`, readable by this user only (Secrets' files are keys).
fn write_private(file: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut out =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(file)?;
    out.write_all(content.as_bytes())
}

/// Whether `path` is a non-empty relative path that stays inside its folder (no `..`, not
/// absolute).
fn is_relative_inside(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Writes the `planned` volumes under `pod_dir` (each volume's folder replaced) and returns
/// where the container's mount paths are on the host.
pub fn materialize(planned: &[Planned], pod_dir: &Path) -> std::io::Result<Mounts> {
    let root = pod_dir.join(VOLUMES_DIR);
    let mut paths = Vec::new();
    for p in planned {
        let folder = root.join(&p.volume);
        if folder.exists() {
            std::fs::remove_dir_all(&folder)?;
        }
        std::fs::create_dir_all(&folder)?;
        for (path, content) in &p.files {
            let file = folder.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            write_private(&file, content)?;
        }
        let host = if p.sub_path.is_empty() { folder } else { folder.join(&p.sub_path) };
        paths.push((p.mount_path.clone(), host));
    }
    paths.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    Ok(Mounts { paths })
}

#[cfg(test)]
#[path = "volumes_tests.rs"]
mod tests;
