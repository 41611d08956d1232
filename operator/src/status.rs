//! A pipeline's status as a pure function of what was observed: the spec's problems, whether
//! the dispatcher could register it, the worker Deployment's counts, the dispatcher's progress
//! and metrics, the autoscaler's latest reason and the autocacher's decision.

use granary_crds::{CacheStatus, Endpoint, InputPipelineStatus, PipelinePhase, SourceCacheEntry};
use granary_dispatcher::autoscaler::ScalingReport;
use granary_dispatcher::{CacheReport, JobProgress, MetricsSnapshot};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// What the dispatcher knows of a pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Registration {
    /// Registered; serving this spec.
    Registered,
    /// Listing the source failed: the reason, naming `spec.source.url`.
    SourceUnavailable(String),
    /// The spec is invalid: each problem as `field: message`.
    Invalid(String),
}

/// Everything a status is computed from.
#[derive(Clone, Debug)]
pub struct Observed {
    /// `metadata.generation` of the pipeline.
    pub generation: Option<i64>,
    /// The dispatcher's view.
    pub registration: Registration,
    /// Whether an earlier generation's workers still serve (an invalid update keeps them).
    pub serving_earlier: bool,
    /// Ready worker pods.
    pub ready_workers: u32,
    /// The target count.
    pub desired_workers: u32,
    /// Jobs of the pipeline and how far they are.
    pub progress: Vec<JobProgress>,
    /// Whether every job delivered every epoch (the dispatcher's word, which outlives the jobs'
    /// collection).
    pub completed: bool,
    /// Elements per second delivered, all consumers together.
    pub throughput: Option<f64>,
    /// Share of trainer time spent waiting.
    pub trainer_wait_fraction: Option<f64>,
    /// Why the pipeline stopped (the source changed under a running plan, a split failed on
    /// every attempt, more elements were skipped than `spec.errors.maxSkipped`).
    pub failure: Option<String>,
    /// Elements skipped under `spec.errors.policy: skip`.
    pub skipped_elements: u64,
    /// The autoscaler's report; `None` for a fixed count.
    pub scaling: Option<ScalingReport>,
    /// The cache's state.
    pub cache: CacheStatus,
    /// Where trainers connect, once the dispatcher serves the pipeline.
    pub endpoint: Option<Endpoint>,
    /// The plan the workers run, when the optimizer rewrote the stages.
    pub plan: Option<granary_crds::PlanStatus>,
}

/// Throughput and trainer wait fraction from the consumers' latest reports.
pub fn rates(snapshot: &MetricsSnapshot, batch_size: u32) -> (Option<f64>, Option<f64>) {
    if snapshot.consumers.is_empty() {
        return (None, None);
    }
    let throughput: f64 =
        snapshot.consumers.iter().map(|(_, _, m)| m.batches_per_second * f64::from(batch_size)).sum();
    let fractions: Vec<f64> = snapshot
        .consumers
        .iter()
        .filter(|(_, _, m)| m.step_seconds + m.wait_seconds > 0.0)
        .map(|(_, _, m)| m.wait_seconds / (m.step_seconds + m.wait_seconds))
        .collect();
    let wait = (!fractions.is_empty()).then(|| fractions.iter().sum::<f64>() / fractions.len() as f64);
    (Some(round(throughput, 1)), wait.map(|w| round(w, 3)))
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// The cache as status shows it, from the dispatcher's report (`None`: not registered).
pub fn cache_status(report: Option<&CacheReport>) -> CacheStatus {
    let Some(report) = report else { return CacheStatus { state: "off".into(), ..Default::default() } };
    let bytes_read = report.epochs.iter().map(|e| e.bytes_read).sum();
    let bytes_written = report.epochs.iter().map(|e| e.bytes_written).sum();
    let state = report.state();
    CacheStatus {
        state: state.into(),
        stage: report.stage.clone(),
        entry: report.fingerprint.clone(),
        sources: report
            .sources
            .iter()
            .map(|s| SourceCacheEntry { name: s.name.clone(), entry: s.fingerprint.clone() })
            .collect(),
        bytes_read,
        bytes_written,
        reason: report.decision.as_ref().map(|d| d.reason.clone()),
        last_check: report.last_check.clone(),
        redecisions: report.redecisions,
    }
}

/// A condition as `metav1.Condition`; [`stamp`] sets its generation and transition time.
fn condition(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// The plan of `spec` for the status: `None` when the stages run as written. Every worker derives
/// the same plan from the same spec.
pub fn plan_status(spec: &granary_crds::InputPipelineSpec) -> Option<granary_crds::PlanStatus> {
    granary_optimizer::optimize(spec).in_effect(spec)
}

/// The status for `observed`. Conditions keep their `lastTransitionTime` from `previous` while
/// their status holds; a changed one gets `now`.
pub fn status(
    previous: Option<&InputPipelineStatus>,
    observed: &Observed,
    now: Timestamp,
) -> InputPipelineStatus {
    let o = observed;
    let completed = o.completed;
    let workers = format!("{}/{}", o.ready_workers, o.desired_workers);
    let (phase, ready, degraded) = match &o.registration {
        Registration::Invalid(why) => {
            let ready = condition("Ready", false, "InvalidSpec", why.clone());
            if o.serving_earlier {
                let degraded = condition(
                    "Degraded",
                    true,
                    "InvalidSpec",
                    format!("the previous spec keeps serving until this one is fixed: {why}"),
                );
                (PipelinePhase::Degraded, ready, degraded)
            } else {
                (
                    PipelinePhase::Failed,
                    ready,
                    condition("Degraded", false, "InvalidSpec", "nothing runs yet"),
                )
            }
        }
        Registration::SourceUnavailable(why) => (
            PipelinePhase::Pending,
            condition("Ready", false, "SourceUnavailable", why.clone()),
            condition("Degraded", false, "SourceUnavailable", "retrying the listing"),
        ),
        Registration::Registered => {
            if let Some(why) = &o.failure {
                (
                    PipelinePhase::Failed,
                    condition("Ready", false, "PipelineFailed", why.clone()),
                    condition("Degraded", true, "PipelineFailed", why.clone()),
                )
            } else if completed {
                (
                    PipelinePhase::Completed,
                    condition("Ready", true, "Completed", "every job delivered every epoch"),
                    condition("Degraded", false, "AsExpected", "completed"),
                )
            } else if o.ready_workers == 0 && o.desired_workers == 0 && o.scaling.is_some() {
                let why = o.scaling.as_ref().map(|s| s.last_reason.clone()).unwrap_or_default();
                (
                    PipelinePhase::Running,
                    condition(
                        "Ready",
                        true,
                        "ScaledToZero",
                        format!(
                            "0 workers while no trainer is attached ({why}); a trainer connecting starts them"
                        ),
                    ),
                    condition("Degraded", false, "AsExpected", "idle"),
                )
            } else if o.ready_workers == 0 {
                let was_running = previous
                    .and_then(|p| p.phase)
                    .is_some_and(|p| matches!(p, PipelinePhase::Running | PipelinePhase::Degraded));
                let message = format!("{workers} workers ready; waiting for a worker pod to become ready");
                if was_running {
                    (
                        PipelinePhase::Degraded,
                        condition("Ready", false, "NoReadyWorkers", message.clone()),
                        condition("Degraded", true, "NoReadyWorkers", message),
                    )
                } else {
                    (
                        PipelinePhase::Pending,
                        condition("Ready", false, "WorkersStarting", message),
                        condition("Degraded", false, "AsExpected", "starting"),
                    )
                }
            } else {
                (
                    PipelinePhase::Running,
                    condition("Ready", true, "Serving", format!("{workers} workers ready")),
                    condition("Degraded", false, "AsExpected", "serving"),
                )
            }
        }
    };
    let scaling = {
        let reason = o.scaling.as_ref().map(|s| s.last_reason.clone()).filter(|r| !r.is_empty());
        let why = reason.unwrap_or_else(|| match &o.scaling {
            Some(_) => "the autoscaler has not evaluated yet".into(),
            None => format!("policy fixed: {} workers", o.desired_workers),
        });
        if o.ready_workers < o.desired_workers {
            condition("Scaling", true, "ScalingUp", format!("{workers} workers ready; {why}"))
        } else if o.ready_workers > o.desired_workers {
            condition("Scaling", true, "ScalingDown", format!("{workers} workers ready; {why}"))
        } else {
            condition("Scaling", false, "AtTarget", why)
        }
    };
    let caching = {
        let c = &o.cache;
        let why = c.reason.clone().unwrap_or_default();
        match c.state.as_str() {
            "writing" => {
                condition("Caching", true, "Writing", format!("writing the output of `{}`: {why}", stage(c)))
            }
            "reading" => {
                condition("Caching", true, "Reading", format!("reading the output of `{}`: {why}", stage(c)))
            }
            "compute" => condition("Caching", false, "Compute", why),
            "profiling" => {
                condition("Caching", false, "Profiling", "measuring each cut and the store before deciding")
            }
            _ => condition("Caching", false, "Off", "spec.cache is absent or `policy: never`"),
        }
    };
    let mut conditions = vec![ready, scaling, caching, degraded];
    stamp(&mut conditions, previous, o.generation, now);
    let registered = o.registration == Registration::Registered;
    InputPipelineStatus {
        phase: Some(phase),
        workers: Some(workers),
        ready_workers: Some(o.ready_workers),
        desired_workers: Some(o.desired_workers),
        throughput: if registered { o.throughput } else { None },
        trainer_wait_fraction: if registered { o.trainer_wait_fraction } else { None },
        cache: Some(o.cache.clone()),
        epoch: if registered { o.progress.iter().map(|j| j.epoch).min() } else { None },
        skipped_elements: (registered && o.skipped_elements > 0).then_some(o.skipped_elements),
        observed_generation: o.generation,
        endpoint: if registered { o.endpoint.clone() } else { None },
        plan: o.plan.clone(),
        conditions,
    }
}

/// Gives each condition the generation it describes, and its `lastTransitionTime`: the previous
/// one while its status holds, else `now`.
fn stamp(
    conditions: &mut [Condition],
    previous: Option<&InputPipelineStatus>,
    generation: Option<i64>,
    now: Timestamp,
) {
    for c in conditions {
        let before = previous.and_then(|p| p.conditions.iter().find(|b| b.type_ == c.type_));
        c.observed_generation = generation;
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => Time(now),
        };
    }
}

/// The status after a reconcile of `generation` failed for `why` (an API call the operator could
/// not make, e.g. one its RBAC forbids): `Ready=False` and `Degraded=True` with reason
/// `ReconcileFailed` and `why` as their message, phase `Degraded`; figures and the other
/// conditions stay as they were.
pub fn failed_reconcile(
    previous: Option<&InputPipelineStatus>,
    generation: Option<i64>,
    why: &str,
    now: Timestamp,
) -> InputPipelineStatus {
    let mut next = previous.cloned().unwrap_or_default();
    let mut failed = vec![
        condition("Ready", false, "ReconcileFailed", why),
        condition("Degraded", true, "ReconcileFailed", why),
    ];
    stamp(&mut failed, previous, generation, now);
    for c in failed {
        match next.conditions.iter_mut().find(|b| b.type_ == c.type_) {
            Some(slot) => *slot = c,
            None => next.conditions.push(c),
        }
    }
    next.phase = Some(PipelinePhase::Degraded);
    next.observed_generation = generation;
    next
}

fn stage(c: &CacheStatus) -> &str {
    c.stage.as_deref().unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_dispatcher::Mode;

    /// A time `n` seconds after the epoch.
    fn t(n: i64) -> Timestamp {
        Timestamp::from_second(n).unwrap()
    }

    fn at(n: i64) -> Time {
        Time(t(n))
    }

    fn observed(registration: Registration, ready: u32, desired: u32) -> Observed {
        Observed {
            generation: Some(3),
            registration,
            serving_earlier: false,
            ready_workers: ready,
            desired_workers: desired,
            progress: Vec::new(),
            completed: false,
            throughput: Some(1200.0),
            trainer_wait_fraction: Some(0.25),
            failure: None,
            skipped_elements: 0,
            scaling: None,
            cache: CacheStatus { state: "off".into(), ..Default::default() },
            endpoint: Some(Endpoint {
                dispatcher: "granary-dispatcher.granary.svc:7070".into(),
                pipeline: "ns/p".into(),
            }),
            plan: None,
        }
    }

    fn job(epoch: u32, declared: u32, finished: u32) -> JobProgress {
        JobProgress {
            normalize_on_worker: false,
            image_share: 0.0,
            job: "j".into(),
            consumers: declared,
            declared,
            finished,
            epoch,
            mode: Mode::Distributed,
            batches_per_epoch: 10,
        }
    }

    fn cond<'a>(s: &'a InputPipelineStatus, kind: &str) -> (&'a str, &'a str, &'a str) {
        let c = s.conditions.iter().find(|c| c.type_ == kind).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn phase_and_ready_follow_the_table() {
        use PipelinePhase::*;
        let running = Observed { progress: vec![job(1, 1, 0)], ..observed(Registration::Registered, 2, 2) };
        let done = Observed {
            progress: vec![job(2, 2, 2)],
            completed: true,
            ..observed(Registration::Registered, 2, 2)
        };
        let failed = Observed { failure: Some("the source changed".into()), ..running.clone() };
        let invalid_update = Observed {
            serving_earlier: true,
            ..observed(Registration::Invalid("spec.cache.at: no stage `x`".into()), 2, 2)
        };
        let table: Vec<(&str, Observed, PipelinePhase, &str, &str)> = vec![
            (
                "invalid",
                observed(Registration::Invalid("spec.batch.size: must be >= 1".into()), 0, 0),
                Failed,
                "False",
                "InvalidSpec",
            ),
            ("invalid update", invalid_update, Degraded, "False", "InvalidSpec"),
            (
                "no source",
                observed(Registration::SourceUnavailable("spec.source.url: gone".into()), 0, 1),
                Pending,
                "False",
                "SourceUnavailable",
            ),
            ("starting", observed(Registration::Registered, 0, 2), Pending, "False", "WorkersStarting"),
            ("running", running, Running, "True", "Serving"),
            ("completed", done, Completed, "True", "Completed"),
            ("failed", failed, Failed, "False", "PipelineFailed"),
        ];
        for (what, o, phase, ready, reason) in table {
            let s = status(None, &o, t(1_795_000_000));
            assert_eq!(s.phase, Some(phase), "{what}");
            assert_eq!(cond(&s, "Ready").0, ready, "{what}");
            assert_eq!(cond(&s, "Ready").1, reason, "{what}");
            assert_eq!(s.observed_generation, Some(3), "{what}");
            assert_eq!(s.conditions.len(), 4, "{what}: Ready, Scaling, Caching, Degraded");
        }
    }

    #[test]
    fn the_cache_shows_the_closed_loops_last_check_and_re_decisions() {
        use granary_dispatcher::{CacheReport, EpochCache, EpochCheck};
        use granary_policies::caching::{Action, CacheDecision, Predicted};
        let text =
            "epoch 1: predicted 8.4 s computing, measured 2.1 s (−75%): re-deciding → write `small` (cut 2)";
        let check = |epoch: u32, verdict: &str, text: &str| EpochCheck {
            epoch,
            action: "compute".into(),
            elements: 840,
            predicted_seconds: 8.4,
            measured_seconds: 2.1,
            error: -0.75,
            verdict: verdict.into(),
            text: text.into(),
        };
        let epoch = |epoch: u32| EpochCache {
            epoch,
            mode: "compute".into(),
            bytes_read: 0,
            bytes_written: 0,
            splits_read: 0,
            splits_written: 0,
            splits_computed: 3,
            splits_bad: 0,
            splits_read_failed: 0,
            recomputed: 0,
            predicted_items_per_s: Some(100.0),
            measured_items_per_s: Some(400.0),
        };
        let report = CacheReport {
            policy: "auto".into(),
            store: Some("file:///cache".into()),
            decision: Some(CacheDecision {
                action: Action::Write { boundary: 2 },
                predicted: Predicted {
                    compute_items_per_s: 400.0,
                    write_items_per_s: Some(900.0),
                    read_items_per_s: Some(2000.0),
                },
                reason: format!("{text}; writing is faster"),
                candidates: Vec::new(),
            }),
            stage: Some("small".into()),
            fingerprint: Some("3fa9c2".into()),
            sources: Vec::new(),
            epochs: vec![epoch(0), epoch(1)],
            checks: vec![check(0, "within", "epoch 0: within"), check(1, "re-decided", text)],
            last_check: Some(text.into()),
            redecisions: 1,
        };
        let cache = cache_status(Some(&report));
        assert_eq!(cache.last_check.as_deref(), Some(text));
        assert_eq!(cache.redecisions, 1);
        assert_eq!(cache.state, "writing");
        let o = Observed { cache, ..observed(Registration::Registered, 2, 2) };
        let shown = status(None, &o, t(9)).cache.expect("the cache's status");
        assert_eq!((shown.last_check.as_deref(), shown.redecisions), (Some(text), 1));

        let unchecked = CacheReport { checks: Vec::new(), last_check: None, redecisions: 0, ..report };
        let cache = cache_status(Some(&unchecked));
        assert_eq!((cache.last_check, cache.redecisions), (None, 0));
        let unregistered = cache_status(None);
        assert_eq!((unregistered.last_check, unregistered.redecisions), (None, 0));
    }

    #[test]
    fn skipped_elements_show_once_there_are_any() {
        let o = Observed { skipped_elements: 1, ..observed(Registration::Registered, 2, 2) };
        assert_eq!(status(None, &o, t(9)).skipped_elements, Some(1));
        assert_eq!(status(None, &observed(Registration::Registered, 2, 2), t(9)).skipped_elements, None);
        let invalid = Observed { skipped_elements: 1, ..observed(Registration::Invalid("x".into()), 0, 0) };
        assert_eq!(status(None, &invalid, t(9)).skipped_elements, None);
    }

    #[test]
    fn an_invalid_spec_names_the_field_and_reports_no_rates() {
        let o = observed(Registration::Invalid("spec.cache.at: no stage named `x`".into()), 0, 0);
        let s = status(None, &o, t(9));
        assert!(cond(&s, "Ready").2.starts_with("spec.cache.at:"));
        assert_eq!((s.throughput, s.trainer_wait_fraction, s.epoch), (None, None, None));
    }

    #[test]
    fn a_pool_scaled_to_zero_is_running_and_idle() {
        let mut o = observed(Registration::Registered, 0, 0);
        o.scaling = Some(ScalingReport {
            desired: 0,
            last_reason: "no trainer attached for 300 s: releasing every worker".into(),
            ..Default::default()
        });
        let running = status(None, &observed(Registration::Registered, 2, 2), t(0));
        let s = status(Some(&running), &o, t(1));
        assert_eq!(s.phase, Some(PipelinePhase::Running));
        let (ready, reason, message) = cond(&s, "Ready");
        assert_eq!((ready, reason), ("True", "ScaledToZero"));
        assert!(message.contains("no trainer attached for 300 s"), "{message}");
        assert_eq!(cond(&s, "Degraded").0, "False");
    }

    #[test]
    fn losing_every_worker_after_running_is_degraded() {
        let running = status(None, &observed(Registration::Registered, 2, 2), t(0));
        let s = status(Some(&running), &observed(Registration::Registered, 0, 2), t(1));
        assert_eq!(s.phase, Some(PipelinePhase::Degraded));
        assert_eq!(cond(&s, "Degraded").0, "True");
        assert_eq!(s.workers.as_deref(), Some("0/2"));
    }

    #[test]
    fn scaling_says_which_way_and_why() {
        let mut o = observed(Registration::Registered, 1, 3);
        o.scaling = Some(ScalingReport {
            desired: 3,
            last_reason: "trainers wait 40% of each step".into(),
            ..Default::default()
        });
        let s = status(None, &o, t(9));
        assert_eq!(
            cond(&s, "Scaling"),
            ("True", "ScalingUp", "1/3 workers ready; trainers wait 40% of each step")
        );
        let s = status(None, &observed(Registration::Registered, 2, 2), t(9));
        assert_eq!(cond(&s, "Scaling"), ("False", "AtTarget", "policy fixed: 2 workers"));
    }

    #[test]
    fn transition_times_hold_while_a_condition_holds() {
        let a = status(None, &observed(Registration::Registered, 2, 2), t(0));
        let b = status(Some(&a), &observed(Registration::Registered, 2, 2), t(1));
        assert!(b.conditions.iter().all(|c| c.last_transition_time == at(0)));
        let c = status(Some(&b), &observed(Registration::Registered, 0, 2), t(2));
        let ready = c.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, at(2));
    }

    #[test]
    fn rates_sum_throughput_and_average_waiting() {
        use granary_proto::v1::ClientMetrics;
        let m = |bps: f64, step: f64, wait: f64| ClientMetrics {
            batches_per_second: bps,
            step_seconds: step,
            wait_seconds: wait,
            ..Default::default()
        };
        let snapshot = MetricsSnapshot {
            workers: Vec::new(),
            consumers: vec![("j".into(), 0, m(10.0, 0.03, 0.01)), ("j".into(), 1, m(5.0, 0.01, 0.01))],
            ..Default::default()
        };
        let (throughput, wait) = rates(&snapshot, 8);
        assert_eq!(throughput, Some(120.0));
        assert_eq!(wait, Some(0.375));
        assert_eq!(rates(&MetricsSnapshot::default(), 8), (None, None));
    }

    #[test]
    fn a_failed_reconcile_says_why_and_keeps_the_rest() {
        let running = status(None, &observed(Registration::Registered, 2, 2), t(0));
        let why = "cannot scale Deployment `p-workers` to 3: forbidden";
        let failed = failed_reconcile(Some(&running), Some(4), why, t(1));
        assert_eq!(failed.phase, Some(PipelinePhase::Degraded));
        assert_eq!(failed.observed_generation, Some(4));
        assert_eq!(failed.workers, running.workers);
        let ready = failed.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ReconcileFailed"));
        assert_eq!(ready.message, why);
        let generation = |kind: &str| {
            failed.conditions.iter().find(|c| c.type_ == kind).and_then(|c| c.observed_generation)
        };
        assert_eq!(
            (generation("Ready"), generation("Degraded"), generation("Caching")),
            (Some(4), Some(4), Some(3))
        );
        assert_eq!(ready.last_transition_time, at(1));
        let scaling = failed.conditions.iter().find(|c| c.type_ == "Scaling").expect("Scaling");
        assert_eq!(scaling.last_transition_time, at(0), "untouched");
        // The same failure again keeps its transition time.
        let again = failed_reconcile(Some(&failed), Some(4), why, t(2));
        let ready = again.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!(ready.last_transition_time, at(1));
    }

    #[test]
    fn the_plan_in_effect_is_shown_only_when_the_optimizer_rewrote_the_stages() {
        let spec = |stages: &str| {
            let yaml = format!(
                "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: p}}\nspec:\n  source: \
                 {{url: 's3://b/d/', format: jsonl}}\n  batch: {{size: 4}}\n  stages:\n{stages}"
            );
            match granary_crds::parse_manifest(&yaml, std::path::Path::new("/"), &[]) {
                Ok(m) => m.pipeline.spec,
                Err(e) => panic!("{e}"),
            }
        };
        let as_written = spec("  - {op: table.cast, columns: {label: int64}}\n");
        assert_eq!(plan_status(&as_written), None);
        let reordered = spec(
            "  - {op: table.cast, columns: {label: int64}}\n  - {op: filter, predicate: text.length, field: t, \
             unit: chars, max: 3}\n  - {op: table.select, columns: [label]}\n",
        );
        let Some(plan) = plan_status(&reordered) else { panic!("no plan for a reordered spec") };
        assert_eq!(
            plan.stages,
            ["spec.stages[1] filter", "spec.stages[0] table.cast", "spec.stages[2] table.select"]
        );
        assert_eq!(plan.source_fields, Some(vec!["label".to_string(), "t".to_string()]));
        assert!(
            plan.rewrites[0]
                .starts_with("moved spec.stages[1] filter before spec.stages[0] table.cast (exact")
        );
        let o = Observed { plan: Some(plan.clone()), ..observed(Registration::Registered, 1, 1) };
        assert_eq!(status(None, &o, Timestamp::UNIX_EPOCH).plan, Some(plan));
    }
}
