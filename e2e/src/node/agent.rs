//! The agent's main loop: registration, heartbeats, and a supervisor task per pod bound to the
//! node (found by a watch on `spec.nodeName`).

use super::api::remove_pod;
use super::pod::supervise;
use super::registration::{HEARTBEAT, heartbeat, register};
use super::services::Proxies;
use super::status::now;
use super::{Settings, Update, log};
use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// How long the agent tries to register before it gives up.
const REGISTER_DEADLINE: Duration = Duration::from_secs(60);
/// How long pods get to stop when the agent stops.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

/// A pod's supervisor task.
struct Task {
    updates: watch::Sender<Update>,
    handle: JoinHandle<()>,
}

/// The pods bound to this node, by uid.
struct Pods {
    client: Client,
    settings: Arc<Settings>,
    proxies: Arc<Proxies>,
    tasks: HashMap<String, Task>,
    /// The uids listed since the watch (re)started, until the listing is complete.
    listing: Option<HashSet<String>>,
}

impl Pods {
    fn handle(&mut self, event: watcher::Event<Pod>) {
        match event {
            watcher::Event::Init => self.listing = Some(HashSet::new()),
            watcher::Event::InitApply(pod) => {
                if let (Some(listing), Some(uid)) = (self.listing.as_mut(), pod.metadata.uid.as_ref()) {
                    listing.insert(uid.clone());
                }
                self.apply(pod);
            }
            watcher::Event::InitDone => {
                let Some(listed) = self.listing.take() else { return };
                let missing: Vec<String> =
                    self.tasks.keys().filter(|uid| !listed.contains(*uid)).cloned().collect();
                for uid in missing {
                    self.gone(&uid);
                }
            }
            watcher::Event::Apply(pod) => self.apply(pod),
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_ref() {
                    self.gone(uid);
                }
            }
        }
    }

    fn apply(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        if let Some(task) = self.tasks.get(&uid) {
            task.updates.send_replace(Update::Pod(Box::new(pod)));
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        if pod.metadata.deletion_timestamp.is_some() {
            // Being deleted and not running here (e.g. from an earlier agent): finish the deletion.
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            tokio::spawn(async move { remove_pod(&api, &pod).await });
            return;
        }
        if terminal {
            return;
        }
        let (updates, receiver) = watch::channel(Update::Pod(Box::new(pod)));
        let handle = tokio::spawn(supervise(
            self.client.clone(),
            self.settings.clone(),
            self.proxies.clone(),
            receiver,
        ));
        self.tasks.insert(uid, Task { updates, handle });
    }

    /// The pod vanished from the API: its processes go.
    fn gone(&mut self, uid: &str) {
        if let Some(task) = self.tasks.remove(uid) {
            task.updates.send_replace(Update::Gone);
        }
    }

    /// Stops every pod's processes (bounded) without touching the API objects.
    async fn shutdown(self) {
        for task in self.tasks.values() {
            task.updates.send_replace(Update::Shutdown);
        }
        let all = futures::future::join_all(self.tasks.into_values().map(|t| t.handle));
        if timeout(SHUTDOWN_DEADLINE, all).await.is_err() {
            log(format_args!("some pods did not stop in time; they die with the agent"));
        }
    }
}

/// Registers the node, retrying while the API server is not yet up.
async fn register_until_ready(client: &Client, settings: &Settings, since: &Time) -> anyhow::Result<()> {
    let deadline = Instant::now() + REGISTER_DEADLINE;
    loop {
        let attempt = async {
            register(client, settings).await?;
            heartbeat(client, settings, since).await
        };
        match timeout(Duration::from_secs(15), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(err)) if Instant::now() >= deadline => return Err(err).context("registering the node"),
            Err(_) if Instant::now() >= deadline => anyhow::bail!("registering the node timed out"),
            Ok(Err(err)) => log(format_args!("registering the node: {err:#}; retrying")),
            Err(_) => log(format_args!("registering the node timed out; retrying")),
        }
        sleep(Duration::from_secs(2)).await;
    }
}

/// Runs the agent until `shutdown` completes: registers the node and keeps it Ready, prints
/// `{"node": "<name>"}` on stdout once it is, and runs the pods bound to it. On shutdown every
/// pod process is stopped; the API objects are left as they are.
///
/// Call it on a current-thread runtime: child processes die with the thread that spawned them.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let settings = Arc::new(settings);
    let since = now();
    register_until_ready(&client, &settings, &since).await?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", serde_json::json!({ "node": settings.node_name }))?;
    stdout.flush()?;
    log(format_args!("node {} registered and Ready", settings.node_name));

    let api: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", settings.node_name));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut beat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pods = Pods {
        client: client.clone(),
        settings: settings.clone(),
        proxies: Proxies::new(client.clone()),
        tasks: HashMap::new(),
        listing: None,
    };
    tokio::pin!(shutdown);
    let mut result = Ok(());
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = beat.tick() => {
                match timeout(HEARTBEAT, heartbeat(&client, &settings, &since)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => log(format_args!("heartbeat failed: {err:#}")),
                    Err(_) => log(format_args!("heartbeat timed out")),
                }
            }
            event = events.next() => match event {
                Some(Ok(event)) => pods.handle(event),
                Some(Err(err)) => log(format_args!("watching pods: {err}")),
                None => {
                    result = Err(anyhow::anyhow!("the pod watch ended"));
                    break;
                }
            },
        }
    }
    log(format_args!("stopping {} pod(s)", pods.tasks.len()));
    pods.shutdown().await;
    result
}
