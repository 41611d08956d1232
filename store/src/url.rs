//! Opening object stores from URLs (`file://`, `s3://`, `gs://`, `az://`, `memory://`).
//!
//! Cloud credentials and endpoints come from the environment the way `object_store`'s builders
//! read them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, ...). When none is set, opening a cloud store checks that the
//! instance-metadata endpoint answers and otherwise fails naming the variables to set (see
//! [`crate::credentials`]). `memory://NAME/` stores live for the whole process, so
//! that tests can fill one and hand its URL to a pipeline.

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreScheme, RetryConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use url::Url;

use crate::credentials::{self, Cloud, CredentialError};

/// A store and the path of the addressed prefix (or object) inside it.
#[derive(Clone, Debug)]
pub struct Located {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Path inside the store (no leading slash).
    pub path: StorePath,
    /// The URL it was opened from.
    pub url: Url,
}

/// Failure to open a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not a URL.
    #[error("`{url}` is not a URL ({reason}); write e.g. file:///data/train/ or s3://bucket/prefix/")]
    BadUrl {
        /// The text given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The store cannot get credentials. The reason is part of the message, not a separate
    /// cause, so that it is said once.
    #[error("cannot open `{url}`: {reason}")]
    Credentials {
        /// The URL.
        url: String,
        /// What is missing and which variables supply it.
        reason: CredentialError,
    },
    /// The store could not be built.
    #[error("cannot open `{url}`: {source}")]
    Open {
        /// The URL.
        url: String,
        /// The builder's error.
        #[source]
        source: object_store::Error,
    },
}

fn memory_stores() -> &'static Mutex<HashMap<String, Arc<InMemory>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// The process-wide in-memory store named `name` (`memory://NAME/`).
pub fn memory_store(name: &str) -> Arc<InMemory> {
    let mut stores = memory_stores().lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(stores.entry(name.to_string()).or_default())
}

/// Opens the store addressed by `url`.
pub fn open(url: &str) -> Result<Located, StoreError> {
    open_with(url, None)
}

/// Opens the store addressed by `url`, retrying failed requests to a cloud store as `retry`
/// says instead of `object_store`'s default (up to 10 retries over 3 minutes). For data that has
/// a cheap fallback, such as cache entries, failing fast is better than waiting.
pub fn open_with_retry(url: &str, retry: RetryConfig) -> Result<Located, StoreError> {
    open_with(url, Some(retry))
}

fn open_with(url: &str, retry: Option<RetryConfig>) -> Result<Located, StoreError> {
    let parsed =
        Url::parse(url).map_err(|e| StoreError::BadUrl { url: url.to_string(), reason: e.to_string() })?;
    let fail = |source: object_store::Error| StoreError::Open { url: url.to_string(), source };
    if parsed.scheme() == "memory" {
        let store = memory_store(parsed.host_str().unwrap_or(""));
        let path = StorePath::from_url_path(parsed.path()).map_err(|e| fail(e.into()))?;
        return Ok(Located { store, path, url: parsed });
    }
    let options: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?.to_ascii_lowercase(), v.into_string().ok()?)))
        .collect();
    let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| fail(e.into()))?;
    let path = StorePath::parse(path).map_err(|e| fail(e.into()))?;
    let cloud = match scheme {
        ObjectStoreScheme::AmazonS3 => Some(Cloud::S3),
        ObjectStoreScheme::GoogleCloudStorage => Some(Cloud::Gcs),
        ObjectStoreScheme::MicrosoftAzure => Some(Cloud::Azure),
        _ => None,
    };
    if let Some(cloud) = cloud {
        credentials::check(cloud, &parsed, &options)
            .map_err(|reason| StoreError::Credentials { url: url.to_string(), reason })?;
    }
    // The options every builder understands are applied as `parse_url_opts` applies them.
    macro_rules! build {
        ($builder:ty, $retry:expr) => {{
            let builder = options.iter().fold(<$builder>::new().with_url(url), |b, (k, v)| match k.parse() {
                Ok(key) => b.with_config(key, v),
                Err(_) => b,
            });
            Arc::new(builder.with_retry($retry).build().map_err(fail)?)
        }};
    }
    let store: Arc<dyn ObjectStore> = match (scheme, retry) {
        (ObjectStoreScheme::AmazonS3, Some(retry)) => build!(AmazonS3Builder, retry),
        (ObjectStoreScheme::GoogleCloudStorage, Some(retry)) => build!(GoogleCloudStorageBuilder, retry),
        (ObjectStoreScheme::MicrosoftAzure, Some(retry)) => build!(MicrosoftAzureBuilder, retry),
        _ => {
            let (store, path) = object_store::parse_url_opts(&parsed, options).map_err(fail)?;
            return Ok(Located { store: Arc::from(store), path, url: parsed });
        }
    };
    Ok(Located { store, path, url: parsed })
}

/// Joins a path inside a store with a relative path that may use `..`.
pub fn join(base: &StorePath, relative: &str) -> StorePath {
    let mut parts: Vec<String> = base.parts().map(|p| p.as_ref().to_string()).collect();
    for piece in relative.split('/') {
        match piece {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p.to_string()),
        }
    }
    StorePath::from_iter(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_relative_paths() {
        let base = StorePath::from("data/images/train");
        assert_eq!(join(&base, "../labels.jsonl").as_ref(), "data/images/labels.jsonl");
        assert_eq!(join(&base, "./a/b").as_ref(), "data/images/train/a/b");
    }

    #[test]
    fn opens_file_and_memory_urls() {
        let f = open("file:///tmp/some/dir/").unwrap();
        assert_eq!(f.path.as_ref(), "tmp/some/dir");
        let m = open("memory://unit/x/").unwrap();
        assert_eq!(m.path.as_ref(), "x");
        assert!(matches!(open("not a url"), Err(StoreError::BadUrl { .. })));
    }
}
