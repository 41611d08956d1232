//! Small helpers around API calls.

use super::log;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use std::time::Duration;
use tokio::time::sleep;

/// Deletes `pod` with grace period 0 and a uid precondition; gone or replaced counts as done.
/// Retries a few times on other errors.
pub async fn remove_pod(api: &Api<Pod>, pod: &Pod) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let preconditions = Preconditions { uid: pod.metadata.uid.clone(), resource_version: None };
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(preconditions),
        ..Default::default()
    };
    for attempt in 1..=5u32 {
        match api.delete(&name, &params).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => return,
            Err(err) => {
                log(format_args!("deleting pod {name} (attempt {attempt}): {}", brief(&err)));
                sleep(Duration::from_secs(u64::from(attempt))).await;
            }
        }
    }
}

/// An API error in one line: the server's message, or the error itself.
pub fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}
