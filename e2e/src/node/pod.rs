//! The supervisor of one pod: starts its containers, restarts them, probes them, reports the
//! pod's status, and on deletion stops them and removes the pod, as a kubelet would.

use super::api::{brief, remove_pod};
use super::container::ContainerRt;
use super::credentials::{self, KUBECONFIG_VAR, Projected};
use super::env::Sources;
use super::launch::{base_env, inherited_env, launch};
use super::ports::{PORTS_ANNOTATION, PortMap};
use super::probe::Prober;
use super::services::Proxies;
use super::status::{Transitions, now, pod_status, status_patch};
use super::volumes;
use super::{Settings, Update, log};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

/// How often the supervisor looks at its processes.
const TICK: Duration = Duration::from_millis(250);
/// How long a container with a configuration problem waits before the next try.
const CONFIG_RETRY: Duration = Duration::from_secs(5);
/// The grace period when the pod vanished from the API or the agent stops.
const QUICK_GRACE: Duration = Duration::from_secs(2);

/// One pod under supervision.
struct PodRt {
    api: Api<Pod>,
    client: Client,
    settings: Arc<Settings>,
    pod: Pod,
    key: String,
    dir: PathBuf,
    ports: PortMap,
    containers: Vec<ContainerRt>,
    failure: Option<(String, String)>,
    proxies: Arc<Proxies>,
    /// The pod's ServiceAccount credentials, once given ([`credentials`]), and when.
    credentials: Option<(Option<Projected>, Instant)>,
    start_time: Time,
    transitions: Transitions,
    patched: Option<Value>,
}

/// Runs the pod of the first update until it is deleted, vanishes, or the agent stops.
pub async fn supervise(
    client: Client,
    settings: Arc<Settings>,
    proxies: Arc<Proxies>,
    mut updates: watch::Receiver<Update>,
) {
    let Update::Pod(pod) = updates.borrow_and_update().clone() else { return };
    let mut rt = match PodRt::new(client, settings, proxies, *pod) {
        Ok(rt) => rt,
        Err(err) => return log(format_args!("cannot prepare a pod: {err:#}")),
    };
    rt.annotate_ports().await;
    loop {
        let update = updates.borrow_and_update().clone();
        match update {
            Update::Gone | Update::Shutdown => return rt.stop(QUICK_GRACE).await,
            Update::Pod(pod) => rt.pod = *pod,
        }
        if rt.pod.metadata.deletion_timestamp.is_some() {
            let grace = rt.grace();
            log(format_args!("{}: deleted, stopping it within {}s", rt.key, grace.as_secs()));
            rt.stop(grace).await;
            rt.report().await;
            return rt.remove().await;
        }
        rt.step().await;
        rt.report().await;
        tokio::select! {
            changed = updates.changed() => if changed.is_err() { return rt.stop(QUICK_GRACE).await },
            () = sleep(TICK) => {}
        }
    }
}

impl PodRt {
    fn new(client: Client, settings: Arc<Settings>, proxies: Arc<Proxies>, pod: Pod) -> anyhow::Result<Self> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let short: String = uid.chars().take(8).collect();
        let dir = settings.state_dir.join("pods").join(format!("{namespace}_{name}_{short}"));
        std::fs::create_dir_all(dir.join("tmp"))?;
        let spec = pod.spec.clone().unwrap_or_default();
        let ports = PortMap::allocate(&spec)?;
        let mut failure = None;
        if spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
            failure = Some("init containers are not supported by granary-e2e-node");
        } else if spec.ephemeral_containers.as_ref().is_some_and(|c| !c.is_empty()) {
            failure = Some("ephemeral containers are not supported by granary-e2e-node");
        } else if spec.containers.is_empty() {
            failure = Some("the pod has no containers");
        }
        let containers = match failure {
            Some(_) => Vec::new(),
            None => {
                spec.containers.iter().map(|c| ContainerRt::new(c.clone(), Prober::new(c, &ports))).collect()
            }
        };
        let key = format!("{namespace}/{name}");
        let mapped: Vec<String> = ports.ports.iter().map(|(c, h)| format!("{c}->{h}")).collect();
        log(format_args!("{key}: starting in {} (ports {})", dir.display(), mapped.join(", ")));
        // A pod taken over from an earlier agent keeps its start time.
        let start_time = pod.status.as_ref().and_then(|s| s.start_time.clone()).unwrap_or_else(now);
        Ok(Self {
            api: Api::namespaced(client.clone(), &namespace),
            client,
            settings,
            pod,
            key,
            dir,
            ports,
            containers,
            failure: failure.map(|f| ("Unsupported".to_string(), f.to_string())),
            proxies,
            credentials: None,
            start_time,
            transitions: Transitions::default(),
            patched: None,
        })
    }

    /// Publishes the host ports as an annotation, for tests that need to reach a pod.
    async fn annotate_ports(&self) {
        let ports: serde_json::Map<String, Value> =
            self.ports.ports.iter().map(|(c, h)| (c.to_string(), json!(h))).collect();
        let value = Value::Object(ports).to_string();
        let patch = json!({"metadata": {"annotations": {PORTS_ANNOTATION: value}}});
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        if let Err(err) = self.api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            log(format_args!("{}: cannot annotate the host ports: {}", self.key, brief(&err)));
        }
    }

    /// The grace period of a deletion.
    /// At least [`QUICK_GRACE`], as kubelets give force-deleted pods a little time too.
    fn grace(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds));
        let seconds = seconds.and_then(|s| u64::try_from(s).ok()).unwrap_or(30).min(600);
        Duration::from_secs(seconds).max(QUICK_GRACE)
    }

    /// Gives the pod its ServiceAccount credentials the first time, and a fresh token every
    /// [`credentials::REFRESH`]; `Err` when the first attempt fails (a refresh that fails keeps
    /// the old token, and is tried again at the next step).
    async fn project_credentials(&mut self) -> Result<(), String> {
        let Some(cluster) = self.settings.cluster.as_ref() else { return Ok(()) };
        let due = match &self.credentials {
            None => true,
            Some((Some(_), at)) => at.elapsed() >= credentials::REFRESH,
            Some((None, _)) => false,
        };
        if !due {
            return Ok(());
        }
        match credentials::project(&self.client, cluster, &self.pod, &self.dir).await {
            Ok(projected) => {
                if self.credentials.is_none() && projected.is_some() {
                    let account = credentials::service_account(&self.pod);
                    log(format_args!("{}: credentials of ServiceAccount {account} in KUBECONFIG", self.key));
                }
                self.credentials = Some((projected, Instant::now()));
                Ok(())
            }
            Err(err) if self.credentials.is_some() => {
                log(format_args!("{}: refreshing the ServiceAccount token: {err:#}", self.key));
                Ok(())
            }
            Err(err) => Err(format!("{err:#}")),
        }
    }

    /// Reaps exited processes, starts what is due and runs due probes.
    async fn step(&mut self) {
        let policy = self.pod.spec.as_ref().and_then(|s| s.restart_policy.clone());
        let policy = policy.as_deref();
        let mut sources: Option<Sources> = None;
        let due = self.containers.iter().any(|c| c.start_at.is_some_and(|at| at <= Instant::now()));
        let running = self.containers.iter().any(|c| c.run.is_some());
        let mut credentials_problem = None;
        if due || running {
            credentials_problem = self.project_credentials().await.err();
        }
        for i in 0..self.containers.len() {
            if self.containers[i].poll(policy) {
                log(format_args!(
                    "{}: container {} exited: {:?}",
                    self.key, self.containers[i].spec.name, self.containers[i].last
                ));
            }
            if self.containers[i].start_at.is_some_and(|at| at <= Instant::now()) {
                if let Some(message) = &credentials_problem {
                    let message = format!("the ServiceAccount's credentials: {message}");
                    self.containers[i].cannot_start("CreateContainerConfigError", message, CONFIG_RETRY);
                    continue;
                }
                if sources.is_none() {
                    match Sources::fetch(&self.client, &self.pod).await {
                        Ok(fetched) => sources = Some(fetched),
                        Err(err) => {
                            let message = format!("{err:#}");
                            self.containers[i].cannot_start(
                                "CreateContainerConfigError",
                                message,
                                CONFIG_RETRY,
                            );
                            continue;
                        }
                    }
                }
                self.start(i, sources.as_ref().unwrap_or(&Sources::default()), policy);
            }
            let c = &mut self.containers[i];
            if c.run.is_some() && c.prober.due(Instant::now()) {
                let ok = c.prober.probe().await;
                c.prober.record(ok, Instant::now());
            }
        }
    }

    fn start(&mut self, i: usize, sources: &Sources, policy: Option<&str>) {
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        let mut base = base_env(&inherited_env(), &self.dir.join("tmp"), &name);
        if let Some((Some(projected), _)) = &self.credentials {
            base.insert(KUBECONFIG_VAR.to_string(), projected.kubeconfig.display().to_string());
        }
        let proxies = self.proxies.clone();
        let services = move |service: &super::services::ServiceRef| proxies.address(service);
        let c = &mut self.containers[i];
        let mounts = volumes::plan(&self.pod, &c.spec, sources).and_then(|planned| {
            volumes::materialize(&planned, &self.dir).map_err(|e| format!("writing the pod's volumes: {e}"))
        });
        let launched = mounts.and_then(|mounts| {
            launch(
                &self.pod,
                &c.spec,
                sources,
                &self.ports,
                &mounts,
                &services,
                &self.settings.granary_bin,
                base,
            )
        });
        match launched {
            Ok(l) => {
                let log_file = self.dir.join(format!("{}.log", c.spec.name));
                c.start(&l, &self.dir, &log_file, policy);
                log(format_args!("{}: container {} started: {:?}", self.key, c.spec.name, c.state));
            }
            Err(message) => {
                log(format_args!("{}: container {}: {message}", self.key, c.spec.name));
                c.cannot_start("CreateContainerConfigError", message, CONFIG_RETRY);
            }
        }
    }

    /// Patches the pod's status when it changed.
    async fn report(&mut self) {
        let views: Vec<_> = self.containers.iter().map(ContainerRt::view).collect();
        let failure = self.failure.as_ref().map(|(r, m)| (r.as_str(), m.as_str()));
        let status = pod_status(&views, failure, &self.start_time, &mut self.transitions, &now());
        let patch = status_patch(&status);
        if self.patched.as_ref() == Some(&patch) {
            return;
        }
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        match self.api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                let ready =
                    status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
                log(format_args!("{}: phase {}, ready {ready}", self.key, status.phase.unwrap_or_default()));
                self.patched = Some(patch);
            }
            // Gone already (force-deleted): the watch tells the supervisor soon.
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(err) => log(format_args!("{}: cannot patch the status: {}", self.key, brief(&err))),
        }
    }

    /// Stops every process within `grace`.
    async fn stop(&mut self, grace: Duration) {
        let running: Vec<usize> =
            (0..self.containers.len()).filter(|i| self.containers[*i].run.is_some()).collect();
        let mut children: Vec<&mut std::process::Child> =
            self.containers.iter_mut().filter_map(|c| c.run.as_mut().map(|r| &mut r.child)).collect();
        let codes = super::process::stop(&mut children, grace).await;
        for (i, code) in running.into_iter().zip(codes) {
            self.containers[i].stopped(code);
        }
    }

    /// Deletes the pod for good (grace period 0, only this incarnation of it), as kubelets do.
    async fn remove(&self) {
        remove_pod(&self.api, &self.pod).await;
        log(format_args!("{}: removed", self.key));
    }
}
