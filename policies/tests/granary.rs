//! The Granary policy on hand-made observations.

mod fixtures;

use fixtures::Pool;
use granary_policies::placement::Place;
use granary_policies::{Decision, DecisionKind, GranaryPolicy, JobMetrics, Observation, Policy};

/// Feeds `pool` every 5 s from `from_s` until the policy changes the target (at most `limit`
/// evaluations); returns that decision and the holds before it.
fn until_change(
    policy: &mut GranaryPolicy,
    pool: &Pool,
    from_s: f64,
    limit: u32,
) -> (Option<Decision>, Vec<Decision>) {
    let mut holds = Vec::new();
    for i in 0..limit {
        let d = policy.observe(&pool.clone().at(from_s + 5.0 * f64::from(i)).observation());
        if d.is_change() {
            return (Some(d), holds);
        }
        holds.push(d);
    }
    (None, holds)
}

#[test]
fn scales_to_the_model_count_in_one_decision() {
    let mut p = GranaryPolicy::default();
    let (d, holds) = until_change(&mut p, &Pool::starved(), 5.0, 10);
    let d = d.expect("a decision");
    // 20 batches/s × 1.02 headroom / 3.5 per worker = 5.83 → 6.
    assert_eq!((d.target, d.kind), (6, DecisionKind::ScaleUp));
    assert!(holds.iter().all(|h| h.reason.contains("collecting")), "{holds:?}");
    for part in
        ["trainers wait 50% of each step", "3 workers make 10.5 batches/s", "demand is 20.0/s", "→ 6 workers"]
    {
        assert!(d.reason.contains(part), "{part:?} not in {:?}", d.reason);
    }
}

#[test]
fn trainer_hosts_with_idle_cores_count_as_capacity() {
    // The starved pool's job defers 2 ms an element of finishing (0.512 CPU-s a batch of 256);
    // its workers spend 8 / 3.5 = 2.29 CPU-s a batch now. Each of its two trainers receives
    // 5 batches/s and would take 10 at the demand: 5.12 cores of finishing per host.
    let scale = |pool: Pool| {
        let mut p = GranaryPolicy::default();
        let (d, _) = until_change(&mut p, &pool, 5.0, 10);
        d.expect("a decision")
    };
    // The clients finish, and their hosts keep room at the demand: the measured rate stands.
    let d = scale(Pool::starved().finishing(0.002, Place::Client, Some(8.0)));
    assert_eq!(d.target, 6, "{}", d.reason);
    assert!(d.reason.contains("trainer hosts finish `train` tensors on their idle cores"), "{}", d.reason);
    // Hosts with half a core idle cannot: the workers will finish, at 2.80 CPU-s a batch
    // (2.86 batches/s each): 20 × 1.02 / 2.86 = 7.1 → 8.
    let d = scale(Pool::starved().finishing(0.002, Place::Client, Some(0.5)));
    assert_eq!(d.target, 8, "{}", d.reason);
    assert!(d.reason.contains("trainer hosts lack the idle cores to finish `train` tensors"), "{}", d.reason);
    // The workers finish now, within the measured 3.5 batches/s; idle hosts will take it back,
    // leaving 1.77 CPU-s a batch (4.5 batches/s each): 20.4 / 4.5 = 4.5 → 5.
    let d = scale(Pool::starved().finishing(0.002, Place::Workers, Some(8.0)));
    assert_eq!(d.target, 5, "{}", d.reason);
    // Busy hosts leave it on the workers: the measured rate stands, as without finishing.
    let d = scale(Pool::starved().finishing(0.002, Place::Workers, Some(0.5)));
    assert_eq!(d.target, 6, "{}", d.reason);
    let d = scale(Pool::starved());
    assert_eq!(d.target, 6);
    assert!(!d.reason.contains("trainer hosts"), "nothing deferred: {}", d.reason);
}

#[test]
fn holds_while_new_workers_start() {
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &Pool::starved(), 5.0, 10);
    assert_eq!(d.map(|d| d.target), Some(6));
    let d = p.observe(&Pool::starved().workers(3, 6).at(20.0).observation());
    assert_eq!(d.kind, DecisionKind::Hold);
    assert!(d.reason.contains("waiting for 3 of 6 workers to start"), "{}", d.reason);
}

#[test]
fn respects_max_workers() {
    let mut p = GranaryPolicy::default();
    let pool = Pool::starved().bounds(1, 4);
    let (d, _) = until_change(&mut p, &pool, 5.0, 10);
    assert_eq!(d.map(|d| d.target), Some(4));
    let d = p.observe(&pool.clone().workers(4, 4).at(100.0).observation());
    assert_eq!(d.target, 4);
    assert!(d.reason.contains("max_workers is 4"), "{}", d.reason);
}

#[test]
fn out_of_bounds_desired_is_corrected_first() {
    let mut p = GranaryPolicy::default();
    let d = p.observe(&Pool::starved().workers(9, 9).bounds(2, 5).observation());
    assert_eq!((d.target, d.kind), (5, DecisionKind::ScaleDown));
    assert!(d.reason.contains("above max_workers"), "{}", d.reason);
}

#[test]
fn scales_down_only_when_trainers_never_wait_and_buffers_are_full() {
    let mut ample = Pool::ample(10);
    ample.capacity = 4.0;
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &ample, 5.0, 20);
    // 20 × 1.02 / 4 = 5.1 → 6, and 6 at the high end of the noise band.
    let d = d.expect("a scale-down");
    assert_eq!((d.target, d.kind), (6, DecisionKind::ScaleDown));
    assert!(d.reason.contains("never wait"), "{}", d.reason);

    // Half-full buffers and no stage times to tell how busy the workers are: no evidence.
    let mut half_full = ample.clone();
    half_full.fill = 0.6;
    half_full.stage_times = false;
    let mut p = GranaryPolicy::default();
    let (d, holds) = until_change(&mut p, &half_full, 5.0, 40);
    assert!(d.is_none(), "{d:?}");
    assert!(holds.last().is_some_and(|h| h.reason.contains("would do, but")), "{holds:?}");
}

#[test]
fn idle_workers_are_evidence_too_when_the_backlog_is_not_in_their_buffers() {
    // The consumers' transport and client buffers hold the backlog, so worker queues look
    // empty; the workers compute only half of the time.
    let mut idle = Pool::ample(10);
    idle.capacity = 4.0;
    idle.fill = 0.0;
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &idle, 5.0, 20);
    let d = d.expect("a scale-down");
    assert_eq!((d.target, d.kind), (6, DecisionKind::ScaleDown));
    assert!(d.reason.contains("busy 50% of the time"), "{}", d.reason);
}

#[test]
fn does_not_reverse_within_the_cooldown() {
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &Pool::starved(), 5.0, 10);
    let up_at = 15.0;
    assert_eq!(d.map(|d| d.target), Some(6));
    // Demand falls to a quarter right after: the model wants 2, the cooldown says no.
    let mut low = Pool::ample(6);
    low.step = 0.4;
    low.capacity = 3.5;
    let (d, holds) = until_change(&mut p, &low, up_at + 5.0, 60);
    let d = d.expect("a scale-down after the cooldown");
    assert_eq!(d.kind, DecisionKind::ScaleDown);
    assert!(holds.iter().any(|h| h.reason.contains("cooldown")), "{holds:?}");
    assert!(holds.len() >= 20, "reversed after {} evaluations", holds.len());
}

#[test]
fn feedback_adds_workers_when_trainers_keep_waiting() {
    // Stage times promise 5 batches/s per worker and buffers are not draining, yet the trainers
    // wait 20% of each step: the model is wrong somewhere, so trust the trainers.
    let mut pool = Pool::ample(5);
    pool.capacity = 5.0;
    pool.rate = 3.2;
    pool.fill = 0.9;
    pool.wait = 0.025;
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &pool, 5.0, 20);
    let d = d.expect("feedback");
    // ceil(5 / (1 − 0.2)) = 7.
    assert_eq!((d.target, d.kind), (7, DecisionKind::ScaleUp));
    assert!(d.reason.contains("trainers still wait 20%"), "{}", d.reason);
}

#[test]
fn cost_weighting_stops_before_the_last_partial_worker() {
    let mut pool = Pool::starved();
    pool.consumers = 1;
    pool.step = 1.0 / 14.4;
    pool.rate = 3.47;
    pool.capacity = 3.47;
    pool.config.worker_cost_per_hour = Some(1.0);
    pool.config.trainer_cost_per_hour = Some(2.0);
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &pool, 5.0, 10);
    let d = d.expect("a decision");
    assert_eq!(d.target, 4, "{}", d.reason);
    assert!(d.reason.contains("one more worker, $1.00/h"), "{}", d.reason);
    // Without prices the same pool needs 5.
    pool.config.worker_cost_per_hour = None;
    let mut p = GranaryPolicy::default();
    assert_eq!(until_change(&mut p, &pool, 5.0, 10).0.map(|d| d.target), Some(5));
}

fn two_jobs(now_s: f64) -> Observation {
    let mut pool = Pool::starved();
    pool.step = 0.2;
    let mut obs = pool.at(now_s).observation();
    let mut second: JobMetrics = obs.jobs[0].clone();
    second.name = "eval".into();
    second.consumers.truncate(1);
    obs.jobs.push(second);
    obs
}

#[test]
fn jobs_sharing_a_pool_add_their_demand() {
    let mut p = GranaryPolicy::default();
    let decisions: Vec<Decision> = (1..=3).map(|i| p.observe(&two_jobs(5.0 * f64::from(i)))).collect();
    // 2/0.2 + 1/0.2 = 15 batches/s × 1.02 / 3.5 = 4.37 → 5.
    assert_eq!(decisions[2].target, 5, "{decisions:?}");
    assert!(decisions[2].reason.contains("demand is 15.0/s"), "{}", decisions[2].reason);
}

#[test]
fn starts_a_worker_for_connected_consumers() {
    let mut p = GranaryPolicy::default();
    let d = p.observe(&Pool::starved().workers(0, 0).bounds(0, 8).observation());
    assert_eq!((d.target, d.kind), (1, DecisionKind::ScaleUp));
}

#[test]
fn same_observations_same_decisions() {
    let run = || {
        let mut p = GranaryPolicy::default();
        let mut out = Vec::new();
        for i in 1..=30 {
            let pool = if i < 10 { Pool::starved() } else { Pool::ample(6) };
            out.push(p.observe(&pool.at(5.0 * f64::from(i)).observation()));
        }
        out
    };
    assert_eq!(run(), run());
}

#[test]
fn scales_to_the_minimum_when_every_consumer_left() {
    let mut gone = Pool::ample(5).bounds(2, 16);
    gone.consumers = 0;
    let mut p = GranaryPolicy::default();
    let (d, _) = until_change(&mut p, &gone, 5.0, 20);
    let d = d.expect("a scale-down");
    assert_eq!((d.target, d.kind), (2, DecisionKind::ScaleDown), "{}", d.reason);
}
