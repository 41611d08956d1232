//! An API server outage under a running pipeline: kube-apiserver (the one e2e/cluster/up started,
//! its pid in `<cluster dir>/pids`) is stopped with SIGSTOP for 30 s while a trainer reads. The
//! data plane does not go through the API server, so the trainer must keep receiving batches all
//! through the outage, not only from what was buffered before it. Afterwards the operator must
//! converge: if it ended (a leader that cannot renew its Lease may step down) it is started again,
//! as Kubernetes restarts its pod, and resumes from its journal; it holds the Lease again, writes
//! status again, its children exist exactly once (the same objects as before: nothing deleted and
//! made again, the Deployment not rolled), a spec change made after the outage is reconciled, and
//! every epoch the trainer completed held each element exactly once.

use super::*;
use granary_e2e::{Consumer, Seen, counts_per_epoch, start_consumer_env};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Secret;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How long kube-apiserver stays stopped.
const OUTAGE: Duration = Duration::from_secs(30);
/// The last part of the outage in which batches must still arrive: buffers filled before the
/// outage are long drained by then.
const OUTAGE_TAIL: Duration = Duration::from_secs(10);
const LINES: usize = 480;
const FILES: usize = 16;
/// More epochs than the test lasts: the trainer reads until it is stopped.
const EPOCHS: u32 = 1000;
const BATCH: u32 = 8;
const SLEEP_MS: u32 = 5;

/// The pid of the kube-apiserver that e2e/cluster/up started for the kubeconfig the suite uses,
/// from `<the kubeconfig's folder>/pids/kube-apiserver.pid`; `None` when there is no such file (a
/// cluster this test cannot stop). Checks that the pid is a running kube-apiserver.
fn apiserver_pid() -> Result<Option<i32>> {
    let Some(kubeconfig) = std::env::var_os(KUBECONFIG_VAR) else { return Ok(None) };
    let Some(dir) = Path::new(&kubeconfig).parent() else { return Ok(None) };
    let pidfile = dir.join("pids").join("kube-apiserver.pid");
    let Ok(text) = std::fs::read_to_string(&pidfile) else { return Ok(None) };
    let pid: i32 = text.trim().parse().with_context(|| format!("{} holds {text:?}", pidfile.display()))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("process {pid} of {} is not running", pidfile.display()))?;
    ensure!(
        String::from_utf8_lossy(&cmdline).contains("kube-apiserver"),
        "process {pid} of {} is not kube-apiserver",
        pidfile.display()
    );
    Ok(Some(pid))
}

/// kube-apiserver stopped (SIGSTOP): its sockets stay open and every request hangs. Continued
/// (SIGCONT) on drop, so that a failing test never leaves the cluster stopped.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Result<Stopped> {
        // SAFETY: kill(2) on the pid read and checked just before.
        let rc = unsafe { libc::kill(pid, libc::SIGSTOP) };
        ensure!(rc == 0, "SIGSTOP to kube-apiserver ({pid}): {}", std::io::Error::last_os_error());
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        if unsafe { libc::kill(self.0, libc::SIGCONT) } != 0 {
            eprintln!("SIGCONT to kube-apiserver ({}): {}", self.0, std::io::Error::last_os_error());
        }
    }
}

/// A trainer reading on a thread of its own, each batch noted with when it arrived.
struct Trainer {
    received: Arc<Mutex<Vec<(Instant, Seen)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Consumer>>,
}

impl Trainer {
    fn start(dispatcher: String, pipeline: String, env: Vec<(String, String)>) -> Trainer {
        let received: Arc<Mutex<Vec<(Instant, Seen)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let mut consumer = start_consumer_env(&dispatcher, &pipeline, &[], &env);
                // Bounded by the test: it sets `stop`, or the consumer ends.
                while !stop.load(Ordering::Relaxed) {
                    consumer.collect(consumer.seen.len() + 1, Duration::from_millis(100));
                    let now = Instant::now();
                    let fresh: Vec<Seen> = consumer.seen.drain(..).collect();
                    received
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend(fresh.into_iter().map(|s| (now, s)));
                    if consumer.proc.child.try_wait().ok().flatten().is_some() {
                        break;
                    }
                }
                consumer
            })
        };
        Trainer { received, stop, thread: Some(thread) }
    }

    /// Batches received so far.
    fn count(&self) -> usize {
        self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Batches received in `[from, to)`.
    fn between(&self, from: Instant, to: Instant) -> usize {
        let received = self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        received.iter().filter(|(at, _)| *at >= from && *at < to).count()
    }

    /// Stops the trainer and returns every batch it received, and how its process ended.
    fn stop(mut self) -> (Vec<Seen>, Option<std::process::ExitStatus>) {
        self.stop.store(true, Ordering::Relaxed);
        let exited = match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(mut consumer)) => consumer.proc.child.try_wait().ok().flatten(),
            _ => None,
        };
        let received =
            std::mem::take(&mut *self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        (received.into_iter().map(|(_, s)| s).collect(), exited)
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The uids of pipeline `name`'s children: its Deployment, Service, worker and trainer Secrets,
/// and the Deployment's ReplicaSets; checking that each kind has exactly one.
async fn children(c: &Cluster, name: &str) -> Result<BTreeMap<String, String>> {
    let mut uids = BTreeMap::new();
    let selector = format!("granary.dev/pipeline={name}");
    let by_label = ListParams::default().labels(&selector);
    let uid = |kind: &str, meta: &ObjectMeta| -> Result<(String, String)> {
        Ok((kind.to_string(), meta.uid.clone().with_context(|| format!("a {kind} without a uid"))?))
    };
    let deployments = c.deployments().list(&by_label).await?.items;
    ensure!(deployments.len() == 1, "{} Deployments of {name}", deployments.len());
    let (k, v) = uid("Deployment", &deployments[0].metadata)?;
    uids.insert(k, v);
    let services = c.services().list(&by_label).await?.items;
    ensure!(services.len() == 1, "{} Services of {name}", services.len());
    let (k, v) = uid("Service", &services[0].metadata)?;
    uids.insert(k, v);
    // The pod template does not change: a second ReplicaSet would mean a rolled Deployment.
    let replica_sets: Api<ReplicaSet> = Api::namespaced(c.client.clone(), &c.ns);
    let owned: Vec<ReplicaSet> = replica_sets
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|rs| {
            rs.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| Some(&o.uid) == deployments[0].metadata.uid.as_ref())
        })
        .collect();
    ensure!(owned.len() <= 1, "the Deployment of {name} was rolled: {} ReplicaSets", owned.len());
    if let Some(rs) = owned.first() {
        let (k, v) = uid("ReplicaSet", &rs.metadata)?;
        uids.insert(k, v);
    }
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &c.ns);
    for kind in ["worker", "trainer"] {
        let secret = secrets
            .get(&format!("{name}-granary-{kind}"))
            .await
            .with_context(|| format!("the {kind} Secret"))?;
        let (k, v) = uid(&format!("{kind} Secret"), &secret.metadata)?;
        uids.insert(k, v);
    }
    Ok(uids)
}

/// The `status.epoch` of `p`.
fn status_epoch(p: &DynamicObject) -> Option<u64> {
    p.data.pointer("/status/epoch").and_then(Value::as_u64)
}

pub async fn api_server_outage(c: Cluster) -> Result<()> {
    let Some(pid) = apiserver_pid()? else {
        eprintln!(
            "skipped the API server outage: no pids/kube-apiserver.pid next to {KUBECONFIG_VAR}, so this is \
             not a control plane of e2e/cluster/up that the test may stop"
        );
        return Ok(());
    };
    let Some(node) = c.ready_node().await? else {
        eprintln!("skipped the API server outage: the cluster has no Ready node, so no worker pod can run");
        return Ok(());
    };
    let data = tempfile::tempdir()?;
    granary_e2e::write_numbers(data.path(), LINES, FILES)?;
    let name = "outage";
    let spec = json!({
        "source": {"url": format!("file://{}/", data.path().display()), "format": "jsonl"},
        "stages": [{"op": "test.sleep", "ms": SLEEP_MS}],
        "batch": {"size": BATCH},
        "epochs": EPOCHS,
        "scaling": {"policy": "fixed", "replicas": 1},
    });
    c.create_pipeline(name, spec).await?;
    c.wait_workers(name).await?;
    let workers = super::running::wait_workers_running(&c, name, 1).await?;
    eprintln!("node {node} runs worker process {workers:?}");

    let credentials = super::secured::trainer_credentials(&c, name).await?;
    let trainer = Trainer::start(c.dispatcher.clone(), format!("{}/{name}", c.ns), credentials.env.clone());
    wait_for(DEADLINE, "the trainer to receive batches", async || {
        let n = trainer.count();
        ensure!(n >= 20, "{n} batches");
        Ok(())
    })
    .await?;
    let before = children(&c, name).await?;
    let reconciled = c.wait_reconciled(name).await?;
    let epoch_before = status_epoch(&reconciled);

    // The outage. Nothing here calls the API server.
    let stopped = Stopped::new(pid)?;
    let began = Instant::now();
    eprintln!("kube-apiserver ({pid}) stopped at {} batches", trainer.count());
    let mut per_second = Vec::new();
    let mut last = trainer.count();
    while began.elapsed() < OUTAGE {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = trainer.count();
        per_second.push(now - last);
        last = now;
    }
    let ended = Instant::now();
    drop(stopped);
    let during = trainer.between(began, ended);
    let tail = trainer.between(ended - OUTAGE_TAIL, ended);
    let exited = c.operator.exited();
    eprintln!(
        "kube-apiserver continued after {:?}: the trainer received {during} batches during the outage, {tail} in \
         its last {OUTAGE_TAIL:?} (per second: {per_second:?}); the operator {}",
        ended - began,
        match &exited {
            Some(status) => format!("ended ({status})"),
            None => "kept running".to_string(),
        }
    );
    ensure!(
        tail > 0,
        "the trainer received no batch in the last {OUTAGE_TAIL:?} of the API server outage ({during} during it, \
         per second {per_second:?}; the operator {exited:?}): the data plane stalled without the API server"
    );

    // Afterwards: the API server answers; an operator that ended is started again, as Kubernetes
    // restarts its pod, and leads again.
    wait_for(DEADLINE, "the API server to answer again", async || Ok(c.client.apiserver_version().await?))
        .await?;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.ns);
    let mut restarts = 0;
    let mut metrics = c.metrics.clone();
    wait_for(DEADLINE, format!("a ready operator holding Lease {OPERATOR} as {}", c.identity), async || {
        if let Some(status) = c.operator.exited() {
            ensure!(restarts < 3, "the operator ended {restarts} times after the outage, last {status}");
            restarts += 1;
            eprintln!("the operator ended ({status}); starting it again, as Kubernetes restarts its pod");
            metrics = c.operator.restart().await?;
        }
        let lease = leases.get_opt(OPERATOR).await?.context("no Lease")?;
        let holder = lease.spec.and_then(|s| s.holder_identity);
        ensure!(holder.as_deref() == Some(c.identity.as_str()), "holderIdentity is {holder:?}");
        // The Lease outlives a leader that stepped down: only leading makes /readyz answer 200.
        let ready = http_status(&metrics, "/readyz").await?;
        ensure!(ready == 200, "the operator's /readyz answers {ready}: it does not lead");
        Ok(())
    })
    .await?;

    // The trainer goes on, and the status follows it again.
    let resumed = Instant::now();
    wait_for(DEADLINE, "the trainer to go on receiving after the outage", async || {
        let n = trainer.between(resumed, Instant::now());
        ensure!(n >= 20, "{n} batches since the operator was back");
        Ok(())
    })
    .await?;
    wait_for(
        DEADLINE,
        format!("InputPipeline {name}'s status.epoch to move past {epoch_before:?}"),
        async || {
            let p = c.pipeline(name).await?;
            check_reconciled(&p)?;
            ensure!(status_epoch(&p) > epoch_before, "{}", summary(&p));
            Ok(())
        },
    )
    .await?;
    let after = children(&c, name).await?;
    ensure!(after == before, "the children changed through the outage: {before:?} → {after:?}");

    // A spec change after the outage is reconciled, on the same objects.
    c.patch_spec(name, json!({"scaling": {"replicas": 2}})).await?;
    c.wait_scale(name, 2..=2).await?;
    let p = c.wait_reconciled(name).await?;
    wait_for(DEADLINE, format!("InputPipeline {name} to count 2 desired workers"), async || {
        let p = c.pipeline(name).await?;
        let desired = p.data.pointer("/status/desiredWorkers").and_then(Value::as_u64);
        ensure!(desired == Some(2), "{}", summary(&p));
        Ok(())
    })
    .await?;
    let changed = children(&c, name).await?;
    ensure!(changed == before, "the children changed with the scale: {before:?} → {changed:?}");
    eprintln!(
        "after the outage: generation {:?} reconciled, children unchanged {before:?}",
        p.metadata.generation
    );

    // Every epoch the trainer completed held each element exactly once; the one it was in held
    // none twice.
    let (seen, exited) = trainer.stop();
    ensure!(exited.is_none(), "the trainer ended on its own ({exited:?}) after {} batches", seen.len());
    let counts = counts_per_epoch(&seen);
    let last = counts.keys().max().copied().context("no epoch")?;
    ensure!(last >= 2, "the trainer completed {last} epochs");
    for (epoch, keys) in &counts {
        let twice: Vec<(&String, &usize)> = keys.iter().filter(|(_, n)| **n > 1).collect();
        ensure!(twice.is_empty(), "epoch {epoch}: elements delivered more than once: {twice:?}");
        ensure!(
            *epoch == last || keys.len() == LINES,
            "epoch {epoch} held {} elements, not {LINES}",
            keys.len()
        );
    }
    eprintln!("the trainer completed {last} epochs, each element exactly once in each");
    Ok(())
}
