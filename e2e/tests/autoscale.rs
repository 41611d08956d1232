//! The autoscaler driving the local process pool: `granary run --serve` with `scaling.policy:
//! auto` and a pipeline whose per-batch wall time is known (`test.sleep`), read by a consumer
//! with a fixed step time that later slows down.

use granary_e2e::*;
use std::time::{Duration, Instant};

/// Milliseconds `test.sleep` waits per element; each worker runs one compute thread.
const SLEEP_MS: f64 = 10.0;
const BATCH: u32 = 8;
/// Consumer step times: fast (needs 4 workers), then slow (needs 2).
const FAST_STEP_MS: u64 = 23;
const SLOW_STEP_MS: u64 = 60;
const FAST_BATCHES: u64 = 1000;
const LINES: usize = 2000;
/// JSONL files: one split each, so that several workers can work on an epoch at once.
const FILES: usize = 40;
const EPOCHS: u32 = 6;

/// The oracle's count for a consumer step of `step_ms`: the fewest workers whose nominal output
/// (`1000 / (SLEEP_MS × BATCH)` batches/s each) keeps up with `1000 / step_ms` batches/s.
fn oracle(step_ms: u64) -> u32 {
    let per_worker = 1000.0 / (SLEEP_MS * f64::from(BATCH));
    let demand = 1000.0 / step_ms as f64;
    (demand / per_worker).ceil() as u32
}

fn pipeline(dir: &std::path::Path) -> std::path::PathBuf {
    let data = dir.join("numbers");
    std::fs::create_dir_all(&data).expect("data folder");
    write_numbers(&data, LINES, FILES).expect("data");
    let manifest = dir.join("pipeline.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: jsonl}}
  stages:
    - {{op: test.sleep, ms: {SLEEP_MS}}}
  batch: {{size: {BATCH}}}
  epochs: {EPOCHS}
  scaling: {{policy: auto, minWorkers: 1, maxWorkers: 6}}
",
            data.display()
        ),
    )
    .expect("manifest");
    manifest
}

#[test]
fn the_autoscaler_reaches_the_oracle_count_and_scales_down_when_the_consumer_slows() {
    let (fast, slow) = (oracle(FAST_STEP_MS), oracle(SLOW_STEP_MS));
    assert_eq!((fast, slow), (4, 2), "the scenario is sized for 4 then 2 workers");
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = pipeline(dir.path());
    let metrics = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let d = start_dispatcher_with(
        &manifest,
        "127.0.0.1:0",
        &dir.path().join("journal"),
        &[
            "--policy-period",
            "1",
            "--threads",
            "1",
            "--max-workers",
            "6",
            "--exit-when-done",
            "--metrics-addr",
            &metrics,
        ],
    );
    let mut c = start_consumer(
        &d.address,
        &[
            "--step-ms",
            &FAST_STEP_MS.to_string(),
            "--slow-step-ms",
            &SLOW_STEP_MS.to_string(),
            "--slow-after",
            &FAST_BATCHES.to_string(),
        ],
    );
    // Well into the fast phase, the autoscaler has scaled up, and says so in its metrics.
    c.collect(600, Duration::from_secs(60));
    let body = scrape(&metrics);
    let ups = sample(
        &body,
        "granary_autoscaler_decisions_total{direction=\"up\",namespace=\"local\",pipeline=\"e2e\"}",
    );
    assert!(ups.is_some_and(|n| n >= 1.0), "{body}");
    let desired = sample(&body, "granary_workers_desired{namespace=\"local\",pipeline=\"e2e\"}");
    assert!(desired.is_some_and(|n| n >= 2.0), "{body}");
    assert!(c.finish(Duration::from_secs(110)), "the consumer did not finish in time");
    let elapsed = started.elapsed().as_secs_f64();
    let line = d.lines.recv_timeout(Duration::from_secs(30)).expect("the dispatcher reports its scaling");
    let report: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
    let scaling = &report["scaling"];
    let decisions = scaling["decisions"].as_array().expect("decisions");
    // Once the consumer finished every epoch the pool releases its workers, when the autoscaler
    // evaluates before the dispatcher exits: that last decision is not the policy's sizing.
    let released = decisions.last().is_some_and(|d| {
        d["to"].as_u64() == Some(0)
            && d["reason"].as_str().is_some_and(|r| r.starts_with("every job completed"))
    });
    let sized = &decisions[..decisions.len() - usize::from(released)];
    let targets: Vec<u64> = sized.iter().filter_map(|d| d["to"].as_u64()).collect();
    for d in decisions {
        eprintln!(
            "{:>6.1} s: {} → {}: {}",
            d["at_s"].as_f64().unwrap_or(0.0),
            d["from"],
            d["to"],
            d["reason"]
        );
    }
    eprintln!("last evaluation: {}", scaling["last_reason"]);
    // Reaches the oracle's count in at most 2 decisions and holds it until the slowdown.
    let reached = targets.iter().position(|&t| t == u64::from(fast)).expect("reaches the fast oracle count");
    assert!(reached < 2, "reached {fast} workers only at decision {} of {targets:?}", reached + 1);
    let down = targets[reached + 1..].first().copied().expect("scales down after the consumer slows");
    assert!(down < u64::from(fast), "{targets:?}");
    assert_eq!(targets.last().copied(), Some(u64::from(slow)), "ends at the slow oracle count: {targets:?}");
    // Every element exactly once in every epoch, through scaling up and down.
    let mut keys: Vec<String> = c.seen.iter().flat_map(|s| s.keys.iter().cloned()).collect();
    assert_eq!(keys.len(), LINES * EPOCHS as usize, "elements delivered");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), LINES, "distinct elements");
    assert_exactly_once(&c.seen, &keys, EPOCHS);
    // Against the oracle: the consumer-bound time of each phase, and its worker count for it.
    let total = (LINES as u64 * u64::from(EPOCHS)).div_ceil(u64::from(BATCH));
    let (t_fast, t_slow) = (
        FAST_BATCHES as f64 * FAST_STEP_MS as f64 / 1e3,
        (total - FAST_BATCHES) as f64 * SLOW_STEP_MS as f64 / 1e3,
    );
    let oracle_worker_seconds = f64::from(fast) * t_fast + f64::from(slow) * t_slow;
    let worker_seconds = scaling["worker_seconds"].as_f64().unwrap_or(0.0);
    eprintln!(
        "run {elapsed:.1} s vs oracle {:.1} s ({:.3}×); {worker_seconds:.0} worker-seconds vs oracle \
         {oracle_worker_seconds:.0} ({:.3}×); decisions {targets:?}",
        t_fast + t_slow,
        elapsed / (t_fast + t_slow),
        worker_seconds / oracle_worker_seconds
    );
}
