//! The simulator and its reports.

use granary_policies::PolicyKind;
use granary_policies::report::{json_lines, table};
use granary_policies::simulate::{
    evaluate, evaluate_all, rows, run_oracle, scenario, scenario_names, scenarios,
};

#[test]
fn runs_are_deterministic() {
    let s = scenario("noisy").expect("noisy exists");
    assert_eq!(evaluate(&s, &PolicyKind::ALL), evaluate(&s, &PolicyKind::ALL));
}

#[test]
fn every_policy_stays_in_bounds_and_explains_itself() {
    for result in evaluate_all(&scenarios(), &PolicyKind::ALL) {
        for p in &result.policies {
            assert_eq!(p.run.bound_violations, 0, "{} / {}", result.scenario, p.policy);
            assert!(p.run.finished, "{} / {} did not finish", result.scenario, p.policy);
            assert!(p.run.decisions.iter().all(|d| !d.reason.is_empty() && d.from != d.to));
        }
    }
}

#[test]
fn the_oracle_waits_only_for_start_up() {
    let s = scenario("steady").expect("steady exists");
    let oracle = run_oracle(&s);
    assert_eq!(oracle.decisions.len(), 1, "{:?}", oracle.decisions);
    assert_eq!(oracle.decisions[0].to, 5);
    // 15 s at one worker out of five, over the whole run.
    assert!(oracle.wait_fraction < 0.02, "{}", oracle.wait_fraction);
    let last = oracle.series.last().expect("a series");
    assert!(last.supply >= last.demand);
}

#[test]
fn time_series_cover_the_run() {
    let s = scenario("demand-double").expect("exists");
    let r = evaluate(&s, &[PolicyKind::Granary]);
    let series = &r.policies[0].run.series;
    assert!(series.windows(2).all(|w| w[1].t > w[0].t));
    assert!(series.iter().all(|p| p.workers_running <= p.workers_desired.max(p.workers_running)));
    assert!((series.last().map_or(0.0, |p| p.t) - r.policies[0].run.training_time_s).abs() <= 1.0);
    let before = series.iter().find(|p| p.t == 300.0).map(|p| p.demand);
    let after = series.iter().find(|p| p.t == 900.0).map(|p| p.demand);
    assert!(matches!((before, after), (Some(b), Some(a)) if (a / b - 2.0).abs() < 1e-9));
}

#[test]
fn reports_have_one_line_per_scenario_and_policy() {
    let all = rows(&evaluate_all(&scenarios(), &PolicyKind::ALL));
    let n = scenario_names().len() * PolicyKind::ALL.len();
    assert_eq!(all.len(), n);
    let lines = json_lines(&all).expect("encodes");
    assert_eq!(lines.lines().count(), n);
    for line in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("valid json");
        assert_eq!(v.as_object().map(|o| o.len()), Some(6), "{line}");
    }
    assert_eq!(table(&all).lines().count(), n + 1);
}

#[test]
fn scenarios_cover_the_brief() {
    let names = scenario_names();
    for name in [
        "steady",
        "demand-double",
        "demand-half",
        "noisy",
        "slow-start",
        "two-jobs",
        "compute-bound",
        "above-max",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} missing");
    }
}
