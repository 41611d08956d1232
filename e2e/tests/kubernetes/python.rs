//! A `python.map` stage whose code ships in a ConfigMap (`spec.python.configMap`): the operator
//! renders the worker pod with the ConfigMap mounted at /etc/granary/python, `PYTHONPATH` naming
//! it and the Python-capable image; the node agent writes the ConfigMap's files out and runs the
//! worker with the machine's Python (`GRANARY_PYTHON` of the agent); a trainer receives every
//! element once, as the function returned it.

use super::*;
use granary_e2e::{assert_exactly_once, start_consumer_env};
use k8s_openapi::api::core::v1::ConfigMap;
use sha2::Digest;

/// The module in the ConfigMap: `mark` makes every `x` `x * factor + 1`, which only running it
/// explains.
const MODULE: &str = r#""""The python.map stage of the Kubernetes e2e suite, shipped in a ConfigMap."""


def mark(element, factor):
    out = dict(element)
    out["x"] = element["x"] * factor + 1
    return out
"#;
const CONFIG_MAP: &str = "marker-code";
const FACTOR: i64 = 3;
const LINES: usize = 64;
const FILES: usize = 4;
const BATCH: u32 = 8;
/// Where the operator mounts the ConfigMap (granary_operator::python::PYTHON_MOUNT).
const MOUNT: &str = "/etc/granary/python";
/// How long the trainer gets for the epoch (the worker starts Python runners first).
const EPOCH_DEADLINE: Duration = Duration::from_secs(180);

/// The digest `granary-e2e-consume --rows` prints for a row whose only tensor is the int64 `x`.
fn row_digest(x: i64) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(b"x");
    hash.update(x.to_le_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The `x` of the element with key `part-NNN.jsonl:LINE` (granary_e2e::write_numbers).
fn x_of(key: &str) -> Result<i64> {
    let parse = || -> Option<i64> {
        let (file, line) = key.strip_prefix("part-")?.split_once(".jsonl:")?;
        let (file, line): (i64, i64) = (file.parse().ok()?, line.parse().ok()?);
        Some(file * (LINES / FILES) as i64 + line - 1)
    };
    parse().with_context(|| format!("key {key:?} is not part-NNN.jsonl:LINE"))
}

/// The image the operator gives a pipeline with `python.map` stages and no `spec.workers.image`:
/// `GRANARY_WORKER_PYTHON_IMAGE` of the operator (this process's, which it inherits), else the
/// `-python` variant of the default worker image; `None` when another worker image is in use.
fn expected_python_image() -> Option<String> {
    if let Some(image) = env_nonempty("GRANARY_WORKER_PYTHON_IMAGE") {
        return Some(image);
    }
    match env_nonempty("GRANARY_E2E_IMAGE") {
        None => Some("ghcr.io/granary-dev/granary-python:0.1.0".to_string()),
        Some(_) => None,
    }
}

/// Checks the pod template of `name`'s Deployment: the ConfigMap volume, its read-only mount,
/// `PYTHONPATH` and the Python-capable image, as the API server stored them.
async fn check_python_pod(c: &Cluster, name: &str) -> Result<()> {
    let d = c.deployments().get(&workers(name)).await?;
    let pod = d.spec.and_then(|s| s.template.spec).context("the Deployment has no pod template")?;
    let volume =
        pod.volumes.iter().flatten().find(|v| v.config_map.as_ref().is_some_and(|m| m.name == CONFIG_MAP));
    let volume = volume.with_context(|| format!("no configMap volume of {CONFIG_MAP}: {:?}", pod.volumes))?;
    let container = pod.containers.iter().find(|c| c.name == "worker").context("no worker container")?;
    let mount = container.volume_mounts.iter().flatten().find(|m| m.name == volume.name);
    let mount = mount
        .with_context(|| format!("volume {} is not mounted: {:?}", volume.name, container.volume_mounts))?;
    ensure!(mount.mount_path == MOUNT && mount.read_only == Some(true), "the mount is {mount:?}");
    let python_path = container.env.iter().flatten().find(|e| e.name == "PYTHONPATH");
    ensure!(python_path.and_then(|e| e.value.as_deref()) == Some(MOUNT), "PYTHONPATH is {python_path:?}");
    let image = container.image.clone().unwrap_or_default();
    match expected_python_image() {
        Some(expected) => ensure!(image == expected, "the worker image is {image}, not {expected}"),
        None => ensure!(image.contains("-python"), "the worker image {image} is not a -python variant"),
    }
    Ok(())
}

pub async fn config_map_stage(c: Cluster) -> Result<()> {
    let Some(node) = c.ready_node().await? else {
        eprintln!("skipped the Python stage: the cluster has no Ready node, so no worker pod can run");
        return Ok(());
    };
    let data = tempfile::tempdir()?;
    granary_e2e::write_numbers(data.path(), LINES, FILES)?;
    let maps: Api<ConfigMap> = Api::namespaced(c.client.clone(), &c.ns);
    let map = ConfigMap {
        metadata: ObjectMeta { name: Some(CONFIG_MAP.into()), ..ObjectMeta::default() },
        data: Some(BTreeMap::from([("marker.py".to_string(), MODULE.to_string())])),
        ..ConfigMap::default()
    };
    maps.create(&PostParams::default(), &map).await.context("creating the ConfigMap")?;

    let name = "python";
    let spec = json!({
        "source": {"url": format!("file://{}/", data.path().display()), "format": "jsonl"},
        "stages": [{"op": "python.map", "function": "marker:mark", "args": {"factor": FACTOR}}],
        "batch": {"size": BATCH},
        "scaling": {"policy": "fixed", "replicas": 1},
        "python": {"configMap": CONFIG_MAP},
    });
    c.create_pipeline(name, spec).await?;
    c.wait_workers(name).await?;
    check_python_pod(&c, name).await?;
    let pids = super::running::wait_workers_running(&c, name, 1).await?;
    eprintln!("node {node} runs worker process {pids:?} with {CONFIG_MAP} mounted at {MOUNT}");

    let dispatcher = c.dispatcher.clone();
    let pipeline = format!("{}/{name}", c.ns);
    let credentials = super::secured::trainer_credentials(&c, name).await?;
    let (finished, consumer) = tokio::task::spawn_blocking(move || {
        let env = credentials.vars();
        let mut consumer = start_consumer_env(&dispatcher, &pipeline, &["--rows"], &env);
        (consumer.finish(EPOCH_DEADLINE), consumer)
    })
    .await?;
    if !finished {
        let p = c.pipeline(name).await?;
        bail!(
            "the trainer did not finish the epoch within {EPOCH_DEADLINE:?} ({} batches); is there a Python \
             with NumPy in the node agent's GRANARY_PYTHON? {}",
            consumer.seen.len(),
            summary(&p)
        );
    }
    let mut keys: Vec<String> = consumer.seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == LINES, "{} distinct elements, not {LINES}", keys.len());
    assert_exactly_once(&consumer.seen, &keys, 1);

    // Every row is the function's output, x * factor + 1, and never the source's x.
    let mut wrong = Vec::new();
    for seen in &consumer.seen {
        ensure!(seen.rows.len() == seen.keys.len(), "a batch without a digest per row: {seen:?}");
        for (key, row) in seen.keys.iter().zip(&seen.rows) {
            let x = x_of(key)?;
            if *row != row_digest(x * FACTOR + 1) {
                let unchanged = *row == row_digest(x);
                wrong.push(format!("{key} (x = {x}{})", if unchanged { ", unchanged" } else { "" }));
            }
        }
    }
    ensure!(wrong.is_empty(), "{} rows are not mark(x) = x * {FACTOR} + 1: {wrong:?}", wrong.len());
    eprintln!("the trainer received all {LINES} elements once, each as the ConfigMap's function returned it");

    wait_for(DEADLINE, format!("InputPipeline {name} to report Completed"), async || {
        let p = c.pipeline(name).await?;
        let phase = p.data.pointer("/status/phase").and_then(Value::as_str);
        ensure!(phase == Some("Completed"), "{}", summary(&p));
        Ok(())
    })
    .await
}

#[test]
fn digests_and_keys_follow_the_consumer_and_the_data() {
    // What granary-e2e-consume prints for x = 0 and 1 (int64, little-endian, after the name).
    assert!(row_digest(0).starts_with("35493724"));
    assert!(row_digest(1).starts_with("e4becdf7"));
    assert_eq!(x_of("part-000.jsonl:1").unwrap(), 0);
    assert_eq!(x_of("part-003.jsonl:16").unwrap(), 63);
    assert!(x_of("other:1").is_err());
}

/// Every document of `examples/python-stage/*.yaml` (the ConfigMap and both pipelines), created
/// as it is in the test's namespace with a server-side dry run: the API server admits each.
pub async fn python_stage_examples_are_admitted(c: &Cluster) -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python-stage");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let mut admitted = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for document in serde_norway::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(document)
                .with_context(|| format!("parsing {}", file.display()))?;
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let resource = match kind.as_str() {
                "ConfigMap" => ApiResource::erase::<ConfigMap>(&()),
                "InputPipeline" => ApiResource::erase::<InputPipeline>(&()),
                _ => bail!("{}: unexpected kind {kind:?}", file.display()),
            };
            let mut object: DynamicObject = serde_json::from_value(object)?;
            object.metadata.namespace = Some(c.ns.clone());
            let name = object.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), &c.ns, &resource);
            api.create(&dry_run, &object)
                .await
                .with_context(|| format!("{kind} {name} of {} (server-side dry run)", file.display()))?;
            admitted.push(format!("{kind} {name}"));
        }
    }
    ensure!(admitted.len() == 3, "expected a ConfigMap and two InputPipelines, admitted {admitted:?}");
    eprintln!("examples/python-stage admitted: {admitted:?}");
    Ok(())
}
