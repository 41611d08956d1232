//! Reconciling one `InputPipeline`: validate the spec, apply the worker Deployment and Service,
//! register the pipeline with the dispatcher, size the pool (a fixed count, or an autoscaler),
//! publish decisions as Events and write status. Idempotent: a second reconcile of the same
//! generation changes nothing but status figures.

use crate::backoff;
use crate::config::{FINALIZER, MANAGER};
use crate::context::Context;
use crate::credentials::Credentials;
use crate::credentials::pipeline as credentials;
use crate::events::{Note, failure_note, new_cache_decision, new_scalings};
use crate::objects::{self, pipeline_key, workers_name};
use crate::pool::{self, KubernetesPool, Sizing};
use crate::status::{self, Observed, Registration};
use granary_crds::{InputPipeline, InputPipelineStatus};
use granary_dispatcher::autoscaler::SharedPool;
use granary_dispatcher::host::Autoscaling;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as Finalizing};
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A reconcile that failed; retried by [`error_policy`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("Kubernetes API: {}", pool::api_message(.0))]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    /// Scaling the worker Deployment failed.
    #[error(transparent)]
    Scale(#[from] granary_dispatcher::pool::PoolError),
    /// A pipeline's worker certificate could not be made.
    #[error("the workers' certificate: {0}")]
    Certificate(#[from] granary_security::authority::AuthorityError),
    /// The object has no namespace (the CRD is namespaced, so this is a broken object).
    #[error("InputPipeline `{0}` has no namespace")]
    NoNamespace(String),
}

/// How long to wait before listing an unreachable source again.
const SOURCE_RETRY: Duration = Duration::from_secs(30);

/// Reconciles `pipeline`: cleanup when it is being deleted, else apply.
pub async fn reconcile(pipeline: Arc<InputPipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = pipeline.namespace().ok_or_else(|| Error::NoNamespace(pipeline.name_any()))?;
    let api: Api<InputPipeline> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer::finalizer(&api, FINALIZER, pipeline, |event| async {
        match event {
            Finalizing::Apply(p) => {
                let outcome = apply(p.clone(), &ctx).await;
                match &outcome {
                    Ok(_) => tracked(&p, &ctx, |t| {
                        t.reconcile_failure = None;
                        t.failures = 0;
                    }),
                    Err(e) => report_failure(&p, &ctx, e).await,
                }
                outcome
            }
            Finalizing::Cleanup(p) => cleanup(p, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Says why a reconcile failed where the pipeline's owner looks: a Warning Event
/// `ReconcileFailed` (once per distinct failure) and `Ready=False` with the same reason and
/// message in status. Writing status may itself be forbidden; that is logged.
async fn report_failure(p: &InputPipeline, ctx: &Context, error: &Error) {
    let why = explain(error);
    let fresh = tracked(p, ctx, |t| {
        let fresh = t.reconcile_failure.as_deref() != Some(why.as_str());
        t.reconcile_failure = Some(why.clone());
        fresh
    });
    if fresh {
        ctx.notifier.publish(&p.object_ref(&()), Note::warning("ReconcileFailed", why.clone())).await;
    }
    let next = status::failed_reconcile(p.status.as_ref(), p.meta().generation, &why, now());
    if p.status.as_ref() == Some(&next) {
        return;
    }
    if let Err(e) = patch_status(p, ctx, &next).await {
        tracing::warn!(pipeline = %p.name_any(), "cannot report the failed reconcile in status: {e}");
    }
}

/// Runs `f` on what the operator tracks of `p`.
fn tracked<T>(p: &InputPipeline, ctx: &Context, f: impl FnOnce(&mut crate::context::Tracked) -> T) -> T {
    let key = pipeline_key(&p.namespace().unwrap_or_default(), &p.name_any());
    ctx.with(&key, &p.uid().unwrap_or_default(), f)
}

/// `error` in words, with the fix when the API refused for lack of permission.
pub fn explain(error: &Error) -> String {
    let text = error.to_string();
    let forbidden = match error {
        Error::Kube(kube::Error::Api(status)) => status.code == 403,
        // The pool's error carries the API's message only.
        Error::Scale(e) => e.to_string().contains("forbidden"),
        _ => false,
    };
    if forbidden {
        format!(
            "{text} (the operator's ServiceAccount lacks this permission: grant it as the Helm chart's \
             ClusterRole (or, watching listed namespaces, its Roles) does, see \
             charts/granary/templates/rbac.yaml)"
        )
    } else {
        text
    }
}

/// Requeues a failed reconcile after a pause that grows with the pipeline's consecutive
/// failures, with jitter ([`backoff::delay`]); a successful reconcile resets the count.
pub fn error_policy(pipeline: Arc<InputPipeline>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = tracked(&pipeline, &ctx, |t| {
        t.failures = t.failures.saturating_add(1);
        t.failures
    });
    let wait = backoff::delay(failures, backoff::unit_random());
    tracing::warn!(
        pipeline = %pipeline.name_any(),
        failures,
        retry_in = ?wait,
        "reconcile failed: {error}"
    );
    Action::requeue(wait)
}

/// The spec as `granary validate` reads it: every problem with its field path, or the manifest
/// the dispatcher registers. Relative `file:` URLs resolve from `/`.
pub fn manifest_of(p: &InputPipeline) -> Result<granary_crds::Manifest, String> {
    let name = p.name_any();
    objects::check_name(&name).map_err(|why| format!("metadata.name: {why}"))?;
    let document = serde_json::json!({
        "apiVersion": granary_crds::manifest::API_VERSION,
        "kind": granary_crds::manifest::KIND,
        "metadata": {"name": name, "namespace": p.namespace()},
        "spec": p.spec,
    });
    granary_crds::parse_manifest(&document.to_string(), std::path::Path::new("/"), &[])
        .map_err(|problems| problems.to_string().replace('\n', "; "))
}

async fn apply(p: Arc<InputPipeline>, ctx: &Context) -> Result<Action, Error> {
    let namespace = p.namespace().ok_or_else(|| Error::NoNamespace(p.name_any()))?;
    let name = p.name_any();
    let key = pipeline_key(&namespace, &name);
    let uid = p.uid().unwrap_or_default();
    let generation = p.meta().generation;
    let regarding = p.object_ref(&());
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);

    let manifest = match manifest_of(&p) {
        Ok(m) => m,
        Err(why) => {
            // Nothing is applied: an earlier generation's workers keep serving, untouched.
            let (fresh, serving) = ctx.with(&key, &uid, |t| {
                let fresh = t.problem.as_deref() != Some(why.as_str());
                t.problem = Some(why.clone());
                t.generation = generation;
                (fresh, t.ever_registered)
            });
            if fresh {
                ctx.notifier.publish(&regarding, Note::warning("InvalidSpec", why.clone())).await;
            }
            let (ready, desired) = if serving { counts(&deployments, &name).await } else { (0, 0) };
            let observed = Observed {
                generation,
                registration: Registration::Invalid(why),
                serving_earlier: serving,
                ready_workers: ready,
                desired_workers: desired,
                progress: Vec::new(),
                completed: false,
                throughput: None,
                trainer_wait_fraction: None,
                failure: None,
                skipped_elements: 0,
                scaling: None,
                cache: status::cache_status(ctx.dispatcher.cache_report(&key).as_ref()),
                endpoint: None,
                plan: None,
            };
            write_status(&p, ctx, &key, &uid, &observed).await?;
            return Ok(Action::await_change());
        }
    };

    let applied = apply_children(&p, ctx, &namespace).await?;

    // Register this generation (listing the source) once; retry while the source is unreachable.
    let registered = ctx.with(&key, &uid, |t| t.registered && t.generation == generation);
    let registration = if registered {
        Registration::Registered
    } else {
        match ctx.dispatcher.register(&key, &manifest).await {
            Ok(info) => {
                ctx.with(&key, &uid, |t| {
                    t.registered = true;
                    t.ever_registered = true;
                    t.generation = generation;
                    t.problem = None;
                });
                let text = format!(
                    "registered generation {} with the dispatcher as `{key}`: {} splits, {} elements",
                    generation.unwrap_or(0),
                    info.splits,
                    info.elements
                );
                ctx.notifier.publish(&regarding, Note::normal("Registered", text)).await;
                Registration::Registered
            }
            Err(e) => {
                let why = match &p.spec.source {
                    Some(source) => format!("spec.source.url: cannot list `{}`: {e}", source.url),
                    None => format!("spec.sources: cannot list the sources: {e}"),
                };
                let fresh = ctx.with(&key, &uid, |t| {
                    let fresh = t.problem.as_deref() != Some(why.as_str());
                    t.problem = Some(why.clone());
                    t.registered = false;
                    t.generation = generation;
                    fresh
                });
                if fresh {
                    ctx.notifier.publish(&regarding, Note::warning("SourceUnavailable", why.clone())).await;
                }
                Registration::SourceUnavailable(why)
            }
        }
    };

    let desired = size(&p, ctx, &key, &uid, &deployments, &applied).await?;
    let ready = applied.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0).max(0) as u32;

    // Decisions since the last reconcile become Events.
    let scaling = ctx.autoscalers.scaling(&key).map(|s| s.report());
    let cache = ctx.dispatcher.cache_report(&key);
    let (scalings, cache_note, (completion, failure_fresh)) = ctx.with(&key, &uid, |t| {
        let scalings = match &scaling {
            Some(report) => {
                let (notes, seen) = new_scalings(report, t.scalings_published);
                t.scalings_published = seen;
                notes
            }
            None => Vec::new(),
        };
        let cache_note = new_cache_decision(cache.as_ref(), t.cache_published.as_deref()).map(|(note, k)| {
            t.cache_published = Some(k);
            note
        });
        (scalings, cache_note, (!t.completion_published, !t.failure_published))
    });
    for note in scalings.into_iter().chain(cache_note) {
        ctx.notifier.publish(&regarding, note).await;
    }

    let registered = registration == Registration::Registered;
    let progress = if registered { ctx.dispatcher.progress(&key) } else { Vec::new() };
    let (throughput, wait) = status::rates(&ctx.dispatcher.snapshot(&key), p.spec.batch.size);
    let observed = Observed {
        generation,
        registration,
        serving_earlier: false,
        ready_workers: ready,
        desired_workers: desired,
        progress,
        completed: registered && ctx.dispatcher.completed(&key),
        throughput,
        trainer_wait_fraction: wait,
        failure: if registered { ctx.dispatcher.failure(&key) } else { None },
        skipped_elements: if registered { ctx.dispatcher.skipped(&key) } else { 0 },
        scaling,
        cache: status::cache_status(cache.as_ref()),
        endpoint: Some(granary_crds::Endpoint {
            dispatcher: ctx.config.workers.dispatcher.clone(),
            pipeline: key.clone(),
        }),
        plan: status::plan_status(&p.spec),
    };
    let written = write_status(&p, ctx, &key, &uid, &observed).await?;
    if completion && written.phase == Some(granary_crds::PipelinePhase::Completed) {
        ctx.with(&key, &uid, |t| t.completion_published = true);
        ctx.notifier.publish(&regarding, Note::normal("Completed", "every job delivered every epoch")).await;
    }
    if let Some(why) = observed.failure.as_deref().filter(|_| failure_fresh) {
        ctx.with(&key, &uid, |t| t.failure_published = true);
        ctx.notifier.publish(&regarding, failure_note(why)).await;
    }
    Ok(match observed.registration {
        Registration::SourceUnavailable(_) => Action::requeue(SOURCE_RETRY),
        _ => Action::requeue(ctx.config.status_period),
    })
}

/// Applies the worker Deployment and Service (server-side apply, forced: the operator owns
/// these fields), and with security on the pipeline's Secrets first, and returns the Deployment
/// as the server holds it.
async fn apply_children(p: &InputPipeline, ctx: &Context, namespace: &str) -> Result<Deployment, Error> {
    let params = PatchParams::apply(MANAGER).force();
    let name = workers_name(&p.name_any());
    let revision = match &ctx.credentials {
        Some(shared) => Some(apply_secrets(p, ctx, &shared.get(), namespace).await?),
        None => None,
    };
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    services.patch(&name, &params, &Patch::Apply(&objects::service(p))).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let mut deployment = objects::deployment(p, &ctx.config.workers, &ctx.python_image);
    if let Some(revision) = revision {
        credentials::mount(&mut deployment, &p.name_any(), &revision);
    }
    Ok(deployments.patch(&name, &params, &Patch::Apply(&deployment)).await?)
}

/// Writes the pipeline's worker and trainer Secrets where they are missing or no longer
/// current, and returns the worker Secret's revision.
async fn apply_secrets(
    p: &InputPipeline,
    ctx: &Context,
    credentials: &Credentials,
    namespace: &str,
) -> Result<String, Error> {
    let params = PatchParams::apply(MANAGER).force();
    let key = pipeline_key(namespace, &p.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let worker_name = credentials::worker_secret_name(&p.name_any());
    let worker = match secrets.get_opt(&worker_name).await? {
        Some(found) if credentials::worker_current(&found, credentials, &key, crate::credentials::now()) => {
            found
        }
        _ => {
            let fresh = credentials::worker_secret(p, credentials, &key)?;
            secrets.patch(&worker_name, &params, &Patch::Apply(&fresh)).await?
        }
    };
    let trainer_name = credentials::trainer_secret_name(&p.name_any());
    let trainer_current = secrets
        .get_opt(&trainer_name)
        .await?
        .is_some_and(|found| credentials::trainer_current(&found, credentials, &key));
    if !trainer_current {
        let fresh = credentials::trainer_secret(p, credentials, &key);
        secrets.patch(&trainer_name, &params, &Patch::Apply(&fresh)).await?;
        let text = format!("trainers of `{key}` read its token and CA from Secret `{trainer_name}`");
        ctx.notifier.publish(&p.object_ref(&()), Note::normal("Credentials", text)).await;
    }
    Ok(credentials::revision(&worker))
}

/// Ready and desired workers of a pipeline's Deployment, `(0, 0)` when it cannot be read.
async fn counts(deployments: &Api<Deployment>, name: &str) -> (u32, u32) {
    match deployments.get_opt(&workers_name(name)).await {
        Ok(Some(d)) => {
            let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
            let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            (ready.max(0) as u32, desired.max(0) as u32)
        }
        _ => (0, 0),
    }
}

/// Applies the sizing of the spec: the fixed count through the scale subresource, or an
/// autoscaler (restarted when its bounds change). Returns the desired count.
async fn size(
    p: &InputPipeline,
    ctx: &Context,
    key: &str,
    uid: &str,
    deployments: &Api<Deployment>,
    applied: &Deployment,
) -> Result<u32, Error> {
    let wanted = pool::sizing(&p.spec);
    let current = applied.spec.as_ref().and_then(|s| s.replicas).map(|n| n.max(0) as u32);
    let same = ctx.with(key, uid, |t| t.sizing.as_ref() == Some(&wanted))
        && (matches!(wanted, Sizing::Fixed(_)) || ctx.autoscalers.is_running(key));
    let name = workers_name(&p.name_any());
    let kubernetes = KubernetesPool::new(deployments.clone(), &name);
    match &wanted {
        Sizing::Fixed(n) => {
            if current != Some(*n) {
                kubernetes.set(*n).await?;
                let text = format!(
                    "scaled from {} to {n} workers: spec.scaling.replicas is {n} (policy fixed)",
                    current.unwrap_or(0)
                );
                ctx.notifier.publish(&p.object_ref(&()), Note::normal("Scaled", text)).await;
            }
            ctx.autoscalers.fixed(key, *n);
            ctx.with(key, uid, |t| t.sizing = Some(wanted.clone()));
            Ok(*n)
        }
        Sizing::Auto(bounds) => {
            if same {
                let desired = ctx.autoscalers.scaling(key).map(|s| s.report().desired);
                return Ok(desired.unwrap_or_else(|| current.unwrap_or(0)));
            }
            let initial = pool::initial(&wanted, current);
            if current != Some(initial) {
                kubernetes.set(initial).await?;
                let text = format!(
                    "scaled from {} to {initial} workers: autoscaling within {}..{} (spec.scaling)",
                    current.unwrap_or(0),
                    bounds.lower(),
                    bounds.max_workers
                );
                ctx.notifier.publish(&p.object_ref(&()), Note::normal("Scaled", text)).await;
            }
            let period = ctx.config.policy_period;
            let pool: SharedPool = Arc::new(tokio::sync::Mutex::new(kubernetes));
            // The first evaluation waits a period: the workers just started, nothing is measured.
            let autoscaling =
                Autoscaling { pool, bounds: bounds.clone(), period, initial, first_after: period };
            ctx.autoscalers.start(key, autoscaling);
            ctx.with(key, uid, |t| t.sizing = Some(wanted.clone()));
            Ok(initial)
        }
    }
}

/// Writes status when it changed in substance, or when only figures changed and the last
/// write is a status period old (so the operator's own writes do not trigger a write loop).
async fn write_status(
    p: &InputPipeline,
    ctx: &Context,
    key: &str,
    uid: &str,
    observed: &Observed,
) -> Result<InputPipelineStatus, Error> {
    let next = status::status(p.status.as_ref(), observed, now());
    let substance_changed = p.status.as_ref().map(substance) != Some(substance(&next));
    let stale =
        ctx.with(key, uid, |t| t.status_written.is_none_or(|at| at.elapsed() >= ctx.config.status_period));
    if substance_changed || (stale && p.status.as_ref() != Some(&next)) {
        patch_status(p, ctx, &next).await?;
        ctx.with(key, uid, |t| t.status_written = Some(Instant::now()));
    }
    Ok(next)
}

/// Now, to the second, as status timestamps are written (RFC 3339).
fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap_or_default()
}

/// Merge-patches `p`'s status from what it holds to `next`.
async fn patch_status(p: &InputPipeline, ctx: &Context, next: &InputPipelineStatus) -> kube::Result<()> {
    let api: Api<InputPipeline> = Api::namespaced(ctx.client.clone(), &p.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "status": status_patch(p.status.as_ref(), next) });
    api.patch_status(&p.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

/// A merge patch from `previous` to `next`: `next`, plus `null` for each field `next` no longer
/// has (a merge patch keeps what it does not mention).
fn status_patch(previous: Option<&InputPipelineStatus>, next: &InputPipelineStatus) -> serde_json::Value {
    let mut patch = serde_json::to_value(next).unwrap_or_default();
    if let (Some(fields), Ok(serde_json::Value::Object(before))) =
        (patch.as_object_mut(), serde_json::to_value(previous))
    {
        for key in before.keys() {
            fields.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    patch
}

/// The parts of a status whose change is worth a write right away: all but the figures.
fn substance(s: &InputPipelineStatus) -> InputPipelineStatus {
    let mut s = s.clone();
    s.throughput = None;
    s.trainer_wait_fraction = None;
    if let Some(c) = &mut s.cache {
        c.bytes_read = 0;
        c.bytes_written = 0;
    }
    s
}

/// A deleted pipeline: stop its autoscaler, drop it from the dispatcher, and remove the cache
/// entries it created that no other pipeline uses (unless `spec.cache.onDelete: keep`). Its
/// Deployment and Service go with it (owner references). A store that cannot be cleaned is
/// reported in a Warning Event and does not hold the deletion up.
async fn cleanup(p: Arc<InputPipeline>, ctx: &Context) -> Result<Action, Error> {
    let namespace = p.namespace().ok_or_else(|| Error::NoNamespace(p.name_any()))?;
    let key = pipeline_key(&namespace, &p.name_any());
    ctx.forget(&key);
    ctx.dispatcher.unregister(&key).await;
    let text = format!(
        "stopped autoscaling and removed `{key}` from the dispatcher; workers go with the Deployment"
    );
    ctx.notifier.publish(&p.object_ref(&()), Note::normal("Cleanup", text)).await;
    if let Some(store) = p.spec.cache.as_ref().and_then(|c| c.store_to_clean()) {
        let note = match ctx.dispatcher.remove_cache_entries(&key, store).await {
            Ok(done) => Note::normal("CacheRemoved", cache_cleanup_text(store, &done)),
            Err(e) => Note::warning(
                "CacheCleanupFailed",
                format!(
                    "cannot remove the cache entries `{key}` created in {store}: {e}; they stay until evicted"
                ),
            ),
        };
        ctx.notifier.publish(&p.object_ref(&()), note).await;
    }
    Ok(Action::await_change())
}

fn cache_cleanup_text(store: &str, done: &granary_dispatcher::cache_cleanup::CleanedUp) -> String {
    let mut text = format!(
        "removed {} cache entries ({} objects, {} bytes) from {store}",
        done.removed.len(),
        done.objects,
        done.bytes
    );
    if !done.kept.is_empty() {
        text.push_str(&format!("; kept {} that other pipelines use", done.kept.len()));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_patch_clears_the_fields_that_went_away() {
        let before = InputPipelineStatus { throughput: Some(10.0), epoch: Some(2), ..Default::default() };
        let next = InputPipelineStatus { epoch: Some(3), ..Default::default() };
        let patch = status_patch(Some(&before), &next);
        assert_eq!(patch, serde_json::json!({"throughput": null, "epoch": 3}));
        assert_eq!(status_patch(None, &next), serde_json::json!({"epoch": 3}));
    }
}
