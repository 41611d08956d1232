//! Scale to zero on a control plane with a node: a `minWorkers: 0` pipeline runs no worker until
//! a trainer connects, starts one for it (the cold start, measured), releases every worker once
//! no trainer has been attached for `idleAfter`, starts again for a trainer that resumes, and
//! releases them when the epoch is complete. The trainer gets every element exactly once across
//! the stop and the resume. Status reads `Running` with `Ready=True ScaledToZero` while idle,
//! and every condition carries the standard fields. A completed pipeline stays Completed, with no
//! worker, across an operator killed and started again (its trainer never comes back).

use super::*;
use granary_e2e::{assert_exactly_once, start_consumer_env};

const LINES: usize = 240;
const FILES: usize = 8;
const BATCH: u32 = 8;
/// Batches the first trainer reads before it stops (of 30 in the epoch).
const FIRST: u64 = 6;
/// How long the pool stays up without a trainer.
const IDLE_AFTER: &str = "6s";
/// Workers starting, trainers attaching and leaving, and the idle time: generous bounds.
const STEP: Duration = Duration::from_secs(90);

async fn replicas(c: &Cluster, name: &str) -> Result<i32> {
    let scale = c.deployments().get_scale(&workers(name)).await?;
    Ok(scale.spec.and_then(|s| s.replicas).unwrap_or(0))
}

/// Waits until the scale subresource asks for no worker and the pipeline reads as idle.
async fn wait_idle(c: &Cluster, name: &str, why: &str) -> Result<()> {
    wait_for(STEP, format!("{name} to scale to zero ({why})"), async || {
        let n = replicas(c, name).await?;
        ensure!(n == 0, "spec.replicas is {n}");
        let p = c.pipeline(name).await?;
        let ready = condition(&p, "Ready").with_context(|| format!("no Ready condition: {}", summary(&p)))?;
        ensure!(ready["reason"] == "ScaledToZero" || ready["reason"] == "Completed", "Ready is {ready}");
        check_standard_conditions(&p)?;
        Ok(())
    })
    .await
}

/// Every condition is a `metav1.Condition` of the pipeline's current generation.
fn check_standard_conditions(p: &DynamicObject) -> Result<()> {
    let generation = p.metadata.generation.context("no metadata.generation")?;
    let conditions =
        p.data.pointer("/status/conditions").and_then(Value::as_array).context("no conditions")?;
    for c in conditions {
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            ensure!(c[field].is_string(), "condition without `{field}`: {c}");
        }
        ensure!(["True", "False", "Unknown"].contains(&c["status"].as_str().unwrap_or_default()), "{c}");
        ensure!(c["observedGeneration"].as_i64() == Some(generation), "condition of another generation: {c}");
    }
    Ok(())
}

pub async fn scale_to_zero(c: Cluster) -> Result<()> {
    if c.ready_node().await?.is_none() {
        eprintln!("skipped scale to zero: the cluster has no Ready node, so no worker pod can run");
        return Ok(());
    }
    let data = tempfile::tempdir()?;
    granary_e2e::write_numbers(data.path(), LINES, FILES)?;
    let name = "idle";
    let spec = json!({
        "source": {"url": format!("file://{}/", data.path().display()), "format": "jsonl"},
        "stages": [{"op": "test.sleep", "ms": 1}],
        "batch": {"size": BATCH},
        "scaling": {"policy": "auto", "minWorkers": 0, "maxWorkers": 2, "idleAfter": IDLE_AFTER},
    });
    c.create_pipeline(name, spec).await?;
    wait_idle(&c, name, "no trainer yet").await?;
    let p = c.pipeline(name).await?;
    let endpoint = p.data.pointer("/status/endpoint/pipeline").and_then(Value::as_str);
    ensure!(endpoint == Some(&format!("{}/{name}", c.ns)), "status.endpoint: {}", p.data["status"]);
    eprintln!("no worker runs before a trainer connects; status.endpoint {}", p.data["status"]["endpoint"]);

    // A trainer connects: workers start for it. It stops after a few batches, checkpointing.
    let checkpoint = data.path().join("trainer.ckpt");
    let credentials = super::secured::trainer_credentials(&c, name).await?;
    let (dispatcher, pipeline) = (c.dispatcher.clone(), format!("{}/{name}", c.ns));
    let args = ["--stop-after", &FIRST.to_string(), "--checkpoint", &checkpoint.display().to_string()]
        .map(String::from);
    let env = credentials.vars().iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    let run = move |args: Vec<String>| {
        let (dispatcher, pipeline, env) = (dispatcher.clone(), pipeline.clone(), env.clone());
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let began = Instant::now();
            let mut consumer = start_consumer_env(&dispatcher, &pipeline, &args, &env);
            consumer.collect(1, Duration::from_secs(120));
            let first_batch = began.elapsed();
            let finished = consumer.finish(Duration::from_secs(120));
            (finished, first_batch, consumer.seen)
        })
    };
    let (finished, cold, mut seen) = run(args.to_vec()).await?;
    ensure!(finished && seen.len() as u64 == FIRST, "the first trainer got {} batches", seen.len());
    eprintln!(
        "cold start: the first batch came {:.1} s after the trainer connected at 0 workers",
        cold.as_secs_f64()
    );

    // No trainer for idleAfter: every worker goes.
    wait_idle(&c, name, "the trainer left").await?;
    let p = c.pipeline(name).await?;
    eprintln!("idle again: {}", condition(&p, "Ready").map(|r| r["message"].to_string()).unwrap_or_default());

    // The trainer resumes: workers start again, and the epoch completes exactly once.
    let resume = ["--resume", &checkpoint.display().to_string()].map(String::from);
    let (finished, cold, rest) = run(resume.to_vec()).await?;
    ensure!(finished, "the resumed trainer did not finish the epoch ({} batches)", rest.len());
    eprintln!("second cold start: {:.1} s to the first batch", cold.as_secs_f64());
    seen.extend(rest);
    let mut keys: Vec<String> = seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == LINES, "{} distinct elements, not {LINES}", keys.len());
    assert_exactly_once(&seen, &keys, 1);

    // Completed: the workers go, whatever the idle time.
    wait_for(STEP, format!("{name} to report Completed"), async || {
        let p = c.pipeline(name).await?;
        ensure!(p.data.pointer("/status/phase") == Some(&json!("Completed")), "{}", summary(&p));
        Ok(())
    })
    .await?;
    wait_idle(&c, name, "the epoch is complete").await?;

    // The operator dies and comes back: it resumes from its journal, leads once the old Lease
    // expires, and still knows the pipeline completed, although its trainer never registers again.
    c.operator.kill()?;
    let metrics = c.operator.restart().await?;
    wait_http_ok(&metrics, "/readyz", STEP).await?;
    let until = std::time::Instant::now() + Duration::from_secs(20);
    // Bounded: 20 s of checks, one a second.
    while std::time::Instant::now() < until {
        let p = c.pipeline(name).await?;
        ensure!(
            p.data.pointer("/status/phase") == Some(&json!("Completed")),
            "after the operator's restart: {}",
            summary(&p)
        );
        let n = replicas(&c, name).await?;
        ensure!(n == 0, "after the operator's restart, spec.replicas is {n}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("still Completed with no worker 20 s after the operator's restart");
    Ok(())
}
