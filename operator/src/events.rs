//! Events on `InputPipeline`s: one for every scaling and caching decision, carrying the policy's
//! reason, and one for each registration, invalid spec, unreachable source, completion and
//! cleanup. Which decisions are new is a pure function of what was already published.

use crate::config::MANAGER;
use granary_dispatcher::CacheReport;
use granary_dispatcher::autoscaler::ScalingReport;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

/// Longest note the API server accepts is 1 kB; longer ones are cut with an ellipsis.
const MAX_NOTE: usize = 1000;

/// One event to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    /// Warning or normal.
    pub warning: bool,
    /// CamelCase reason: `Scaled`, `CacheDecided`, `Registered`, `InvalidSpec`, ...
    pub reason: &'static str,
    /// What happened and why, in words.
    pub text: String,
}

impl Note {
    /// A normal event.
    pub fn normal(reason: &'static str, text: impl Into<String>) -> Note {
        Note { warning: false, reason, text: text.into() }
    }

    /// A warning.
    pub fn warning(reason: &'static str, text: impl Into<String>) -> Note {
        Note { warning: true, reason, text: text.into() }
    }
}

/// The Warning Event of a pipeline that failed (a split failed every attempt). A cause longer
/// than an Event holds keeps its start (the stage and the element) and its end (the last lines of
/// a Python traceback, which name the exception), cut in between.
pub fn failure_note(why: &str) -> Note {
    let text = if why.chars().count() <= MAX_NOTE {
        why.to_string()
    } else {
        let head: String = why.chars().take(MAX_NOTE / 3).collect();
        let tail: Vec<char> = why.chars().rev().take(MAX_NOTE / 2).collect();
        let tail: String = tail.into_iter().rev().collect();
        format!("{head} … {tail}")
    };
    Note::warning("PipelineFailed", text)
}

/// The autoscaler's decisions not yet published, given that `published` of its changes were:
/// one `Scaled` note each, oldest first.
pub fn new_scalings(report: &ScalingReport, published: u64) -> (Vec<Note>, u64) {
    let total = report.scale_ups + report.scale_downs;
    let fresh = total.saturating_sub(published).min(report.decisions.len() as u64) as usize;
    let notes = report
        .decisions
        .iter()
        .skip(report.decisions.len() - fresh)
        .map(|d| Note::normal("Scaled", format!("scaled from {} to {} workers: {}", d.from, d.to, d.reason)))
        .collect();
    (notes, total)
}

/// The autocacher's decision, when it differs from the one already published (`published`
/// is the key returned with it last time).
pub fn new_cache_decision(report: Option<&CacheReport>, published: Option<&str>) -> Option<(Note, String)> {
    let report = report?;
    let decision = report.decision.as_ref()?;
    let mut key = format!("{:?}/{}", decision.action, report.fingerprint.as_deref().unwrap_or(""));
    for s in report.sources.iter().skip(1) {
        key.push_str(&format!(",{}", s.fingerprint));
    }
    if published == Some(key.as_str()) {
        return None;
    }
    let short = |fp: &str| fp.get(..12).unwrap_or(fp).to_string();
    let what = match (&report.stage, &report.fingerprint) {
        (Some(stage), Some(_)) if !report.sources.is_empty() => {
            let entries: Vec<String> =
                report.sources.iter().map(|s| format!("{} {}", s.name, short(&s.fingerprint))).collect();
            format!("cache the output of `{stage}` (one entry per source: {})", entries.join(", "))
        }
        (Some(stage), Some(entry)) => format!("cache the output of `{stage}` (entry {})", short(entry)),
        _ => "compute every stage, cache nothing".to_string(),
    };
    Some((Note::normal("CacheDecided", format!("{what}: {}", decision.reason)), key))
}

/// Publishes notes about objects as `events.k8s.io/v1` Events from the operator's reporting
/// controller. Each note is its own Event (kube's `Recorder` would fold notes of the same reason
/// into one series and keep only the first note, losing every later decision's reason); the
/// reconciler publishes a note once, not on every pass.
#[derive(Clone)]
pub struct Notifier {
    client: Client,
    instance: String,
}

impl Notifier {
    /// A notifier reporting as `granary-operator`, instance `identity`.
    pub fn new(client: Client, identity: &str) -> Notifier {
        Notifier { client, instance: identity.into() }
    }

    /// The Event for `note` about `regarding` at `now`.
    fn event(&self, regarding: &ObjectReference, note: Note, now: Timestamp) -> K8sEvent {
        let mut text = note.text;
        if text.len() > MAX_NOTE {
            let mut cut = MAX_NOTE - 3;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("...");
        }
        let name = regarding.name.clone().unwrap_or_default();
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: regarding.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
            reason: Some(note.reason.into()),
            action: Some(note.reason.into()),
            note: Some(text),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(MANAGER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        }
    }

    /// Publishes `note` about `regarding`; a failure is logged, never fatal.
    pub async fn publish(&self, regarding: &ObjectReference, note: Note) {
        let reason = note.reason;
        let event = self.event(regarding, note, Timestamp::now());
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(reason, "cannot publish an event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_keeps_its_start_and_its_end() {
        let why = format!(
            "split 3 of epoch 0 failed 3 times: spec.stages[2] (`jitter`) failed on element `a.jpg`: Traceback\n{}\nValueError: bad pixel",
            "  File \"augment.py\", line 9\n".repeat(80)
        );
        let note = failure_note(&why);
        assert!(note.warning && note.reason == "PipelineFailed");
        assert!(note.text.chars().count() <= MAX_NOTE, "{}", note.text.len());
        assert!(note.text.starts_with("split 3 of epoch 0 failed 3 times: spec.stages[2] (`jitter`)"));
        assert!(note.text.ends_with("ValueError: bad pixel"));
        assert_eq!(failure_note("short").text, "short");
    }
    use granary_dispatcher::autoscaler::DecisionRecord;

    fn report(decisions: &[(u32, u32)]) -> ScalingReport {
        let mut r = ScalingReport::default();
        for &(from, to) in decisions {
            if to > from {
                r.scale_ups += 1
            } else {
                r.scale_downs += 1
            }
            r.decisions.push_back(DecisionRecord { at_s: 0.0, from, to, reason: format!("why {to}") });
        }
        r
    }

    #[test]
    fn each_scaling_decision_is_published_once_with_its_reason() {
        let r = report(&[(1, 3), (3, 2)]);
        let (notes, seen) = new_scalings(&r, 0);
        assert_eq!(seen, 2);
        assert_eq!(
            notes.iter().map(|n| n.text.as_str()).collect::<Vec<_>>(),
            ["scaled from 1 to 3 workers: why 3", "scaled from 3 to 2 workers: why 2"]
        );
        assert!(new_scalings(&r, seen).0.is_empty());
        let r = report(&[(1, 3), (3, 2), (2, 4)]);
        let (notes, seen) = new_scalings(&r, 2);
        assert_eq!((notes.len(), seen), (1, 3));
        assert_eq!(notes[0].reason, "Scaled");
    }

    #[test]
    fn decisions_beyond_the_kept_window_are_not_invented() {
        let mut r = report(&[(1, 2)]);
        r.scale_ups = 150;
        let (notes, seen) = new_scalings(&r, 0);
        assert_eq!((notes.len(), seen), (1, 150));
    }
}
