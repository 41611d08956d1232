//! The operator process: probes and metrics from the start; the leader election; once leading,
//! the control plane (the dispatcher's journal replayed, its gRPC API served, autoscalers
//! reported through the operator's metrics) and the controller. Losing the
//! Lease ends the process (Kubernetes restarts it as a follower), so two dispatchers never
//! serve at once for longer than the Lease's grace.

use crate::config::OperatorConfig;
use crate::context::Context;
use crate::credentials::{self, CredentialsError, SecurityOptions};
use crate::events::Notifier;
use crate::leader::Candidacy;
use crate::metrics::OperatorMetrics;
use granary_dispatcher::exposition::Exposition;
use granary_dispatcher::host::{ControlPlane, HostError, HostOptions, Metrics};
use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig};
use granary_telemetry::MetricsServer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Where and how the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// Address the dispatcher's gRPC API listens on.
    pub dispatcher_listen: SocketAddr,
    /// Object-store URL of the dispatcher's journal.
    pub journal: Option<String>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    pub metrics_addr: SocketAddr,
    /// Watch only these namespaces, one controller each; empty: every namespace.
    pub namespaces: Vec<String>,
    /// Namespace of the leader Lease.
    pub lease_namespace: String,
    /// Name of the leader Lease.
    pub lease_name: String,
    /// This replica's name in the election and in Events.
    pub identity: String,
    /// Reconcile settings.
    pub config: OperatorConfig,
    /// TLS and authentication on the gRPC plane; `None`: plaintext and open.
    pub security: Option<SecurityOptions>,
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No Kubernetes configuration (in-cluster or kubeconfig) could be loaded; the message holds
    /// kube's whole explanation (its error chain repeats itself when printed link by link).
    #[error("cannot reach Kubernetes: {0}")]
    Client(String),
    /// The election failed.
    #[error("leader election: {0}")]
    Election(#[from] kube_lease_manager::LeaseManagerError),
    /// Another replica took the Lease.
    #[error("lost the leader Lease to another replica; restarting as a follower")]
    Deposed,
    /// The control plane could not start, or its dispatcher's server failed.
    #[error(transparent)]
    ControlPlane(#[from] HostError),
    /// The CA or the master key could not be read or made.
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialsError),
    /// The dispatcher's certificate is due for renewal, or the CA that issues changed: the
    /// process ends for a fresh start to serve a new certificate.
    #[error("the dispatcher's certificate must be issued again; restarting")]
    Renew,
    /// A port could not be bound or metrics could not be set up.
    #[error("{0}")]
    Setup(String),
}

/// How long the autoscalers and the dispatcher's server get to stop when leadership ends.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Runs the operator until `shutdown` completes (then it steps down cleanly) or leadership is
/// lost. `catalog` lists sources for the dispatcher. `bound` hears the bound addresses of the
/// dispatcher and the metrics endpoint as soon as they are bound.
pub async fn run(
    options: OperatorOptions,
    catalog: Arc<dyn Catalog>,
    bound: impl FnOnce(SocketAddr, SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), OperatorError> {
    // One process-wide TLS provider, whichever crates link rustls (kube, object_store's cloud
    // stores): rustls refuses to guess when more than one provider is compiled in.
    granary_security::provider::install();
    let client = kube::Client::try_default().await.map_err(|e| OperatorError::Client(e.to_string()))?;
    note_server_version(&client).await;
    let listener = tokio::net::TcpListener::bind(options.dispatcher_listen)
        .await
        .map_err(|e| OperatorError::Setup(format!("cannot listen on {}: {e}", options.dispatcher_listen)))?;
    let dispatcher_addr = listener.local_addr().map_err(|e| OperatorError::Setup(e.to_string()))?;

    let exposition = Arc::new(Exposition::new().map_err(|e| OperatorError::Setup(e.to_string()))?);
    let metrics =
        OperatorMetrics::register(&exposition.registry()).map_err(|e| OperatorError::Setup(e.to_string()))?;
    let ready = Arc::new(AtomicBool::new(false));
    let server = MetricsServer::bind(options.metrics_addr, exposition.registry())
        .await
        .map_err(|e| OperatorError::Setup(e.to_string()))?;
    let metrics_addr = server.local_addr().unwrap_or(options.metrics_addr);
    let leading = ready.clone();
    let refreshed: Arc<std::sync::Mutex<Option<Dispatcher>>> = Arc::default();
    let server = {
        let refreshed = refreshed.clone();
        let exposition = exposition.clone();
        server.with_probes(Arc::new(move || leading.load(Ordering::Relaxed))).with_refresh(Arc::new(
            move || {
                if let Some(d) = refreshed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref()
                {
                    exposition.refresh(d);
                }
            },
        ))
    };
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_task = server.spawn(async move { drop(metrics_stopped.await) });
    bound(dispatcher_addr, metrics_addr);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    tracing::info!(identity = %options.identity, lease = %options.lease_name, "waiting to lead");
    let mut candidacy =
        Candidacy::enter(client.clone(), &options.lease_namespace, &options.lease_name, &options.identity)
            .await?;
    let result = tokio::select! {
        elected = candidacy.elected() => match elected {
            Ok(()) => lead(&options, client, catalog, listener, &exposition, &ready, &metrics, &refreshed, &mut candidacy, stopped(stop_rx.clone())).await,
            Err(e) => Err(e.into()),
        },
        () = stopped(stop_rx.clone()) => Ok(()),
    };
    ready.store(false, Ordering::Relaxed);
    metrics.leading(false);
    // Releasing the Lease needs the API server: through an outage, exit without it (the Lease
    // then expires) rather than hang while Kubernetes waits for this process to end.
    if tokio::time::timeout(RESIGN_WITHIN, candidacy.resign()).await.is_err() {
        tracing::warn!("could not release the leader Lease within {RESIGN_WITHIN:?}: it will expire");
    }
    let _ = stop_metrics.send(());
    let _ = metrics_task.await;
    result
}

/// How long stopping waits to release the leader Lease.
const RESIGN_WITHIN: Duration = Duration::from_secs(5);

#[allow(clippy::too_many_arguments)]
async fn lead(
    options: &OperatorOptions,
    client: kube::Client,
    catalog: Arc<dyn Catalog>,
    listener: tokio::net::TcpListener,
    exposition: &Arc<Exposition>,
    ready: &AtomicBool,
    metrics: &OperatorMetrics,
    refreshed: &std::sync::Mutex<Option<Dispatcher>>,
    candidacy: &mut Candidacy,
    stopped: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), OperatorError> {
    tracing::info!(identity = %options.identity, "leading: starting the dispatcher and the controller");
    let mut dispatcher_config = DispatcherConfig { journal: options.journal.clone(), ..Default::default() };
    let mut shared = None;
    if let Some(security) = &options.security {
        let credentials = credentials::load(&client, &options.lease_namespace, security).await?;
        let tls = credentials.dispatcher_tls(&security.dispatcher_hosts).map_err(CredentialsError::from)?;
        tracing::info!(issuer = %credentials.issuer(), hosts = ?security.dispatcher_hosts, "serving with TLS and authentication");
        dispatcher_config.auth_key = Some(credentials.key.clone());
        dispatcher_config.tls = Some(tls);
        shared = Some(credentials::Shared::new(credentials));
    }
    let renewal = {
        let watched = options.security.clone().zip(shared.clone());
        let (client, namespace) = (client.clone(), options.lease_namespace.clone());
        async move {
            match watched {
                Some((security, shared)) => {
                    credentials::watch(client, namespace, security, shared, credentials::now()).await
                }
                None => std::future::pending().await,
            }
        }
    };
    // The operator serves the metrics itself, with its probes, from before it leads.
    let host = HostOptions { dispatcher: dispatcher_config, metrics: Metrics::Report(exposition.clone()) };
    let mut plane = ControlPlane::start(host, catalog, listener).await?;
    let dispatcher = plane.dispatcher().clone();
    *refreshed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dispatcher.clone());
    ready.store(true, Ordering::Relaxed);
    metrics.leading(true);

    let notifier = Notifier::new(client.clone(), &options.identity);
    let mut ctx = Context::new(client, dispatcher, plane.autoscalers(), options.config.clone(), notifier);
    if let Some(shared) = shared {
        ctx = ctx.with_credentials(shared);
    }
    let ctx = Arc::new(ctx);
    // One controller per watched namespace (kube's Controller watches one namespace or all), so
    // that watching listed namespaces needs permissions in those namespaces only. They share the
    // context, whose state is keyed by `<namespace>/<name>`.
    let scopes: Vec<Option<String>> = if options.namespaces.is_empty() {
        vec![None]
    } else {
        options.namespaces.iter().cloned().map(Some).collect()
    };
    let mut stop_controllers = Vec::with_capacity(scopes.len());
    let mut controllers = Vec::with_capacity(scopes.len());
    for namespace in scopes {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stop_controllers.push(stop);
        controllers.push(tokio::spawn(crate::controller::run(
            ctx.clone(),
            namespace,
            metrics.clone(),
            async move { drop(stopped.await) },
        )));
    }
    let result = tokio::select! {
        () = stopped => Ok(()),
        () = candidacy.deposed() => Err(OperatorError::Deposed),
        () = renewal => Err(OperatorError::Renew),
        served = plane.served() => served.map_err(OperatorError::from),
    };
    if matches!(result, Err(OperatorError::Deposed)) {
        // Refuse every change at once, before the controllers and the server wind down.
        plane.dispatcher().halt("this replica lost the leader Lease");
    }
    ready.store(false, Ordering::Relaxed);
    for stop in stop_controllers {
        let _ = stop.send(());
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(controllers)).await;
    // The workers are the Deployments': they outlive this leader, and the next one adopts them.
    plane.stop(STOP_GRACE).await;
    result
}

/// Logs the API server's version, and warns when it is too old to evaluate the CRD's CEL rules
/// (`x-kubernetes-validations`, Kubernetes 1.25+): such a server admits specs those rules reject,
/// and the operator's own validation reports them as `Ready=False`, reason `InvalidSpec`, instead.
async fn note_server_version(client: &kube::Client) {
    match client.apiserver_version().await {
        Ok(info) if cel_missing(&info.major, &info.minor) => tracing::warn!(
            version = %info.git_version,
            "this API server predates Kubernetes 1.25 and does not run the InputPipeline CRD's CEL rules \
             (x-kubernetes-validations): specs they reject are admitted, then reported as Ready=False, \
             reason InvalidSpec, by the operator's own validation"
        ),
        Ok(info) => tracing::info!(version = %info.git_version, "API server"),
        Err(e) => tracing::warn!("cannot read the API server's version: {e}"),
    }
}

/// Whether a server of version `major.minor` lacks CRD validation rules (before 1.25). Minor
/// versions may carry a `+` suffix (e.g. `20+`).
fn cel_missing(major: &str, minor: &str) -> bool {
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
    matches!((number(major), number(minor)), (Some(1), Some(minor)) if minor < 25)
}

#[cfg(test)]
mod version_tests {
    use super::cel_missing;

    #[test]
    fn servers_before_1_25_lack_cel_rules() {
        assert!(cel_missing("1", "20"));
        assert!(cel_missing("1", "24+"));
        assert!(!cel_missing("1", "25"));
        assert!(!cel_missing("1", "33"));
        assert!(!cel_missing("2", "0"));
        assert!(!cel_missing("1", "x"));
    }
}
