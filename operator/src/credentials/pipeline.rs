//! Each pipeline's two Secrets, in its namespace and owned by it:
//!
//! - `<name>-granary-worker`, mounted only by its worker pods: the trust bundle, the workers'
//!   certificate (serving the pipeline's worker name, and naming the workers of this pipeline to
//!   the dispatcher) and the workers' token;
//! - `<name>-granary-trainer`, for trainers: the trust bundle and the pipeline's trainer token.
//!   Kubernetes RBAC on this Secret decides who may consume the pipeline.
//!
//! Both are written again when they no longer match: a new trust bundle, a new master key, a
//! certificate from an older CA or one in the last third of its life. The worker pods carry the
//! certificate's fingerprint, so a renewed certificate rolls them.

use super::Credentials;
use granary_crds::InputPipeline;
use granary_security::Role;
use granary_security::authority::{fingerprint, validity};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodSecurityContext, Secret, SecretVolumeSource, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a worker certificate is valid; renewed in the last third.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Where worker pods mount their Secret.
pub const MOUNT_PATH: &str = "/var/run/granary/credentials";
/// The pod-template annotation holding the worker certificate's fingerprint.
pub const REVISION_ANNOTATION: &str = "granary.dev/credentials";
/// The annotation on a worker Secret naming the CA that issued its certificate.
pub const ISSUER_ANNOTATION: &str = "granary.dev/issuer";
/// The volume's name in worker pods.
const VOLUME: &str = "credentials";
/// The group worker pods run as, which may read the mounted Secret.
const WORKER_GROUP: i64 = 65532;

/// The worker Secret of pipeline `name`.
pub fn worker_secret_name(name: &str) -> String {
    format!("{name}-granary-worker")
}

/// The trainer Secret of pipeline `name`.
pub fn trainer_secret_name(name: &str) -> String {
    format!("{name}-granary-trainer")
}

/// What a Secret holds, as text.
pub fn text_data(secret: &Secret) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        if let Ok(text) = String::from_utf8(value.0.clone()) {
            out.insert(key.clone(), text);
        }
    }
    out
}

fn secret(pipeline: &InputPipeline, name: String, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: pipeline.meta().namespace.clone(),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/managed-by".to_string(), "granary-operator".to_string()),
                ("granary.dev/pipeline".to_string(), pipeline.meta().name.clone().unwrap_or_default()),
            ])),
            owner_references: pipeline.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
        ..Secret::default()
    }
}

/// Whether `existing` (the worker Secret as read) still serves `key`'s workers at `now`.
pub fn worker_current(existing: &Secret, credentials: &Credentials, key: &str, now: i64) -> bool {
    let data = text_data(existing);
    let issuer = existing.metadata.annotations.as_ref().and_then(|a| a.get(ISSUER_ANNOTATION));
    let fresh = data.get("tls.crt").and_then(|c| validity(c)).is_some_and(|(from, until)| {
        let life = (until - from).max(1);
        until - now > life / 3
    });
    fresh
        && data.contains_key("tls.key")
        && issuer == Some(&credentials.issuer())
        && data.get("ca.crt") == Some(&credentials.trust)
        && data.get("token") == Some(&credentials.key.mint(Role::Worker, key))
}

/// Whether `existing` (the trainer Secret as read) still holds what trainers of `key` need.
pub fn trainer_current(existing: &Secret, credentials: &Credentials, key: &str) -> bool {
    let data = text_data(existing);
    data.get("ca.crt") == Some(&credentials.trust)
        && data.get("token") == Some(&credentials.key.mint(Role::Trainer, key))
}

/// A fresh worker Secret for pipeline `key`: a new certificate from the current CA.
pub fn worker_secret(
    pipeline: &InputPipeline,
    credentials: &Credentials,
    key: &str,
) -> Result<Secret, granary_security::authority::AuthorityError> {
    let leaf = credentials.authority.issue(Role::Worker, key, &[], LEAF_VALIDITY)?;
    let data = BTreeMap::from([
        ("ca.crt".to_string(), credentials.trust.clone()),
        ("tls.crt".to_string(), leaf.cert_pem),
        ("tls.key".to_string(), leaf.key_pem),
        ("token".to_string(), credentials.key.mint(Role::Worker, key)),
    ]);
    let name = worker_secret_name(&pipeline.meta().name.clone().unwrap_or_default());
    let mut secret = secret(pipeline, name, data);
    secret.metadata.annotations =
        Some(BTreeMap::from([(ISSUER_ANNOTATION.to_string(), credentials.issuer())]));
    Ok(secret)
}

/// The trainer Secret for pipeline `key`.
pub fn trainer_secret(pipeline: &InputPipeline, credentials: &Credentials, key: &str) -> Secret {
    let data = BTreeMap::from([
        ("ca.crt".to_string(), credentials.trust.clone()),
        ("token".to_string(), credentials.key.mint(Role::Trainer, key)),
    ]);
    secret(pipeline, trainer_secret_name(&pipeline.meta().name.clone().unwrap_or_default()), data)
}

/// The revision of a worker Secret that pods record: its certificate's fingerprint.
pub fn revision(worker: &Secret) -> String {
    fingerprint(text_data(worker).get("tls.crt").map(String::as_str).unwrap_or_default())
}

/// Mounts the worker Secret of `name` into `deployment`'s worker container, points
/// `granary worker` at it (TLS and token), lets the pod's group read it, and records `revision`
/// on the pod template so that a renewed certificate rolls the pods.
pub fn mount(deployment: &mut Deployment, name: &str, revision: &str) {
    let Some(template) = deployment.spec.as_mut().map(|s| &mut s.template) else { return };
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(REVISION_ANNOTATION.into(), revision.into());
    let Some(pod) = template.spec.as_mut() else { return };
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(worker_secret_name(name)),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod.security_context.get_or_insert_with(PodSecurityContext::default).fs_group = Some(WORKER_GROUP);
    for container in pod.containers.iter_mut().filter(|c| c.name == "worker") {
        container.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
            name: VOLUME.into(),
            mount_path: MOUNT_PATH.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        let args = container.args.get_or_insert_with(Vec::new);
        args.extend(["--tls-dir".to_string(), MOUNT_PATH.to_string()]);
        args.extend(["--token-file".to_string(), format!("{MOUNT_PATH}/token")]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::now;
    use crate::fixtures::{pipeline, settings};
    use granary_security::{Authority, MasterKey};

    fn credentials() -> Credentials {
        let authority = Authority::generate("test CA", Duration::from_secs(3600 * 24 * 365)).unwrap();
        let trust = authority.cert_pem().to_string();
        Credentials { authority, trust, key: MasterKey::generate().unwrap() }
    }

    /// `secret` as the API server returns it.
    fn stored(secret: &Secret) -> Secret {
        let mut s = secret.clone();
        s.metadata.resource_version = Some("1".into());
        s
    }

    #[test]
    fn a_worker_secret_serves_its_pipeline_until_something_changes() {
        let p = pipeline("ns", "imagenet", "uid-1");
        let c = credentials();
        let secret = worker_secret(&p, &c, "ns/imagenet").unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("imagenet-granary-worker"));
        assert_eq!(secret.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        let data = text_data(&secret);
        assert_eq!(data["ca.crt"], c.trust);
        assert_eq!(c.key.check(&data["token"]).unwrap().scope, "ns/imagenet");
        let principal = granary_security::principal::from_certificate(&pem_der(&data["tls.crt"])).unwrap();
        assert_eq!((principal.role, principal.scope.as_str()), (Role::Worker, "ns/imagenet"));
        let found = stored(&secret);
        assert!(worker_current(&found, &c, "ns/imagenet", now()));
        // Another pipeline's, a new master key, a new trust bundle, a new CA: issued again.
        assert!(!worker_current(&found, &c, "ns/other", now()));
        let rekeyed = Credentials { key: MasterKey::generate().unwrap(), ..credentials_from(&c) };
        assert!(!worker_current(&found, &rekeyed, "ns/imagenet", now()));
        let retrusted = Credentials { trust: format!("{}{}", c.trust, c.trust), ..credentials_from(&c) };
        assert!(!worker_current(&found, &retrusted, "ns/imagenet", now()));
        let new_ca = credentials();
        let moved = Credentials { key: c.key.clone(), trust: c.trust.clone(), ..new_ca };
        assert!(!worker_current(&found, &moved, "ns/imagenet", now()));
        // In the last third of the certificate's life.
        let late = now() + (LEAF_VALIDITY.as_secs() as i64) * 2 / 3 + 3600;
        assert!(!worker_current(&found, &c, "ns/imagenet", late));
    }

    #[test]
    fn a_trainer_secret_holds_the_trust_and_a_trainer_token() {
        let p = pipeline("ns", "imagenet", "uid-1");
        let c = credentials();
        let secret = trainer_secret(&p, &c, "ns/imagenet");
        assert_eq!(secret.metadata.name.as_deref(), Some("imagenet-granary-trainer"));
        let data = text_data(&secret);
        assert_eq!(data.keys().collect::<Vec<_>>(), ["ca.crt", "token"], "no private key for trainers");
        let token = c.key.check(&data["token"]).unwrap();
        assert_eq!((token.role, token.scope.as_str()), (Role::Trainer, "ns/imagenet"));
        assert!(trainer_current(&stored(&secret), &c, "ns/imagenet"));
        assert!(!trainer_current(&stored(&secret), &c, "ns/other"));
    }

    #[test]
    fn worker_pods_mount_their_secret_and_roll_when_it_is_renewed() {
        let p = pipeline("ns", "imagenet", "uid-1");
        let mut d = crate::objects::deployment(&p, &settings(), "py");
        mount(&mut d, "imagenet", "rev-1");
        let template = &d.spec.as_ref().unwrap().template;
        let annotations = template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
        assert_eq!(annotations[REVISION_ANNOTATION], "rev-1");
        let pod = template.spec.as_ref().unwrap();
        let volume = pod.volumes.iter().flatten().find(|v| v.name == VOLUME).unwrap();
        assert_eq!(volume.secret.as_ref().unwrap().secret_name.as_deref(), Some("imagenet-granary-worker"));
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(WORKER_GROUP));
        let worker = &pod.containers[0];
        let args = worker.args.as_ref().unwrap().join(" ");
        assert!(args.ends_with(&format!("--tls-dir {MOUNT_PATH} --token-file {MOUNT_PATH}/token")), "{args}");
        let m = worker.volume_mounts.iter().flatten().find(|m| m.name == VOLUME).unwrap();
        assert_eq!((m.mount_path.as_str(), m.read_only), (MOUNT_PATH, Some(true)));
        assert_eq!(pod.automount_service_account_token, Some(false));
    }

    fn credentials_from(c: &Credentials) -> Credentials {
        let authority = Authority::from_pem(c.authority.cert_pem(), &c.authority.key_pem()).unwrap();
        Credentials { authority, trust: c.trust.clone(), key: c.key.clone() }
    }

    /// The DER of the first certificate in `pem`.
    fn pem_der(pem: &str) -> Vec<u8> {
        let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        der.contents
    }
}
