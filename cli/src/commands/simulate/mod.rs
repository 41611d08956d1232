//! `granary simulate`: run the autoscaling policies against the oracle on the simulator's named
//! scenarios and report the four figures per (scenario, policy).
//!
//! Output, on stdout: the text table (`granary_policies::report::table`), followed with
//! `--decisions` by every decision of every policy with its time and reason; or with `--json`
//! exactly one JSON line per (scenario, policy) and nothing else. `--plot DIR` also writes
//! `DIR/<scenario>.png` per scenario (see [`plot`]). Exit status: 0 on success, 2 for an unknown
//! scenario or policy name (clap reports it, listing the valid names), 1 for any other failure
//! (no font for `--plot`, an unwritable folder).

mod plot;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use granary_policies::PolicyKind;
use granary_policies::report;
use granary_policies::simulate::{self, Scenario, ScenarioResult};

/// The name that selects every scenario or every policy.
const ALL: &str = "all";

/// Arguments of `granary simulate`.
#[derive(clap::Args, Clone, Debug)]
pub struct SimulateArgs {
    /// Scenario to run, or `all`.
    #[arg(long, value_name = "NAME", default_value = ALL, value_parser = parse_scenario, help = scenario_help())]
    pub scenario: String,
    /// Policy to run, or `all`.
    #[arg(long, value_name = "NAME", default_value = ALL, value_parser = parse_policy, help = policy_help())]
    pub policy: String,
    /// Print one JSON line per (scenario, policy) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write one PNG per scenario into this folder (created if missing): workers running per
    /// policy and for the oracle over time, and the demand.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// After the table, print every decision with its time and reason.
    #[arg(long, conflicts_with = "json")]
    pub decisions: bool,
}

/// Runs `granary simulate`.
pub fn simulate(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let (scenarios, policies) = match (select_scenarios(&args.scenario), select_policies(&args.policy)) {
        (Ok(s), Ok(p)) => (s, p),
        (Err(e), _) | (_, Err(e)) => {
            return Err(crate::exit::InvalidInput(e.to_string()).into());
        }
    };
    // Find the font before the simulations run, so a missing one fails at once.
    if args.plot.is_some() {
        plot::register_font()?;
    }
    let results = simulate::evaluate_all(&scenarios, &policies);
    let rows = simulate::rows(&results);
    let mut out = String::new();
    if args.json {
        out.push_str(&report::json_lines(&rows).context("cannot encode the report")?);
    } else {
        out.push_str(&report::table(&rows));
        if args.decisions {
            out.push_str(&decisions_text(&results));
        }
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (scenario, result) in scenarios.iter().zip(&results) {
            let path = dir.join(format!("{}.png", scenario.name));
            plot::write_png(&path, scenario, result)
                .with_context(|| format!("cannot draw {}", path.display()))?;
            if !args.json {
                let _ = writeln!(out, "plot: {}", path.display());
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    // A closed pipe cannot be reported anywhere useful.
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    Ok(ExitCode::SUCCESS)
}

/// Every decision per scenario and policy: a header, then `t=…s  from → to  reason` lines.
fn decisions_text(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    for result in results {
        for p in &result.policies {
            let n = p.run.decisions.len();
            let _ = writeln!(
                out,
                "\n{} / {}: {n} decision{}",
                result.scenario,
                p.policy.name(),
                if n == 1 { "" } else { "s" }
            );
            for d in &p.run.decisions {
                let _ = writeln!(out, "  t={:>6.0}s  {:>2} → {:<2}  {}", d.t, d.from, d.to, d.reason);
            }
        }
    }
    out
}

/// The scenarios `name` selects: all of them for `all`, else the one of that name.
fn select_scenarios(name: &str) -> Result<Vec<Scenario>, String> {
    if name == ALL {
        return Ok(simulate::scenarios());
    }
    simulate::scenario(name).map(|s| vec![s]).map_err(|_| {
        format!("unknown scenario `{name}`; valid names: {ALL}, {}", simulate::scenario_names().join(", "))
    })
}

/// The policies `name` selects: all of them for `all`, else the one of that name.
fn select_policies(name: &str) -> Result<Vec<PolicyKind>, String> {
    if name == ALL {
        return Ok(PolicyKind::ALL.to_vec());
    }
    name.parse::<PolicyKind>()
        .map(|p| vec![p])
        .map_err(|_| format!("unknown policy `{name}`; valid names: {ALL}, {}", policy_names().join(", ")))
}

fn policy_names() -> Vec<&'static str> {
    PolicyKind::ALL.iter().map(|p| p.name()).collect()
}

fn parse_scenario(name: &str) -> Result<String, String> {
    select_scenarios(name).map(|_| name.to_string())
}

fn parse_policy(name: &str) -> Result<String, String> {
    select_policies(name).map(|_| name.to_string())
}

fn scenario_help() -> String {
    format!("Scenario to run: {ALL} or one of {}", simulate::scenario_names().join(", "))
}

fn policy_help() -> String {
    format!("Policy to run: {ALL} or one of {}", policy_names().join(", "))
}
