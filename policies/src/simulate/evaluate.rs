//! Scoring runs against the oracle.

use serde::{Deserialize, Serialize};

use super::run::{Run, run_oracle, run_policy};
use super::scenario::Scenario;
use crate::policy_kind::PolicyKind;
use crate::report::Row;

/// One policy's run of a scenario and its scores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// The policy.
    pub policy: PolicyKind,
    /// Its four figures.
    pub row: Row,
    /// The run itself (decisions and time series).
    pub run: Run,
}

/// A scenario run under the oracle and under each policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    /// Scenario name.
    pub scenario: String,
    /// The oracle's run, the reference of every ratio.
    pub oracle: Run,
    /// One entry per policy, in the order asked.
    pub policies: Vec<PolicyResult>,
}

/// Decisions needed in each phase until the target equals the phase's oracle count and stays
/// there until the phase ends: the number of target changes inside the phase, provided the
/// target at its end is the oracle's; `None` otherwise. A phase ends at the next phase's start
/// or when the first job finishes (the demand changes then), whichever is first; phases the run
/// never reached are skipped. The result is the maximum over phases, `None` if any phase did not
/// converge.
pub fn decisions_to_converge(scenario: &Scenario, run: &Run) -> Option<u32> {
    let mut worst = 0;
    let mut target = run.decisions.first().map_or(scenario.initial_workers, |d| d.from);
    for i in 0..scenario.phases.len() {
        let start = scenario.phases[i].start_s;
        let end = scenario.phase_end(i).min(run.first_job_done_s);
        let inside: Vec<_> = run.decisions.iter().filter(|d| d.t >= start && d.t < end).collect();
        if let Some(last) = run.decisions.iter().rfind(|d| d.t < end) {
            target = last.to;
        }
        if start >= end {
            continue;
        }
        if target != scenario.phase_oracle(i) {
            return None;
        }
        worst = worst.max(u32::try_from(inside.len()).unwrap_or(u32::MAX));
    }
    Some(worst)
}

/// The figures of `run` against `oracle`.
pub fn score(scenario: &Scenario, policy: PolicyKind, run: &Run, oracle: &Run) -> Row {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    Row {
        scenario: scenario.name.clone(),
        policy: policy.name().to_string(),
        decisions_to_converge: decisions_to_converge(scenario, run),
        training_time_vs_oracle: ratio(run.training_time_s, oracle.training_time_s),
        worker_seconds_vs_oracle: ratio(run.worker_seconds, oracle.worker_seconds),
        mean_wait_fraction: run.wait_fraction,
    }
}

/// Runs `scenario` under the oracle and each of `policies` (default settings).
pub fn evaluate(scenario: &Scenario, policies: &[PolicyKind]) -> ScenarioResult {
    let oracle = run_oracle(scenario);
    let policies = policies
        .iter()
        .map(|&kind| {
            let mut policy = kind.build();
            let run = run_policy(scenario, policy.as_mut());
            PolicyResult { policy: kind, row: score(scenario, kind, &run, &oracle), run }
        })
        .collect();
    ScenarioResult { scenario: scenario.name.clone(), oracle, policies }
}

/// [`evaluate`] for every scenario.
pub fn evaluate_all(scenarios: &[Scenario], policies: &[PolicyKind]) -> Vec<ScenarioResult> {
    scenarios.iter().map(|s| evaluate(s, policies)).collect()
}

/// The rows of all results, scenario by scenario.
pub fn rows(results: &[ScenarioResult]) -> Vec<Row> {
    results.iter().flat_map(|r| r.policies.iter().map(|p| p.row.clone())).collect()
}
