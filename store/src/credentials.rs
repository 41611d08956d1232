//! Where a cloud store finds its credentials, and what to say when it finds none.
//!
//! `object_store` (0.14) takes credentials from configuration keys, which [`crate::open`] fills
//! from the environment, and only when none is given asks the cloud's instance-metadata endpoint.
//! Off the cloud that endpoint does not answer, and `object_store` retries it for minutes before
//! failing with a message about the endpoint alone. So when no credential is configured, opening a
//! store first checks (one TCP connection, at most [`PROBE_TIMEOUT`]) that the endpoint answers,
//! and if it does not, fails at once naming the variables and files that would supply
//! credentials. The lists below follow the builders' `build()` in `object_store`'s `aws`, `gcp`
//! and `azure` modules.

use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long the check of a metadata endpoint waits for a TCP connection.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A cloud whose credentials `object_store` discovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cloud {
    /// Amazon S3 and S3-compatible stores (`s3://`).
    S3,
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`az://`, `azure://`, `abfs://`, `abfss://`).
    Azure,
}

impl Cloud {
    /// The cloud's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Cloud::S3 => "S3",
            Cloud::Gcs => "Google Cloud Storage",
            Cloud::Azure => "Azure",
        }
    }

    /// The variables and files `object_store` reads credentials from, as the fix to suggest.
    pub fn credential_sources(self) -> &'static str {
        match self {
            Cloud::S3 => {
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for temporary \
                 keys), or AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN (web identity), or \
                 AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (an ECS task role), or \
                 AWS_CONTAINER_CREDENTIALS_FULL_URI with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (EKS pod \
                 identity), or AWS_SKIP_SIGNATURE=true for a public bucket (~/.aws/credentials and \
                 AWS_PROFILE are not read)"
            }
            Cloud::Gcs => {
                "set GOOGLE_SERVICE_ACCOUNT (or GOOGLE_SERVICE_ACCOUNT_PATH) to a service-account key \
                 file, or GOOGLE_SERVICE_ACCOUNT_KEY to the key itself, or GOOGLE_APPLICATION_CREDENTIALS \
                 to a credentials file, or write ~/.config/gcloud/application_default_credentials.json \
                 (`gcloud auth application-default login`), or set GOOGLE_BEARER_TOKEN, or \
                 GOOGLE_SKIP_SIGNATURE=true for a public bucket"
            }
            Cloud::Azure => {
                "set AZURE_STORAGE_ACCOUNT_KEY, or AZURE_STORAGE_SAS_KEY (a SAS token), or \
                 AZURE_STORAGE_TOKEN (a bearer token), or AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and \
                 AZURE_TENANT_ID (a service principal), or AZURE_CLIENT_ID, AZURE_TENANT_ID and \
                 AZURE_FEDERATED_TOKEN_FILE (workload identity), or AZURE_USE_AZURE_CLI=true, or \
                 AZURE_SKIP_SIGNATURE=true for a public container"
            }
        }
    }

    /// The variable that moves the instance-metadata endpoint.
    fn endpoint_variable(self) -> &'static str {
        match self {
            Cloud::S3 => "AWS_METADATA_ENDPOINT",
            Cloud::Gcs => "GCE_METADATA_HOST or GCE_METADATA_IP",
            Cloud::Azure => "AZURE_MSI_ENDPOINT",
        }
    }
}

/// Why a cloud store cannot get credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// No credential is configured and the instance-metadata endpoint does not answer.
    #[error(
        "no {} credentials: none is set in the environment, and the instance-metadata endpoint \
         {endpoint} (moved by {}) does not answer; {}",
        cloud.name(),
        cloud.endpoint_variable(),
        cloud.credential_sources()
    )]
    Missing {
        /// The cloud.
        cloud: Cloud,
        /// The metadata endpoint that was tried.
        endpoint: String,
    },
    /// An Azure URL that names no storage account.
    #[error(
        "no Azure storage account: set AZURE_STORAGE_ACCOUNT_NAME, or write the URL as \
         abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/prefix/"
    )]
    NoAzureAccount,
}

/// The configuration as `object_store`'s builders read it: lower-case keys, each parsed as one of
/// the cloud's keys.
pub(crate) type Options = [(String, String)];

fn is_true(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

/// Checks that a store of `cloud` at `url` can get credentials: one is configured in `options`,
/// or the instance-metadata endpoint answers. The endpoint's answer is remembered for the process.
pub(crate) fn check(cloud: Cloud, url: &url::Url, options: &Options) -> Result<(), CredentialError> {
    let endpoint = match cloud {
        Cloud::S3 => s3_metadata_endpoint(options),
        Cloud::Gcs => gcs_metadata_endpoint(options),
        Cloud::Azure => azure_metadata_endpoint(url, options)?,
    };
    let Some(endpoint) = endpoint else { return Ok(()) };
    if answers(&endpoint) {
        tracing::info!(
            "no {} credentials in the environment: asking the instance-metadata endpoint {endpoint}",
            cloud.name()
        );
        Ok(())
    } else {
        Err(CredentialError::Missing { cloud, endpoint })
    }
}

/// `None` when S3 credentials are configured, else the metadata endpoint `object_store` asks.
fn s3_metadata_endpoint(options: &Options) -> Option<String> {
    let mut endpoint = "http://169.254.169.254".to_string();
    let mut web_identity = (false, false);
    let mut full_uri = (false, false);
    for (key, value) in options {
        let Ok(key) = key.parse::<AmazonS3ConfigKey>() else { continue };
        match key {
            AmazonS3ConfigKey::AccessKeyId
            | AmazonS3ConfigKey::SecretAccessKey
            | AmazonS3ConfigKey::ContainerCredentialsRelativeUri => return None,
            AmazonS3ConfigKey::SkipSignature if is_true(value) => return None,
            AmazonS3ConfigKey::WebIdentityTokenFile => web_identity.0 = true,
            AmazonS3ConfigKey::RoleArn => web_identity.1 = true,
            AmazonS3ConfigKey::ContainerCredentialsFullUri => full_uri.0 = true,
            AmazonS3ConfigKey::ContainerAuthorizationTokenFile => full_uri.1 = true,
            AmazonS3ConfigKey::MetadataEndpoint => endpoint = value.clone(),
            _ => {}
        }
    }
    if web_identity == (true, true) || full_uri == (true, true) { None } else { Some(endpoint) }
}

/// `None` when Google credentials are configured (or the application-default credentials file
/// exists), else the metadata server `object_store` asks.
fn gcs_metadata_endpoint(options: &Options) -> Option<String> {
    for (key, value) in options {
        match key.parse::<GoogleConfigKey>() {
            Ok(
                GoogleConfigKey::ServiceAccount
                | GoogleConfigKey::ServiceAccountKey
                | GoogleConfigKey::ApplicationCredentials
                | GoogleConfigKey::BearerToken,
            ) => return None,
            Ok(GoogleConfigKey::SkipSignature) if is_true(value) => return None,
            _ => {}
        }
    }
    let home = std::env::var_os(if cfg!(windows) { "APPDATA" } else { "HOME" });
    let adc = if cfg!(windows) {
        "gcloud/application_default_credentials.json"
    } else {
        ".config/gcloud/application_default_credentials.json"
    };
    if home.is_some_and(|home| std::path::Path::new(&home).join(adc).exists()) {
        return None;
    }
    // `object_store` asks GCE_METADATA_HOST (or GCE_METADATA_ROOT, or metadata.google.internal),
    // then GCE_METADATA_IP (or 169.254.169.254). The name resolves only on Google Cloud, where
    // the address answers too, so the address is what is checked unless a host is set.
    let host = std::env::var("GCE_METADATA_HOST")
        .or_else(|_| std::env::var("GCE_METADATA_ROOT"))
        .or_else(|_| std::env::var("GCE_METADATA_IP"))
        .unwrap_or_else(|_| "169.254.169.254".to_string());
    Some(format!("http://{host}"))
}

/// `None` when Azure credentials are configured, else the managed-identity endpoint
/// `object_store` asks; an error when no storage account is named at all.
fn azure_metadata_endpoint(url: &url::Url, options: &Options) -> Result<Option<String>, CredentialError> {
    let mut account = url.host_str().is_some_and(|h| h.contains('.'));
    let mut credential = false;
    let mut endpoint = "http://169.254.169.254/metadata/identity/oauth2/token".to_string();
    let mut client = (false, false, false, false);
    for (key, value) in options {
        let Ok(key) = key.parse::<AzureConfigKey>() else { continue };
        match key {
            AzureConfigKey::AccountName => account = true,
            AzureConfigKey::AccessKey
            | AzureConfigKey::SasKey
            | AzureConfigKey::Token
            | AzureConfigKey::CredentialType
            | AzureConfigKey::FabricTokenServiceUrl => credential = true,
            AzureConfigKey::UseEmulator | AzureConfigKey::UseAzureCli | AzureConfigKey::SkipSignature
                if is_true(value) =>
            {
                credential = true;
                account |= key == AzureConfigKey::UseEmulator;
            }
            AzureConfigKey::ClientId => client.0 = true,
            AzureConfigKey::ClientSecret => client.1 = true,
            AzureConfigKey::AuthorityId => client.2 = true,
            AzureConfigKey::FederatedTokenFile => client.3 = true,
            AzureConfigKey::MsiEndpoint => endpoint = value.clone(),
            _ => {}
        }
    }
    if !account {
        return Err(CredentialError::NoAzureAccount);
    }
    let (id, secret, tenant, federated) = client;
    if credential || (id && tenant && (secret || federated)) { Ok(None) } else { Ok(Some(endpoint)) }
}

/// Whether a TCP connection to `endpoint`'s host and port opens within [`PROBE_TIMEOUT`];
/// remembered per endpoint.
fn answers(endpoint: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashMap<String, bool>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(&known) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(endpoint) {
        return known;
    }
    let answered = probe(endpoint);
    seen.lock().unwrap_or_else(|e| e.into_inner()).insert(endpoint.to_string(), answered);
    answered
}

fn probe(endpoint: &str) -> bool {
    let Ok(parsed) = url::Url::parse(endpoint) else { return false };
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Ok(addresses) = (host, port).to_socket_addrs() else { return false };
    addresses.into_iter().any(|address| TcpStream::connect_timeout(&address, PROBE_TIMEOUT).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn s3_keys_web_identity_and_containers_count_as_credentials() {
        assert_eq!(s3_metadata_endpoint(&options(&[("aws_access_key_id", "k")])), None);
        assert_eq!(s3_metadata_endpoint(&options(&[("aws_skip_signature", "true")])), None);
        assert_eq!(
            s3_metadata_endpoint(&options(&[("aws_web_identity_token_file", "/t"), ("aws_role_arn", "r")])),
            None
        );
        assert_eq!(
            s3_metadata_endpoint(&options(&[("aws_web_identity_token_file", "/t")])).as_deref(),
            Some("http://169.254.169.254")
        );
        assert_eq!(
            s3_metadata_endpoint(&options(&[("aws_metadata_endpoint", "http://127.0.0.1:1")])).as_deref(),
            Some("http://127.0.0.1:1")
        );
    }

    #[test]
    fn azure_needs_an_account() {
        let url = url::Url::parse("az://container/x").unwrap();
        assert!(matches!(azure_metadata_endpoint(&url, &options(&[])), Err(CredentialError::NoAzureAccount)));
        let with_account = options(&[("azure_storage_account_name", "a")]);
        assert!(azure_metadata_endpoint(&url, &with_account).unwrap().is_some());
        let url = url::Url::parse("abfss://c@acct.dfs.core.windows.net/x").unwrap();
        let with_key = options(&[("azure_storage_account_key", "k")]);
        assert_eq!(azure_metadata_endpoint(&url, &with_key).unwrap(), None);
    }

    #[test]
    fn a_closed_loopback_port_does_not_answer() {
        let missing = check(
            Cloud::S3,
            &url::Url::parse("s3://bucket/").unwrap(),
            &options(&[("aws_metadata_endpoint", "http://127.0.0.1:1")]),
        )
        .unwrap_err();
        let text = missing.to_string();
        assert!(text.contains("AWS_ACCESS_KEY_ID") && text.contains("http://127.0.0.1:1"), "{text}");
    }
}
