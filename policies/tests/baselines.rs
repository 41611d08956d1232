//! The baselines follow their published rules.

mod fixtures;

use fixtures::Pool;
use granary_policies::cachew::CachewPolicy;
use granary_policies::hpa::HpaPolicy;
use granary_policies::{DecisionKind, Policy};

/// One consumer whose batch rate is `min(2 × workers, 7)` batches/s; workers start at once.
/// Returns every change as (batches consumed when it happened, new target).
fn cachew_run(epoch_after: u64) -> (Vec<(u64, u32)>, Vec<String>) {
    cachew_run_with(epoch_after, |_, _| {})
}

/// [`cachew_run`], with `change` applied to the pool before each report (by its number).
fn cachew_run_with(epoch_after: u64, change: impl Fn(u32, &mut Pool)) -> (Vec<(u64, u32)>, Vec<String>) {
    let mut p = CachewPolicy::default();
    let mut pool = Pool::starved().workers(1, 1);
    pool.consumers = 1;
    let mut batches = 0.0;
    let mut changes = Vec::new();
    let mut reasons = Vec::new();
    for i in 1..=2000 {
        change(i, &mut pool);
        let n = f64::from(pool.desired);
        let per_s = (2.0 * n).min(7.0);
        batches += 5.0 * per_s;
        pool.batches_total = batches as u64;
        pool.epoch = u32::from(pool.batches_total >= epoch_after);
        pool.step = 1.0 / per_s;
        pool.wait = 0.0;
        let d = p.observe(&pool.clone().at(5.0 * f64::from(i)).observation());
        reasons.push(d.reason.clone());
        if d.is_change() {
            changes.push((pool.batches_total, d.target));
            pool = pool.workers(d.target, d.target);
        }
    }
    (changes, reasons)
}

#[test]
fn cachew_adds_one_worker_per_report_and_steps_back_at_the_knee() {
    let (changes, reasons) = cachew_run(u64::MAX);
    let targets: Vec<u32> = changes.iter().map(|c| c.1).collect();
    // 2 → 4 batches/s: +50%; 4 → 6: +33%; 6 → 7: +14%; 7 → 7: 0% (knee: back to 4).
    assert_eq!(targets, vec![2, 3, 4, 5, 4]);
    // The first report needs 200 warm-up + 500 batches, each later one 150 + 500.
    assert!(changes[0].0 >= 700, "{changes:?}");
    for w in changes.windows(2) {
        assert!(w[1].0 - w[0].0 >= 650, "{changes:?}");
    }
    assert!(reasons.iter().any(|r| r.contains("knee")));
}

#[test]
fn cachew_reads_the_result_queue_as_a_share_of_the_clients_prefetch() {
    // Converged with the clients' buffers half full; from report 400 on, they hold twice as many
    // batches. A client that doubled its depth (its trainer emptied a full buffer) holds them at
    // the same share: nothing changes. At the same depth the queue grew 2×: a worker goes.
    let half_full = |pool: &mut Pool| pool.fill = 0.5;
    let (deeper, _) = cachew_run_with(u64::MAX, |i, pool| {
        half_full(pool);
        if i >= 400 {
            pool.prefetch = 8;
        }
    });
    let (fuller, reasons) = cachew_run_with(u64::MAX, |i, pool| {
        pool.fill = if i >= 400 { 1.0 } else { 0.5 };
    });
    let targets = |changes: &[(u64, u32)]| changes.iter().map(|c| c.1).collect::<Vec<_>>();
    assert_eq!(targets(&deeper), vec![2, 3, 4, 5, 4], "a deeper prefetch is not a longer queue");
    assert_eq!(&targets(&fuller)[..6], &[2, 3, 4, 5, 4, 3], "{fuller:?}");
    assert!(reasons.iter().any(|r| r.contains("result queue grew 2.0×")), "{reasons:?}");
}

#[test]
fn cachew_scales_only_in_the_first_epoch() {
    let (changes, reasons) = cachew_run(1_000);
    assert_eq!(changes.iter().map(|c| c.1).collect::<Vec<_>>(), vec![2]);
    assert!(reasons.last().is_some_and(|r| r.contains("only in epoch 0")), "{:?}", reasons.last());
}

/// `running` workers each at `util` of their cores, `desired` asked for.
fn cpu(running: u32, desired: u32, util: f64, now_s: f64) -> granary_policies::Observation {
    let mut obs = Pool::starved().workers(running, desired).bounds(1, 64).at(now_s).observation();
    for w in &mut obs.workers {
        w.cpu_cores_used = util * f64::from(w.cores);
    }
    obs
}

#[test]
fn hpa_scales_to_ceil_of_count_times_utilization_over_target() {
    let mut hpa = HpaPolicy::default();
    let d = hpa.observe(&cpu(4, 4, 1.0, 0.0));
    assert_eq!((d.target, d.kind), (5, DecisionKind::ScaleUp), "{}", d.reason);
    let mut hpa = HpaPolicy::default();
    let d = hpa.observe(&cpu(4, 4, 0.85, 0.0));
    assert_eq!(d.kind, DecisionKind::Hold, "within the 10% tolerance: {}", d.reason);
}

#[test]
fn hpa_waits_for_the_stabilization_window_before_scaling_down() {
    let mut hpa = HpaPolicy::default();
    assert!(!hpa.observe(&cpu(6, 6, 0.8, 0.0)).is_change());
    let mut t = 15.0;
    while t <= 300.0 {
        let d = hpa.observe(&cpu(6, 6, 0.4, t));
        assert!(!d.is_change(), "at {t}: {}", d.reason);
        t += 15.0;
    }
    let d = hpa.observe(&cpu(6, 6, 0.4, 315.0));
    assert_eq!((d.target, d.kind), (3, DecisionKind::ScaleDown), "{}", d.reason);
}

#[test]
fn hpa_counts_starting_workers_as_idle_when_scaling_up() {
    let mut hpa = HpaPolicy::default();
    // 3 of 6 report at 100%: with the 3 missing at 0% the mean is 50%, below target: no change.
    let d = hpa.observe(&cpu(3, 6, 1.0, 0.0));
    assert_eq!(d.kind, DecisionKind::Hold, "{}", d.reason);
}

#[test]
fn hpa_limits_a_scale_up_to_four_pods_or_double() {
    let mut hpa = HpaPolicy::default();
    let mut obs = cpu(2, 2, 1.0, 0.0);
    for w in &mut obs.workers {
        w.cpu_cores_used = 8.0;
    }
    obs.workers.iter_mut().for_each(|w| w.cores = 1);
    let d = hpa.observe(&obs);
    // 800% of 80% → 20 pods wanted; at most max(4, 100% of 2) more per sync.
    assert_eq!(d.target, 6, "{}", d.reason);
}
