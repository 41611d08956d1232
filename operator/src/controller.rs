//! The controller: watches `InputPipeline`s and the Deployments and Services they own (kube's
//! default list-then-watch: `streaming_lists()` is refused by API servers without the WatchList
//! feature gate) and reconciles each change, with a short debounce.

use crate::context::Context;
use crate::metrics::OperatorMetrics;
use crate::reconcile::{error_policy, reconcile};
use futures::StreamExt;
use granary_crds::InputPipeline;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::Duration;

/// Label selecting the children the operator made.
const CHILDREN: &str = "app.kubernetes.io/managed-by=granary-operator";

/// Reconciles pipelines (in `namespace`, or all) until `shutdown` completes.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    metrics: OperatorMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (pipelines, deployments, services): (Api<InputPipeline>, Api<Deployment>, Api<Service>) =
        match namespace.as_deref() {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client)),
        };
    let children = || watcher::Config::default().labels(CHILDREN);
    Controller::new(pipelines, watcher::Config::default())
        .owns(deployments, children())
        .owns(services, children())
        .with_config(controller::Config::default().debounce(Duration::from_millis(500)))
        .graceful_shutdown_on(shutdown)
        .run(
            {
                let metrics = metrics.clone();
                move |pipeline, ctx| {
                    let metrics = metrics.clone();
                    async move {
                        let started = std::time::Instant::now();
                        let result = reconcile(pipeline, ctx).await;
                        metrics.timed(started.elapsed());
                        result
                    }
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|result| {
            match &result {
                Ok((object, _)) => {
                    metrics.reconciled(true);
                    tracing::debug!(pipeline = %object.name, "reconciled");
                }
                Err(e) => {
                    metrics.reconciled(false);
                    tracing::warn!("reconcile: {e}");
                }
            }
            std::future::ready(())
        })
        .await;
}
