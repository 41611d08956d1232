//! Rendering results: a text table and one JSON line per (scenario, policy).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The four figures of one policy on one scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Target changes until the oracle's count is held (max over phases); `None` when it never
    /// converges.
    pub decisions_to_converge: Option<u32>,
    /// Training time over the oracle's.
    pub training_time_vs_oracle: f64,
    /// Worker-seconds over the oracle's.
    pub worker_seconds_vs_oracle: f64,
    /// Share of trainer time spent waiting.
    pub mean_wait_fraction: f64,
}

impl Row {
    /// The row as one line of JSON with exactly the keys `scenario`, `policy`,
    /// `decisions_to_converge` (null when it never converges), `training_time_vs_oracle`,
    /// `worker_seconds_vs_oracle`, `mean_wait_fraction`.
    pub fn to_json_line(&self) -> Result<String, Error> {
        Ok(serde_json::to_string(self)?)
    }
}

/// One JSON line per row, each ending in a newline.
pub fn json_lines(rows: &[Row]) -> Result<String, Error> {
    let mut out = String::new();
    for row in rows {
        out.push_str(&row.to_json_line()?);
        out.push('\n');
    }
    Ok(out)
}

/// A fixed-width text table: scenario, policy and the four figures.
pub fn table(rows: &[Row]) -> String {
    let sw = rows.iter().map(|r| r.scenario.len()).chain([8]).max().unwrap_or(8);
    let pw = rows.iter().map(|r| r.policy.len()).chain([7]).max().unwrap_or(7);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<sw$}  {:<pw$}  {:>9}  {:>10}  {:>12}  {:>9}",
        "scenario", "policy", "decisions", "time/oracle", "worker-s/oracle", "wait"
    );
    for r in rows {
        let decisions = r.decisions_to_converge.map_or("never".to_string(), |d| d.to_string());
        let _ = writeln!(
            out,
            "{:<sw$}  {:<pw$}  {:>9}  {:>11.3}  {:>15.3}  {:>8.1}%",
            r.scenario,
            r.policy,
            decisions,
            r.training_time_vs_oracle,
            r.worker_seconds_vs_oracle,
            r.mean_wait_fraction * 100.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(d: Option<u32>) -> Row {
        Row {
            scenario: "steady".into(),
            policy: "granary".into(),
            decisions_to_converge: d,
            training_time_vs_oracle: 1.01,
            worker_seconds_vs_oracle: 1.02,
            mean_wait_fraction: 0.03,
        }
    }

    #[test]
    fn json_has_exactly_the_keys() -> Result<(), Error> {
        let line = row(None).to_json_line()?;
        let v: serde_json::Value = serde_json::from_str(&line)?;
        let mut keys: Vec<&str> =
            v.as_object().map(|o| o.keys().map(|k| k.as_str()).collect()).unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "decisions_to_converge",
                "mean_wait_fraction",
                "policy",
                "scenario",
                "training_time_vs_oracle",
                "worker_seconds_vs_oracle"
            ]
        );
        assert!(v["decisions_to_converge"].is_null());
        assert_eq!(json_lines(&[row(Some(1)), row(None)])?.lines().count(), 2);
        Ok(())
    }

    #[test]
    fn table_says_never() {
        let t = table(&[row(None), row(Some(2))]);
        assert!(t.contains("never"));
        assert_eq!(t.lines().count(), 3);
    }
}
