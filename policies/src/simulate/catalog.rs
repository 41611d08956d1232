//! The named scenarios. Every one runs an ImageNet-like pipeline (decode, crop, normalize: 2.3
//! CPU seconds per 256-element batch, 8 cores per worker, so one worker makes 3.47 batches/s) and
//! is sized so that the oracle's count is between 1 and 6 while trainers are connected (in
//! `bursty` and `workday` they come and go, and the oracle has none between them). In
//! `trainer-hosts` the normalization is the finishing that placement runs on the trainers' hosts
//! while they have idle cores; in `image-hosts` the hosts also make a share of the images.

use super::scenario::{JobSpec, Phase, Scenario, StageSpec};
use crate::error::Error;
use crate::inputs::{JobMode, PoolConfig};

/// Elements per batch in every scenario.
const BATCH: u32 = 256;

fn job(name: &str, consumers: u32, batches: u64) -> JobSpec {
    JobSpec {
        name: name.to_string(),
        consumers,
        mode: JobMode::Distributed,
        batches,
        batches_per_epoch: 5000,
        start_s: 0.0,
    }
}

/// A distributed job whose `consumers` connect at `start_s` and step every `step_seconds` for
/// `minutes`.
fn session(name: &str, start_s: f64, consumers: u32, step_seconds: f64, minutes: f64) -> JobSpec {
    let batches = (f64::from(consumers) / step_seconds * minutes * 60.0).round() as u64;
    JobSpec { start_s, ..job(name, consumers, batches) }
}

/// The five trainer sessions of a team's short experiments, each connecting at its start time:
/// 10 to 25 minutes long, needing 1 to 5 workers.
fn sessions(starts: [f64; 5]) -> Vec<JobSpec> {
    vec![
        session("debug", starts[0], 1, 0.5, 15.0),
        session("finetune", starts[1], 1, 0.2, 25.0),
        session("sweep", starts[2], 2, 0.2, 20.0),
        session("train", starts[3], 2, 0.13, 20.0),
        session("eval", starts[4], 1, 0.25, 10.0),
    ]
}

/// A pipeline with `minWorkers: 0` and `idleAfter: 300 s` that the five sessions share, the first
/// one 10 minutes after the pipeline is created.
fn sessions_scenario(name: &str, description: &str, starts: [f64; 5]) -> Scenario {
    let mut s = base(name, description);
    s.jobs = sessions(starts);
    // The same step times throughout; the second phase starts when the first trainer connects,
    // so convergence is judged against no worker before it and one after.
    let steps = [0.5, 0.2, 0.2, 0.13, 0.25];
    s.phases = vec![phase(0.0, &steps), phase(starts[0], &steps)];
    s.config.min_workers = 0;
    s.config.idle_after_s = Some(300.0);
    s.max_duration_s = starts[4] + 3_600.0;
    s
}

/// The sessions an hour apart over four hours: 35 to 40 minutes of nobody between them.
fn bursty() -> Scenario {
    sessions_scenario(
        "bursty",
        "five trainer sessions of 10-25 min over 4 h with 35-40 min idle gaps; min_workers 0, idle after 300 s",
        [600.0, 3_600.0, 7_200.0, 10_800.0, 14_400.0],
    )
}

/// The same sessions spread over a six-hour working day, 80 minutes apart: 55 to 65 minutes of
/// nobody between them, as when each experiment is followed by reading its results.
fn workday() -> Scenario {
    sessions_scenario(
        "workday",
        "the bursty sessions spread over a 6 h working day, 55-65 min idle gaps; min_workers 0, idle after 300 s",
        [600.0, 5_400.0, 10_200.0, 15_000.0, 19_800.0],
    )
}

fn phase(start_s: f64, step_seconds: &[f64]) -> Phase {
    Phase { start_s, step_seconds: step_seconds.to_vec(), host_idle_cores: Vec::new() }
}

fn stage(name: &str, ms_per_element: f64) -> StageSpec {
    StageSpec { name: name.to_string(), cpu_seconds_per_batch: ms_per_element / 1000.0 * f64::from(BATCH) }
}

/// The common base: one job of two consumers at 0.13 s per step (15.4 batches/s, oracle 5), one
/// worker running, 15 s start-up, 3% noise.
fn base(name: &str, description: &str) -> Scenario {
    Scenario {
        name: name.to_string(),
        description: description.to_string(),
        jobs: vec![job("train", 2, 20_000)],
        phases: vec![phase(0.0, &[0.13])],
        stages: vec![
            stage("image.decode", 6.0),
            stage("image.random_resized_crop", 2.0),
            stage("image.normalize", 1.0),
        ],
        finish_cpu_seconds_per_batch: 0.0,
        image_cpu_seconds_per_batch: 0.0,
        elements_per_batch: BATCH,
        cores_per_worker: 8,
        startup_delay_s: 15.0,
        buffer_parts_per_worker: 8,
        prefetch_batches: 4,
        noise: 0.03,
        seed: 7,
        initial_workers: 1,
        config: PoolConfig {
            min_workers: 1,
            max_workers: 16,
            elements_per_batch: BATCH,
            worker_cost_per_hour: None,
            trainer_cost_per_hour: None,
            idle_after_s: None,
        },
        tick_s: 1.0,
        policy_period_s: 5.0,
        max_duration_s: 20_000.0,
    }
}

/// One job at 0.146 s a step whose trainers' hosts have `idle` idle cores, `busy` from 600 s
/// to 1,200 s (a colocated job took the rest), then `idle` again.
fn busy_hosts(idle: f64, busy: f64) -> Vec<Phase> {
    [(0.0, idle), (600.0, busy), (1_200.0, idle)]
        .into_iter()
        .map(|(start, idle)| Phase { host_idle_cores: vec![idle], ..phase(start, &[0.146]) })
        .collect()
}

/// One job of two consumers at 0.146 s per step (13.7 batches/s) whose finishing (2 ms per
/// element: the final normalization and layout of a larger output) runs on the trainers' hosts
/// while they have room: 6 idle cores each, then 1 from 600 s to 1,200 s (a colocated job took
/// them), then 6 again. Each client needs 3.51 cores to finish its 6.85 batches/s, so placement
/// moves the work to the workers while the hosts are busy, and the pool needs a worker more
/// (`D/r` 3.51 → 4.38 → 3.51, each clear of a whole number by more than the noise).
fn trainer_hosts() -> Scenario {
    let mut s = base(
        "trainer-hosts",
        "13.7 batches/s; the trainers' hosts finish tensors while idle, are busy 600-1200 s and the workers take it (oracle 4 → 5 → 4)",
    );
    s.stages.retain(|stage| stage.name != "image.normalize");
    s.finish_cpu_seconds_per_batch = 2.0 / 1000.0 * f64::from(BATCH);
    s.jobs[0].batches = 24_000;
    s.phases = busy_hosts(6.0, 1.0);
    s
}

/// The job of `trainer-hosts` (13.7 batches/s, 1,753 elements/s a consumer) whose hosts can
/// also make its images: the workers read and plan each element (0.5 ms), the decode and crop
/// (8 ms) run wherever placement of the image run puts them, and the finishing is the final
/// normalization (1 ms). Hosts with 7 idle cores keep 1.75 for the normalization and settle on
/// 0.30 of the images (4.25 cores of 14: what leaves them 1 idle core), then 3 from 600 s to
/// 1,200 s (room for the normalization only), then 7 again. `D/r` 2.66 → 3.73 → 2.66.
fn image_hosts() -> Scenario {
    let mut s = base(
        "image-hosts",
        "13.7 batches/s; the trainers' hosts make a share of the images while they have idle cores, fewer 600-1200 s (oracle 3 → 4 → 3)",
    );
    s.stages =
        vec![stage("files.read", 0.5), stage("image.decode", 6.0), stage("image.random_resized_crop", 2.0)];
    s.finish_cpu_seconds_per_batch = 1.0 / 1000.0 * f64::from(BATCH);
    s.image_cpu_seconds_per_batch = 8.0 / 1000.0 * f64::from(BATCH);
    s.jobs[0].batches = 24_000;
    s.phases = busy_hosts(7.0, 3.0);
    s
}

/// Every scenario, in report order.
pub fn all() -> Vec<Scenario> {
    let steady = base("steady", "one job, constant demand of 15.4 batches/s (oracle 5)");

    let mut double = base("demand-double", "demand doubles at 600 s: 7.7 → 15.4 batches/s (oracle 3 → 5)");
    double.jobs[0].batches = 15_500;
    double.phases = vec![phase(0.0, &[0.26]), phase(600.0, &[0.13])];

    let mut half = base("demand-half", "demand halves at 600 s: 18.2 → 9.1 batches/s (oracle 6 → 3)");
    half.jobs[0].batches = 19_000;
    half.phases = vec![phase(0.0, &[0.11]), phase(600.0, &[0.22])];

    let mut noisy = base("noisy", "steady demand with ±20% noise on every metric");
    noisy.noise = 0.2;

    let mut slow = base("slow-start", "steady demand, workers take 120 s to start");
    slow.startup_delay_s = 120.0;

    let mut two = base("two-jobs", "two jobs share the pool: 10 + 5 batches/s (oracle 5)");
    two.jobs = vec![job("a", 2, 13_000), job("b", 1, 6_500)];
    two.phases = vec![phase(0.0, &[0.2, 0.2])];

    let mut compute = base("compute-bound", "slow trainer, 2 batches/s, starting with 4 workers (oracle 1)");
    compute.jobs[0] = job("train", 1, 2_400);
    compute.phases = vec![phase(0.0, &[0.5])];
    compute.initial_workers = 4;

    let mut above = base("above-max", "demand of 20 batches/s needs 6 workers, max_workers is 4 (oracle 4)");
    above.phases = vec![phase(0.0, &[0.1])];
    above.config.max_workers = 4;

    let mut cost = base(
        "cost-aware",
        "14.4 batches/s needs 4.15 workers; at $1/h per worker and $2/h per trainer the 5th does not pay (oracle 4)",
    );
    cost.jobs[0] = job("train", 1, 20_000);
    cost.phases = vec![phase(0.0, &[1.0 / 14.4])];
    cost.config.worker_cost_per_hour = Some(1.0);
    cost.config.trainer_cost_per_hour = Some(2.0);

    vec![
        steady,
        double,
        half,
        noisy,
        slow,
        two,
        compute,
        above,
        cost,
        bursty(),
        workday(),
        trainer_hosts(),
        image_hosts(),
    ]
}

/// Names of all scenarios.
pub fn names() -> Vec<String> {
    all().into_iter().map(|s| s.name).collect()
}

/// The scenario called `name`.
pub fn named(name: &str) -> Result<Scenario, Error> {
    all()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::UnknownScenario(name.to_string(), names().join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_counts_are_meaningful() {
        let oracle: Vec<(String, Vec<u32>)> = all()
            .iter()
            .map(|s| (s.name.clone(), (0..s.phases.len()).map(|p| s.phase_oracle(p)).collect()))
            .collect();
        let expect = [
            ("steady", vec![5]),
            ("demand-double", vec![3, 5]),
            ("demand-half", vec![6, 3]),
            ("noisy", vec![5]),
            ("slow-start", vec![5]),
            ("two-jobs", vec![5]),
            ("compute-bound", vec![1]),
            ("above-max", vec![4]),
            ("cost-aware", vec![4]),
            ("bursty", vec![0, 1]),
            ("workday", vec![0, 1]),
            ("trainer-hosts", vec![4, 5, 4]),
            ("image-hosts", vec![3, 4, 3]),
        ];
        let expect: Vec<(String, Vec<u32>)> = expect.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        assert_eq!(oracle, expect);
    }

    #[test]
    fn lookup_by_name() {
        assert!(named("steady").is_ok());
        assert!(named("nope").is_err());
    }
}
