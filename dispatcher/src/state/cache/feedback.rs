//! The closed loop: at each epoch boundary, the epoch's measured seconds against those the
//! decision's model predicts for what the epoch did; beyond the policy's tolerance (25%), the
//! measured time corrects the profile's figures ([`Corrections`]) and the policy decides again.
//!
//! Timing: an epoch runs from the grant of the earliest-granted lease among its completed splits
//! to the first tick of the clock after its last completion (the clock is the state's `now` on
//! each lease request and each expiry pass, every 100 ms in the service). Its elements are the
//! listed elements of its completed splits, over every job. An epoch is finished when every job
//! completed all its splits.
//!
//! What is legal: `policy: at` (and `never`) is never re-decided; neither is a decision made
//! without a usable profile. A re-decision never reads an entry that is not complete: a cut
//! whose entry misses splits is written (its complete splits are read, as leases always do).
//! Leases already granted keep their task: a split being written finishes (or its lease is lost)
//! and its entry stays in use until then, whatever the pipeline decides meanwhile.

use super::report::{blended, mode};
use super::{Chosen, EpochStats, inputs};
use crate::state::State;
use granary_crds::CachePolicy;
use granary_policies::caching::feedback::{self, Observed};
use granary_policies::caching::{self as policy, Action};
use serde::Serialize;

/// Workers' queues this full (parts queued over capacity, all workers of the pipeline) mean
/// the consumers set the pace: a slow epoch then says nothing about the input pipeline.
const CONSUMER_BOUND: f64 = 0.9;

/// One finished epoch's prediction against its outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochCheck {
    /// Epoch.
    pub epoch: u32,
    /// What the epoch did: `compute`, `write` (some split was written) or `read`.
    pub action: String,
    /// Listed elements of its splits, over every job.
    pub elements: u64,
    /// Seconds the model predicted for them: the predicted time per element of reading, writing
    /// and computing, weighted by the epoch's splits of each kind.
    pub predicted_seconds: f64,
    /// Seconds they took, as the dispatcher timed them.
    pub measured_seconds: f64,
    /// `(measured − predicted) / predicted`.
    pub error: f64,
    /// `within` (the tolerance), `re-decided`, or `held`: off by more, but the decision stays
    /// (forced by the spec, no profile to correct, no epoch left, consumers set the pace, or
    /// the corrected model's better action gains less than `SWITCH_MARGIN`).
    pub verdict: String,
    /// In words: "epoch 0: predicted 8.4 s computing, measured 25 s (+198%): re-deciding →
    /// write `small` (cut 2)".
    pub text: String,
}

impl EpochCheck {
    /// The predicted rate, elements per second.
    pub fn predicted_items_per_s(&self) -> f64 {
        self.elements as f64 / self.predicted_seconds
    }

    /// The measured rate, elements per second.
    pub fn measured_items_per_s(&self) -> f64 {
        self.elements as f64 / self.measured_seconds
    }
}

fn observed(s: &EpochStats) -> Observed {
    match mode(s) {
        "write" => Observed::Write,
        "read" => Observed::Read,
        _ => Observed::Compute,
    }
}

/// "8.4 s", "25 s", "0.21 s".
fn seconds(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0} s")
    } else if x >= 1.0 {
        format!("{x:.1} s")
    } else {
        format!("{x:.2} s")
    }
}

/// An action without its stage's name: "compute", "write at cut 2", "read at cut 2".
fn action_name(action: Action) -> String {
    match action {
        Action::Compute => "compute".to_string(),
        Action::Write { boundary } => format!("write at cut {boundary}"),
        Action::Read { boundary } => format!("read at cut {boundary}"),
    }
}

/// What a decision does, briefly: "compute", "write `small` (cut 2)".
fn briefly(c: &Chosen) -> String {
    match c.decision.action {
        Action::Compute => "compute".to_string(),
        Action::Write { boundary } => format!("write `{}` (cut {boundary})", c.stage),
        Action::Read { boundary } => format!("read `{}` (cut {boundary})", c.stage),
    }
}

impl State {
    /// The closed loop's clock for pipeline `name` at `now`: stamps the epochs completed since
    /// the last tick, and checks each that finished.
    pub(crate) fn cache_tick(&mut self, name: &str, now: u64) {
        let Some(p) = self.pipelines.get_mut(name) else { return };
        if p.cache.unstamped.is_empty() {
            return;
        }
        let stamped = std::mem::take(&mut p.cache.unstamped);
        for &e in &stamped {
            if let Some(s) = p.cache.stats.get_mut(&e) {
                s.done_ms = Some(s.done_ms.map_or(now, |d| d.max(now)));
            }
        }
        for e in stamped {
            let unchecked =
                self.pipelines.get(name).and_then(|p| p.cache.stats.get(&e)).is_some_and(|s| !s.checked);
            if unchecked && self.epoch_finished(name, e) {
                self.check_epoch(name, e);
            }
        }
    }

    /// Whether every job of `name` completed every split of epoch `e`.
    fn epoch_finished(&self, name: &str, e: u32) -> bool {
        let Some(p) = self.pipelines.get(name) else { return false };
        !p.jobs.is_empty()
            && p.jobs.values().all(|j| match j.epochs.get(&e) {
                Some(state) => state
                    .plan
                    .order()
                    .iter()
                    .all(|&split| state.status.get(split) == crate::state::SplitStatus::Done),
                // Epochs before the ones a job keeps are done.
                None => j.epochs.keys().next().is_some_and(|&first| e < first),
            })
    }

    /// Whether the workers of `name` hold queues nearly full: its consumers set the pace.
    fn consumers_set_the_pace(&self, name: &str) -> bool {
        let (mut queued, mut capacity) = (0u64, 0u64);
        for w in self.workers.values().filter(|w| w.pipeline.as_deref().is_none_or(|x| x == name)) {
            if let Some(m) = &w.metrics {
                queued += u64::from(m.buffered_parts);
                capacity += u64::from(m.buffer_capacity);
            }
        }
        capacity > 0 && queued as f64 >= CONSUMER_BOUND * capacity as f64
    }

    /// Compares finished epoch `e` of `name` with its prediction, records the check, and
    /// re-decides when the prediction was off by more than the tolerance and that is allowed.
    fn check_epoch(&mut self, name: &str, e: u32) {
        let Some(p) = self.pipelines.get_mut(name) else { return };
        let Some(stats) = p.cache.stats.get_mut(&e) else { return };
        stats.checked = true;
        let stats = *stats;
        let Some(p) = self.pipelines.get(name) else { return };
        let Some(chosen) = p.cache.decision.as_ref() else { return };
        let (Some(start), Some(done)) = (stats.started_ms, stats.done_ms) else { return };
        let measured = done.saturating_sub(start) as f64 / 1000.0;
        // The model's rates now: the profile's figures as corrected so far, with the workers
        // the pipeline has now; the decision's own figures without a usable profile.
        let usable = p.cache.profile.as_ref().filter(|profile| profile.error.is_empty());
        let rates = match usable {
            Some(profile) => {
                let inputs = p.cache.corrections.apply(&inputs::inputs(self, name, profile));
                feedback::rates(&inputs, chosen.decision.action)
            }
            None => chosen.decision.predicted,
        };
        let Some(rate) = blended(&rates, &stats) else { return };
        let predicted = stats.elements as f64 / rate;
        let Some(error) = feedback::error(predicted, measured) else { return };
        let what = observed(&stats);
        let head = format!(
            "epoch {e}: predicted {} {}, measured {} ({:+.0}%)",
            seconds(predicted),
            what.gerund(),
            seconds(measured),
            error * 100.0
        );
        let left = p.facts.epochs.saturating_sub(e.saturating_add(1));
        let held = if !feedback::off(error) {
            Some((
                "within",
                format!("within {:.0}%, keeping {}", feedback::TOLERANCE * 100.0, briefly(chosen)),
            ))
        } else if p.cache.config.policy != CachePolicy::Auto {
            Some((
                "held",
                format!(
                    "`policy: {}` is set by the spec, keeping {}",
                    p.cache.config.policy_name(),
                    briefly(chosen)
                ),
            ))
        } else if usable.is_none() {
            Some(("held", format!("no usable profile to correct, keeping {}", briefly(chosen))))
        } else if left == 0 {
            Some(("held", "no epoch is left to re-decide for".to_string()))
        } else if error > 0.0 && self.consumers_set_the_pace(name) {
            Some((
                "held",
                format!(
                    "the consumers set the pace (the workers' queues are full), keeping {}",
                    briefly(chosen)
                ),
            ))
        } else {
            None
        };
        let check = |verdict: &str, text: String| EpochCheck {
            epoch: e,
            action: what.name().to_string(),
            elements: stats.elements,
            predicted_seconds: predicted,
            measured_seconds: measured,
            error,
            verdict: verdict.to_string(),
            text,
        };
        if let Some((verdict, why)) = held {
            let text = format!("{head}: {why}");
            tracing::info!(pipeline = name, epoch = e, "cache check: {text}");
            if let Some(p) = self.pipelines.get_mut(name) {
                p.cache.checks.push(check(verdict, text));
            }
            return;
        }
        let Some(profile) = usable.cloned() else { return };
        let mut corrections = p.cache.corrections;
        corrections.observe(what, measured / predicted);
        let mut inputs = corrections.apply(&inputs::inputs(self, name, &profile));
        inputs.remaining_epochs = left;
        let decision = policy::decide(&inputs);
        if let Some(gain) = feedback::marginal_switch(&decision, chosen.decision.action) {
            // The corrected model prefers another action, but by less than the margin: the
            // switch would follow noise (a short epoch is mostly fixed costs).
            let text = format!(
                "{head}: re-deciding would switch to {} for {:.0}% less time, under the {:.0}% a \
                 switch needs, keeping {}",
                action_name(decision.action),
                gain * 100.0,
                feedback::SWITCH_MARGIN * 100.0,
                briefly(chosen)
            );
            tracing::info!(pipeline = name, epoch = e, "cache check: {text}");
            if let Some(p) = self.pipelines.get_mut(name) {
                p.cache.corrections = corrections;
                p.cache.checks.push(check("held", text));
            }
            return;
        }
        let mut next = self.chosen(name, &profile, decision, e.saturating_add(1));
        self.never_read_incomplete(name, &mut next);
        let text = format!("{head}: re-deciding → {}", briefly(&next));
        tracing::info!(pipeline = name, epoch = e, "cache check: {text}");
        next.decision.reason = format!("{text}; {}", next.decision.reason);
        if let Some(p) = self.pipelines.get_mut(name) {
            p.cache.corrections = corrections;
            p.cache.checks.push(check("re-decided", text));
        }
        self.record_decision(name, next);
    }

    /// A decision to read an entry some split of which is not complete writes it instead: its
    /// complete splits are still read, and the rest are written.
    pub(super) fn never_read_incomplete(&self, name: &str, chosen: &mut Chosen) {
        let Action::Read { boundary } = chosen.decision.action else { return };
        let Some(p) = self.pipelines.get(name) else { return };
        let Some(store) = p.cache.config.store.as_ref() else { return };
        let splits: Vec<u64> = match &p.facts.mixing {
            Some(m) => m.splits.clone(),
            None => vec![p.facts.counts.len() as u64],
        };
        let complete = chosen.entries().iter().zip(&splits).all(|(fp, &n)| {
            self.cache_entries
                .get(&(store.clone(), (*fp).to_string()))
                .is_some_and(|entry| (0..n).all(|s| entry.complete.contains_key(&s)))
        });
        if !complete {
            chosen.decision.action = Action::Write { boundary };
            chosen.decision.reason += " (the entry is not complete: its missing splits are written)";
        }
    }
}
