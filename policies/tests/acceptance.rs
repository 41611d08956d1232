//! The acceptance bars of the Granary policy in the simulator, and the same scenarios under the
//! baselines (printed, not judged): `cargo test -p granary-policies --test acceptance -- --nocapture`.

use granary_policies::PolicyKind;
use granary_policies::report::{Row, json_lines, table};
use granary_policies::simulate::{ScenarioResult, evaluate_all, rows, scenarios};

fn results() -> Vec<ScenarioResult> {
    evaluate_all(&scenarios(), &PolicyKind::ALL)
}

fn granary_rows() -> Vec<Row> {
    rows(&results()).into_iter().filter(|r| r.policy == "granary").collect()
}

#[test]
fn prints_the_table_and_every_decision() {
    let results = results();
    let all = rows(&results);
    println!("{}", table(&all));
    print!("{}", json_lines(&all).unwrap_or_default());
    for r in &results {
        for p in &r.policies {
            println!("--- {} / {}", r.scenario, p.policy);
            for d in &p.run.decisions {
                println!("  t={:>6.0} {} → {}: {}", d.t, d.from, d.to, d.reason);
            }
        }
    }
    assert_eq!(all.len(), results.len() * PolicyKind::ALL.len());
}

#[test]
fn granary_converges_in_at_most_two_decisions_per_steady_phase() {
    for row in granary_rows() {
        assert!(row.decisions_to_converge.is_some_and(|d| d <= 2), "{row:?}");
    }
}

#[test]
fn granary_training_time_is_within_5_percent_of_the_oracle() {
    for row in granary_rows() {
        assert!(row.training_time_vs_oracle <= 1.05, "{row:?}");
    }
}

#[test]
fn granary_worker_seconds_are_within_10_percent_of_the_oracle() {
    for row in granary_rows() {
        assert!(row.worker_seconds_vs_oracle <= 1.10, "{row:?}");
    }
}
