//! Security on the real control plane. Every scenario's operator runs with `--security`, so the
//! whole suite runs with TLS and authentication on; this one checks what that means: the CA and
//! master key in Secrets of the operator's namespace, each pipeline's worker Secret mounted by its
//! pods only, and its trainer Secret, with which a trainer consumes every element exactly once,
//! while a process without it (or holding another pipeline's) is refused.

use super::*;
use granary_e2e::{Consumer, assert_exactly_once, start_consumer_env};
use k8s_openapi::api::core::v1::Secret;

/// What a trainer pod would mount from a pipeline's trainer Secret: its files, and the
/// environment pointing the client at them.
pub struct TrainerCredentials {
    _dir: tempfile::TempDir,
    /// `GRANARY_TLS_CA` and `GRANARY_TOKEN_FILE`.
    pub env: Vec<(String, String)>,
}

impl TrainerCredentials {
    /// The environment as `start_consumer_env` takes it.
    pub fn vars(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }
}

/// The decoded keys of Secret `name`.
async fn secret_data(c: &Cluster, name: &str) -> Result<BTreeMap<String, String>> {
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), &c.ns);
    let secret = secrets.get(name).await.with_context(|| format!("reading Secret {name}"))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// Waits for pipeline `name`'s trainer Secret and writes its files as a mounted Secret would be.
pub async fn trainer_credentials(c: &Cluster, name: &str) -> Result<TrainerCredentials> {
    let secret = format!("{name}-granary-trainer");
    let data = wait_for(DEADLINE, format!("Secret {secret}"), async || secret_data(c, &secret).await).await?;
    let dir = tempfile::tempdir()?;
    let (ca, token) = (dir.path().join("ca.crt"), dir.path().join("token"));
    std::fs::write(&ca, data.get("ca.crt").context("the trainer Secret has no ca.crt")?)?;
    std::fs::write(&token, data.get("token").context("the trainer Secret has no token")?)?;
    let env = vec![
        ("GRANARY_TLS_CA".to_string(), ca.display().to_string()),
        ("GRANARY_TOKEN_FILE".to_string(), token.display().to_string()),
    ];
    Ok(TrainerCredentials { _dir: dir, env })
}

/// Runs a consumer of `pipeline` with `env` to its end (or `deadline`), off the async runtime.
async fn consume(
    c: &Cluster,
    pipeline: &str,
    env: Vec<(String, String)>,
    deadline: Duration,
) -> Result<(bool, Consumer)> {
    let (dispatcher, pipeline) = (c.dispatcher.clone(), pipeline.to_string());
    Ok(tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut consumer = start_consumer_env(&dispatcher, &pipeline, &["--rows"], &env);
        (consumer.finish(deadline), consumer)
    })
    .await?)
}

const LINES: usize = 120;
const CONSUME_DEADLINE: Duration = Duration::from_secs(120);

pub async fn secured(c: Cluster) -> Result<()> {
    // The deployment's CA and master key, made by the operator in its own namespace once it leads.
    let ca = wait_for(DEADLINE, "Secret granary-ca", async || secret_data(&c, "granary-ca").await).await?;
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        ensure!(ca.get(key).is_some_and(|v| v.contains("-----BEGIN")), "granary-ca has no PEM {key}");
    }
    ensure!(
        secret_data(&c, "granary-auth").await?.contains_key("master.key"),
        "granary-auth has no master.key"
    );

    let data = tempfile::tempdir()?;
    granary_e2e::write_numbers(data.path(), LINES, 4)?;
    let spec = || {
        json!({
            "source": {"url": format!("file://{}/", data.path().display()), "format": "jsonl"},
            "stages": [{"op": "test.sleep", "ms": 0}],
            "batch": {"size": 8},
            "scaling": {"policy": "fixed", "replicas": 1},
        })
    };
    let (name, other) = ("secured", "neighbour");
    c.create_pipeline(name, spec()).await?;
    c.create_pipeline(other, spec()).await?;
    let (deployment, _) = c.wait_workers(name).await?;

    // The worker Secret: mounted by the worker pods, which run granary worker with it.
    let worker = secret_data(&c, &format!("{name}-granary-worker")).await?;
    ensure!(
        ["ca.crt", "tls.crt", "tls.key", "token"].iter().all(|k| worker.contains_key(*k)),
        "the worker Secret holds {:?}",
        worker.keys().collect::<Vec<_>>()
    );
    let pod = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).context("no pod template")?;
    let mounted = pod.volumes.iter().flatten().any(|v| {
        v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(&format!("{name}-granary-worker"))
    });
    ensure!(mounted, "the worker pods do not mount the worker Secret");
    let args = pod.containers[0].args.clone().unwrap_or_default().join(" ");
    ensure!(args.contains("--tls-dir") && args.contains("--token-file"), "worker args: {args}");

    let Some(node) = c.ready_node().await? else {
        eprintln!("skipped consuming: the cluster has no Ready node, so no worker pod can run");
        return Ok(());
    };
    super::running::wait_workers_running(&c, name, 1).await?;
    eprintln!("node {node} runs the secured pipeline's worker");
    let pipeline = format!("{}/{name}", c.ns);

    // Without the Secret: refused. With the other pipeline's Secret: refused.
    let (finished, refused) = consume(&c, &pipeline, Vec::new(), CONSUME_DEADLINE).await?;
    ensure!(!finished && refused.seen.is_empty(), "a trainer without credentials consumed");
    let neighbour = trainer_credentials(&c, other).await?;
    let (finished, refused) = consume(&c, &pipeline, neighbour.env.clone(), CONSUME_DEADLINE).await?;
    ensure!(!finished && refused.seen.is_empty(), "another pipeline's trainer consumed this one");
    // The CA without a token: refused too.
    let ca_only = neighbour.env.iter().filter(|(k, _)| k == "GRANARY_TLS_CA").cloned().collect();
    let (finished, refused) = consume(&c, &pipeline, ca_only, CONSUME_DEADLINE).await?;
    ensure!(!finished && refused.seen.is_empty(), "a trainer with the CA but no token consumed");

    // With the trainer Secret: every element, exactly once.
    let credentials = trainer_credentials(&c, name).await?;
    let (finished, consumer) = consume(&c, &pipeline, credentials.env.clone(), CONSUME_DEADLINE).await?;
    ensure!(finished, "the trainer with the Secret did not finish ({} batches)", consumer.seen.len());
    let mut keys: Vec<String> = consumer.seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    ensure!(keys.len() == LINES, "{} elements delivered, not {LINES}", keys.len());
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == LINES, "{} distinct elements, not {LINES}", keys.len());
    assert_exactly_once(&consumer.seen, &keys, 1);
    eprintln!("the trainer holding the Secret received each of {LINES} elements exactly once");
    Ok(())
}
