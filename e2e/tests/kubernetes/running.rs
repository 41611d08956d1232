//! The whole loop on a control plane with a node: an `InputPipeline` becomes a Deployment and a
//! Service, the scheduler binds its pods to the node, the node agent runs them as worker processes,
//! a trainer consumes every epoch exactly once while the autoscaler raises `spec.replicas` and the
//! pods and processes follow, the status and Events say why, Prometheus scrapes the operator for
//! its dashboard, and deleting the pipeline stops the workers. Also: the operator without one
//! permission of the chart's RBAC says which, where the pipeline's owner looks.

use super::*;
use granary_e2e::prometheus::{Prometheus, dashboard_exprs, now, substitute};
use granary_e2e::{assert_exactly_once, start_consumer_env};

/// Milliseconds `test.sleep` waits per element.
const SLEEP_MS: u32 = 10;
const BATCH: u32 = 8;
const LINES: usize = 1600;
/// One split per file, so that several workers share an epoch.
const FILES: usize = 32;
const EPOCHS: u32 = 3;
const MAX_WORKERS: i32 = 3;
/// The trainer's step: far faster than one worker delivers (it needs every worker it can get).
const STEP_MS: &str = "2";
/// How long the autoscaler gets to raise the count, and the pods to follow.
const SCALE_DEADLINE: Duration = Duration::from_secs(90);

/// The pids of the worker processes the node agent runs for `name`'s pods that are Running and
/// Ready (the agent reports each as containerID `granary-e2e://<pid>`), checked alive in /proc.
async fn live_workers(c: &Cluster, name: &str) -> Result<Vec<u32>> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &c.ns);
    let selector = format!("granary.dev/pipeline={name}");
    let mut pids = Vec::new();
    for pod in pods.list(&ListParams::default().labels(&selector)).await?.items {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = pod.status.unwrap_or_default();
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        if status.phase.as_deref() != Some("Running") || !ready {
            continue;
        }
        for container in status.container_statuses.iter().flatten() {
            let id = container.container_id.as_deref().unwrap_or_default();
            let pid: u32 = id
                .strip_prefix("granary-e2e://")
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("container {} has no process id: {id:?}", container.name))?;
            ensure!(Path::new(&format!("/proc/{pid}")).exists(), "worker process {pid} is not running");
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Waits until exactly `n` worker processes of `name` run Ready, the Deployment counts them and
/// the pipeline's status reads `n/n`.
pub async fn wait_workers_running(c: &Cluster, name: &str, n: usize) -> Result<Vec<u32>> {
    wait_for(SCALE_DEADLINE, format!("{n} worker processes of {name} running and counted"), async || {
        let pids = live_workers(c, name).await?;
        ensure!(pids.len() == n, "{} running: {pids:?}; pods: {}", pids.len(), c.describe_pods(name).await);
        let d = c.deployments().get(&workers(name)).await?;
        let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        ensure!(ready as usize == n, "the Deployment counts {ready} ready");
        let p = c.pipeline(name).await?;
        let counted = p.data.pointer("/status/workers").and_then(Value::as_str);
        ensure!(counted == Some(&format!("{n}/{n}")), "{}", summary(&p));
        Ok(pids)
    })
    .await
}

/// The scale subresource's `spec.replicas` of `name`'s Deployment.
async fn replicas(c: &Cluster, name: &str) -> Result<i32> {
    let scale = c.deployments().get_scale(&workers(name)).await?;
    scale.spec.and_then(|s| s.replicas).context("the scale has no spec.replicas")
}

pub async fn whole_loop(c: Cluster) -> Result<()> {
    let Some(node) = c.ready_node().await? else {
        eprintln!("skipped the whole loop: the cluster has no Ready node, so no worker pod can run");
        return Ok(());
    };
    let data = tempfile::tempdir()?;
    granary_e2e::write_numbers(data.path(), LINES, FILES)?;
    let metrics = c.metrics.clone();
    let prometheus =
        tokio::task::spawn_blocking(move || Prometheus::start_static("granary-operator", &[&metrics]))
            .await?;
    let began = now() - 5.0;

    let name = "loop";
    let spec = json!({
        "source": {"url": format!("file://{}/", data.path().display()), "format": "jsonl"},
        "stages": [{"op": "test.sleep", "ms": SLEEP_MS}],
        "batch": {"size": BATCH},
        "epochs": EPOCHS,
        "scaling": {"policy": "auto", "minWorkers": 1, "maxWorkers": MAX_WORKERS},
    });
    c.create_pipeline(name, spec).await?;
    c.wait_workers(name).await?;
    let first = wait_workers_running(&c, name, 1).await?;
    eprintln!("node {node} runs worker process {first:?}");

    let dispatcher = c.dispatcher.clone();
    let pipeline = format!("{}/{name}", c.ns);
    let credentials = super::secured::trainer_credentials(&c, name).await?;
    let consumer = tokio::task::spawn_blocking(move || {
        let env = credentials.vars();
        let mut consumer = start_consumer_env(&dispatcher, &pipeline, &["--step-ms", STEP_MS], &env);
        let finished = consumer.finish(Duration::from_secs(180));
        (finished, consumer)
    });

    // The autoscaler sees a starved trainer and raises spec.replicas; pods and processes follow.
    let scaled = wait_for(SCALE_DEADLINE, "the autoscaler to raise spec.replicas above 1", async || {
        let n = replicas(&c, name).await?;
        ensure!(n > 1, "spec.replicas is {n}");
        Ok(n)
    })
    .await?;
    eprintln!("the autoscaler set spec.replicas to {scaled}");
    let pids = wait_for(SCALE_DEADLINE, "the worker processes to follow spec.replicas", async || {
        let want = replicas(&c, name).await?;
        let pids = live_workers(&c, name).await?;
        ensure!(want > 1 && pids.len() == want as usize, "{} processes for spec.replicas {want}", pids.len());
        Ok(pids)
    })
    .await?;
    eprintln!("{} worker processes run: {pids:?}", pids.len());

    let (finished, consumer) = consumer.await?;
    ensure!(
        finished,
        "the trainer did not finish {EPOCHS} epochs within 180 s ({} batches)",
        consumer.seen.len()
    );
    let mut keys: Vec<String> = consumer.seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    ensure!(
        keys.len() == LINES * EPOCHS as usize,
        "{} elements delivered, not {}",
        keys.len(),
        LINES * EPOCHS as usize
    );
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == LINES, "{} distinct elements, not {LINES}", keys.len());
    assert_exactly_once(&consumer.seen, &keys, EPOCHS);
    eprintln!("the trainer received each of {LINES} elements exactly once in each of {EPOCHS} epochs");

    // The status and Events say what happened and why.
    let p = wait_for(DEADLINE, format!("InputPipeline {name} to report Completed"), async || {
        let p = c.pipeline(name).await?;
        let phase = p.data.pointer("/status/phase").and_then(Value::as_str);
        ensure!(phase == Some("Completed"), "{}", summary(&p));
        Ok(p)
    })
    .await?;
    let scaling = condition(&p, "Scaling").context("no Scaling condition")?;
    ensure!(scaling["message"].as_str().is_some_and(|m| !m.is_empty()), "Scaling says nothing: {scaling}");
    let uid = uid_of(&p)?.to_string();
    let events = c.operator_events(&uid).await?;
    let said = |reason: &str| events.iter().filter(|e| e.reason.as_deref() == Some(reason)).count();
    let raised = events.iter().filter_map(|e| e.note.as_deref()).find(|n| n.starts_with("scaled from 1 to"));
    ensure!(
        raised.is_some() && said("Registered") >= 1 && said("Completed") == 1,
        "expected Registered, Scaled (from 1 up, with its reason) and Completed Events, got {:?}",
        events.iter().map(|e| (&e.reason, &e.note)).collect::<Vec<_>>()
    );
    eprintln!(
        "status: {}; Scaling: {}; Event: {}",
        p.data["status"]["phase"],
        scaling["message"],
        raised.unwrap_or("")
    );

    // The operator's dashboard against the operator's own metrics.
    let ended = now() + 3.0;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let checked =
        tokio::task::spawn_blocking(move || operator_dashboard(&prometheus, began, ended)).await??;
    eprintln!("the operator dashboard's {checked} expressions all returned data");

    // Deleting the pipeline stops every worker process.
    c.pipelines().delete(name, &DeleteParams::default()).await.context("deleting the pipeline")?;
    let all: Vec<u32> = first.into_iter().chain(pids).collect();
    wait_for(DEADLINE, format!("the pods and processes of {name} to be gone"), async || {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &c.ns);
        let left = pods.list(&ListParams::default().labels(&format!("granary.dev/pipeline={name}"))).await?;
        ensure!(left.items.is_empty(), "pods left: {}", c.describe_pods(name).await);
        let running: Vec<&u32> =
            all.iter().filter(|pid| Path::new(&format!("/proc/{pid}")).exists()).collect();
        ensure!(running.is_empty(), "worker processes still running: {running:?}");
        ensure!(c.deployments().get_opt(&workers(name)).await?.is_none(), "the Deployment is still there");
        Ok(())
    })
    .await
}

/// Runs every expression of the operator dashboard over `[began, ended]`; all must return data.
fn operator_dashboard(prometheus: &Prometheus, began: f64, ended: f64) -> Result<usize> {
    let exprs: Vec<(String, String)> =
        dashboard_exprs().into_iter().filter(|(place, _)| place.starts_with("operator.json")).collect();
    ensure!(exprs.len() >= 10, "the operator dashboard has {} expressions", exprs.len());
    let mut problems = Vec::new();
    for (place, expr) in &exprs {
        let query = substitute(expr);
        match prometheus.query_range(&query, began, ended) {
            Err(e) => problems.push(format!("{place}: Prometheus refused `{query}`: {e}")),
            Ok(0) => problems.push(format!("{place}: no data for `{query}`")),
            Ok(_) => {}
        }
    }
    ensure!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    Ok(exprs.len())
}

/// The chart's roles without `patch` on `deployments/scale`: the operator cannot size the
/// pool, and says so in status and in a Warning Event; with the permission back it recovers.
pub async fn missing_permission(c: Cluster) -> Result<()> {
    let name = "unscalable";
    c.create_pipeline(name, with_scaling(json!({"policy": "fixed", "replicas": 2}))).await?;
    let p =
        wait_for(DEADLINE, format!("InputPipeline {name} to report the missing permission"), async || {
            let p = c.pipeline(name).await?;
            let ready =
                condition(&p, "Ready").with_context(|| format!("no Ready condition: {}", summary(&p)))?;
            let message = ready["message"].as_str().unwrap_or_default();
            ensure!(
                ready["status"] == "False"
                    && ready["reason"] == "ReconcileFailed"
                    && message.contains("forbidden")
                    && message.contains("deployments/scale")
                    && message.contains("ClusterRole"),
                "Ready is {ready}"
            );
            Ok(p)
        })
        .await?;
    let uid = uid_of(&p)?.to_string();
    let events = c.operator_events(&uid).await?;
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("ReconcileFailed") && e.type_.as_deref() == Some("Warning"))
        .with_context(|| {
            format!(
                "no Warning Event ReconcileFailed: {:?}",
                events.iter().map(|e| &e.reason).collect::<Vec<_>>()
            )
        })?;
    eprintln!("reported: {}", warning.note.as_deref().unwrap_or_default());
    ensure!(replicas(&c, name).await? != 2, "the Deployment was scaled to 2 without the permission");

    // The permission back: the same operator scales and reports Ready again.
    let rbac = identity::chart_rbac(&c.ns)?;
    identity::apply(&c.client, &c.ns, TEST_MANAGER, &rbac).await?;
    c.wait_scale(name, 2..=2).await?;
    wait_for(DEADLINE, format!("InputPipeline {name} to leave ReconcileFailed"), async || {
        let p = c.pipeline(name).await?;
        let ready = condition(&p, "Ready").context("no Ready condition")?;
        ensure!(ready["reason"] != "ReconcileFailed", "Ready is {ready}");
        Ok(())
    })
    .await
}
