//! Security on Kubernetes: the deployment's CA and master key, kept in two Secrets of the
//! operator's namespace, and what the operator makes from them.
//!
//! - `<release>-ca` holds the CA (`tls.crt`, `tls.key`), the trust bundle (`ca.crt`) and, while a
//!   rotation is under way, the next CA (`next.crt`, `next.key`). The operator creates it and
//!   rotates it ([`rotation`]), or, with cert-manager, only reads it (cert-manager writes a CA
//!   Certificate's Secret in the same layout and renews it).
//! - `<release>-auth` holds the master key (`master.key`) that tokens and capabilities derive
//!   from; the operator creates it once.
//!
//! The leader issues the dispatcher's certificate in memory, writes each pipeline's worker and
//! trainer Secrets ([`pipeline`]), and watches the CA Secret: when the CA that issues changes, or
//! the dispatcher's certificate nears its end, it steps down so that a fresh start serves the
//! new certificate.

pub mod pipeline;
pub mod rotation;

use granary_security::authority::{AuthorityError, fingerprint};
use granary_security::token::ANY;
use granary_security::{Authority, MasterKey, Role, TlsMaterial};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use rotation::{CaSet, KeyedCert};
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// How the operator secures the gRPC plane (`granary operator --security`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityOptions {
    /// The CA Secret's name, in the operator's namespace.
    pub ca_secret: String,
    /// The master-key Secret's name, in the operator's namespace.
    pub key_secret: String,
    /// Whether the operator makes and rotates the CA; `false`: cert-manager does, and a missing
    /// CA Secret is an error.
    pub manage_ca: bool,
    /// The names trainers and workers dial the dispatcher by (its Service's DNS names).
    pub dispatcher_hosts: Vec<String>,
}

/// Why the credentials could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// An API call failed.
    #[error("Secret `{secret}`: {source}")]
    Kube {
        /// The Secret.
        secret: String,
        /// Why.
        source: kube::Error,
    },
    /// A Secret exists but does not hold what it should.
    #[error("Secret `{secret}`: {why}")]
    Invalid {
        /// The Secret.
        secret: String,
        /// What is wrong and how to fix it.
        why: String,
    },
    /// A certificate could not be made.
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    /// The master key could not be made.
    #[error("the master key: {0}")]
    Key(#[from] granary_security::key::KeyError),
}

/// The CA and master key in effect.
pub struct Credentials {
    /// The CA that issues leaves.
    pub authority: Authority,
    /// Every CA certificate trusted (PEM).
    pub trust: String,
    /// The master key.
    pub key: MasterKey,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("issuer", &self.issuer()).finish_non_exhaustive()
    }
}

impl Credentials {
    /// The fingerprint of the CA that issues leaves.
    pub fn issuer(&self) -> String {
        fingerprint(self.authority.cert_pem())
    }

    /// The dispatcher's TLS material: a fresh certificate for `hosts`, valid for
    /// [`pipeline::LEAF_VALIDITY`].
    pub fn dispatcher_tls(&self, hosts: &[String]) -> Result<TlsMaterial, AuthorityError> {
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let leaf = self.authority.issue(Role::Owner, ANY, &hosts, pipeline::LEAF_VALIDITY)?;
        Ok(TlsMaterial::from_pem(&self.trust, Some((&leaf.cert_pem, &leaf.key_pem))))
    }
}

/// The credentials in effect, replaced when the CA Secret changes.
#[derive(Clone, Debug)]
pub struct Shared(Arc<RwLock<Arc<Credentials>>>);

impl Shared {
    /// Shares `credentials`.
    pub fn new(credentials: Credentials) -> Shared {
        Shared(Arc::new(RwLock::new(Arc::new(credentials))))
    }

    /// The credentials now.
    pub fn get(&self) -> Arc<Credentials> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, credentials: Credentials) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(credentials);
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Reads the credentials from their Secrets in `namespace`, creating the master key (and, when
/// the operator manages it, the CA) where missing and taking the rotation step that is due.
pub async fn load(
    client: &kube::Client,
    namespace: &str,
    options: &SecurityOptions,
) -> Result<Credentials, CredentialsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let key = master_key(&secrets, &options.key_secret).await?;
    let set = ca_set(&secrets, options).await?;
    let invalid = |why: String| CredentialsError::Invalid { secret: options.ca_secret.clone(), why };
    let authority = Authority::from_pem(&set.current.cert, &set.current.key).map_err(|e| {
        invalid(format!(
            "`tls.crt` and `tls.key` are not a CA certificate and its key ({e}); delete the Secret for the \
             operator to make a new CA, or fix the cert-manager Certificate that writes it"
        ))
    })?;
    // cert-manager's CA Secrets carry the CA itself in `ca.crt`; an empty one means the CA alone.
    let trust = if set.trust.contains("CERTIFICATE") { set.trust } else { set.current.cert.clone() };
    Ok(Credentials { authority, trust, key })
}

async fn master_key(secrets: &Api<Secret>, name: &str) -> Result<MasterKey, CredentialsError> {
    let kube = |source| CredentialsError::Kube { secret: name.to_string(), source };
    let found = match secrets.get_opt(name).await.map_err(kube)? {
        Some(found) => found,
        None => {
            let key = MasterKey::generate()?;
            let data = BTreeMap::from([("master.key".to_string(), key.encode())]);
            match secrets.create(&PostParams::default(), &new_secret(name, data)).await {
                Ok(_) => return Ok(key),
                // Another replica made it first: use that one.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    secrets.get(name).await.map_err(kube)?
                }
                Err(e) => return Err(kube(e)),
            }
        }
    };
    let text = pipeline::text_data(&found).remove("master.key").unwrap_or_default();
    MasterKey::decode(text.trim()).map_err(|e| CredentialsError::Invalid {
        secret: name.to_string(),
        why: format!(
            "`master.key` is not a master key ({e}); delete the Secret for the operator to make a new one \
             (every token and trainer Secret is then issued again)"
        ),
    })
}

async fn ca_set(secrets: &Api<Secret>, options: &SecurityOptions) -> Result<CaSet, CredentialsError> {
    let name = &options.ca_secret;
    let kube = |source| CredentialsError::Kube { secret: name.clone(), source };
    let Some(found) = secrets.get_opt(name).await.map_err(kube)? else {
        if !options.manage_ca {
            return Err(CredentialsError::Invalid {
                secret: name.clone(),
                why: "does not exist, and the operator does not manage the CA (cert-manager does): check \
                      the chart's cert-manager Certificate, or set security.certManager.enabled=false"
                    .into(),
            });
        }
        let current = make_ca()?;
        let mut set = CaSet { current, next: None, trust: String::new() };
        set.trust = rotation::bundle(&set, "", now());
        return match secrets.create(&PostParams::default(), &new_secret(name, ca_data(&set))).await {
            Ok(_) => Ok(set),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let found = secrets.get(name).await.map_err(kube)?;
                read_set(name, &found)
            }
            Err(e) => Err(kube(e)),
        };
    };
    let set = read_set(name, &found)?;
    if !options.manage_ca {
        return Ok(set);
    }
    let at = now();
    let step = rotation::due(&set, at);
    let Some(next) = rotation::apply(&set, step, at, make_ca)? else { return Ok(set) };
    // Replace with the resourceVersion read: a concurrent writer makes this fail, and the next
    // check starts again from what it wrote.
    let mut replaced = found.clone();
    replaced.data = Some(bytes(ca_data(&next)));
    secrets.replace(name, &PostParams::default(), &replaced).await.map_err(kube)?;
    tracing::info!(secret = %name, issuer = %fingerprint(&next.current.cert), "rotated the CA");
    Ok(next)
}

fn make_ca() -> Result<KeyedCert, AuthorityError> {
    let ca = Authority::generate("granary CA", rotation::CA_VALIDITY)?;
    Ok(KeyedCert { cert: ca.cert_pem().to_string(), key: ca.key_pem() })
}

fn read_set(name: &str, secret: &Secret) -> Result<CaSet, CredentialsError> {
    let mut data = pipeline::text_data(secret);
    let mut take = |key: &str| data.remove(key).filter(|v| !v.trim().is_empty());
    let (Some(cert), Some(key)) = (take("tls.crt"), take("tls.key")) else {
        return Err(CredentialsError::Invalid {
            secret: name.to_string(),
            why: "holds no `tls.crt` and `tls.key` (the CA and its key); delete it for the operator to \
                  make a new CA"
                .into(),
        });
    };
    let next = match (take("next.crt"), take("next.key")) {
        (Some(cert), Some(key)) => Some(KeyedCert { cert, key }),
        _ => None,
    };
    Ok(CaSet { current: KeyedCert { cert, key }, next, trust: take("ca.crt").unwrap_or_default() })
}

fn ca_data(set: &CaSet) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([
        ("tls.crt".to_string(), set.current.cert.clone()),
        ("tls.key".to_string(), set.current.key.clone()),
        ("ca.crt".to_string(), set.trust.clone()),
    ]);
    if let Some(next) = &set.next {
        data.insert("next.crt".into(), next.cert.clone());
        data.insert("next.key".into(), next.key.clone());
    }
    data
}

fn bytes(data: BTreeMap<String, String>) -> BTreeMap<String, ByteString> {
    data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()
}

fn new_secret(name: &str, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "granary-operator".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(bytes(data)),
        ..Secret::default()
    }
}

/// How often the leader reads the CA Secret again.
pub const CHECK_PERIOD: Duration = Duration::from_secs(60);

/// Watches the CA Secret while leading: takes the rotation steps that fall due, shares the
/// credentials they give, and returns when the dispatcher must start again with a new
/// certificate (its issuer changed, or `issued_at` is two thirds of its validity ago). Read
/// failures are logged and retried.
pub async fn watch(
    client: kube::Client,
    namespace: String,
    options: SecurityOptions,
    shared: Shared,
    issued_at: i64,
) {
    let issuer = shared.get().issuer();
    let renew_at = issued_at + (pipeline::LEAF_VALIDITY.as_secs() as i64) * 2 / 3;
    loop {
        tokio::time::sleep(CHECK_PERIOD).await;
        match load(&client, &namespace, &options).await {
            Ok(fresh) => {
                let changed = fresh.issuer() != issuer;
                shared.set(fresh);
                if changed {
                    tracing::info!("the CA that issues certificates changed: restarting the dispatcher");
                    return;
                }
            }
            Err(e) => tracing::warn!("cannot read the credentials again: {e}"),
        }
        if now() >= renew_at {
            tracing::info!("the dispatcher's certificate is due for renewal: restarting the dispatcher");
            return;
        }
    }
}
