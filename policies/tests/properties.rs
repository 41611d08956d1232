//! Properties every policy keeps on arbitrary input, and Granary's stability under noise.

use granary_policies::placement::Place;
use granary_policies::{
    ConsumerMetrics, DecisionKind, JobMetrics, JobMode, Observation, PolicyKind, PoolConfig, ScaleToZero,
    StageTime, WorkerMetrics,
};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Finite values including zeros and extremes.
fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(f64::MIN_POSITIVE),
        Just(1e-300),
        Just(1e300),
        Just(f64::MAX),
        Just(-1.0),
        0.0..1e6f64,
        0.0..10.0f64,
    ]
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), 0..64u32]
}

fn worker() -> impl Strategy<Value = WorkerMetrics> {
    (value(), value(), value(), value(), count(), count(), value(), count(), value()).prop_map(
        |(eps, bps, bytes, spe, buffered, capacity, cpu, cores, finish)| WorkerMetrics {
            elements_per_second: eps,
            batches_per_second: bps,
            bytes_per_second: bytes,
            stages: vec![StageTime { stage: "s".into(), seconds_per_element: spe }],
            buffered_parts: buffered,
            buffer_capacity: capacity,
            active_leases: 1,
            cpu_cores_used: cpu,
            cores: cores % 256,
            finish_seconds_per_element: finish,
        },
    )
}

fn consumer() -> impl Strategy<Value = ConsumerMetrics> {
    (value(), value(), count(), count(), any::<u64>(), value(), prop::option::of(value()), value()).prop_map(
        |(step, wait, buffered, prefetch, total, bps, idle, finish)| ConsumerMetrics {
            consumer_index: 0,
            step_seconds: step,
            wait_seconds: wait,
            buffered_batches: buffered,
            prefetch_batches: prefetch,
            batches_total: total,
            batches_per_second: bps,
            host_idle_cores: idle,
            finish_cores: finish,
        },
    )
}

fn job() -> impl Strategy<Value = JobMetrics> {
    let image_share = prop_oneof![Just(0.0), 0.0..=1.0f64, Just(f64::NAN)];
    (
        prop::collection::vec(consumer(), 0..4),
        any::<bool>(),
        count(),
        any::<u64>(),
        any::<bool>(),
        image_share,
    )
        .prop_map(|(consumers, replicated, epoch, per_epoch, on_workers, image_share)| JobMetrics {
            name: "j".into(),
            mode: if replicated { JobMode::Replicated } else { JobMode::Distributed },
            epoch,
            batches_per_epoch: per_epoch,
            consumers,
            finishing: if on_workers { Place::Workers } else { Place::Client },
            image_share,
        })
}

fn config() -> impl Strategy<Value = PoolConfig> {
    (
        0..20u32,
        prop_oneof![0..40u32, Just(u32::MAX - 20)],
        count(),
        prop::option::of(value()),
        prop::option::of(value()),
    )
        .prop_map(|(min, span, b, w, t)| PoolConfig {
            min_workers: min,
            max_workers: min + span,
            elements_per_batch: b,
            worker_cost_per_hour: w,
            trainer_cost_per_hour: t,
            idle_after_s: None,
        })
}

fn observation() -> impl Strategy<Value = Observation> {
    (
        -1e12..1e12f64,
        count(),
        count(),
        prop::collection::vec(worker(), 0..6),
        prop::collection::vec(job(), 0..3),
        config(),
    )
        .prop_map(|(now_s, running, desired, workers, jobs, config)| Observation {
            now_s,
            running_workers: running,
            desired_workers: desired,
            workers,
            jobs,
            config,
        })
}

/// Runs Granary for 200 evaluations from `start` workers on the observations `observe(i, count)`
/// gives (with the running and desired counts set to the current count) and returns the
/// evaluations at which it reversed direction.
fn reversals(start: u32, mut observe: impl FnMut(usize, u32) -> Observation) -> Vec<usize> {
    let mut policy = PolicyKind::Granary.build();
    let mut count = start;
    let mut last_direction: Option<DecisionKind> = None;
    let mut reversals = Vec::new();
    for i in 0..200usize {
        let mut obs = observe(i, count);
        obs.running_workers = count;
        obs.desired_workers = count;
        let d = policy.observe(&obs);
        if d.is_change() {
            if last_direction.is_some_and(|k| k != d.kind) {
                reversals.push(i);
            }
            last_direction = Some(d.kind);
            count = d.target;
        }
    }
    reversals
}

proptest! {
    #[test]
    fn decisions_stay_within_bounds(seq in prop::collection::vec(observation(), 1..25), closed_loop in any::<bool>()) {
        for kind in PolicyKind::ALL {
            let mut policy = kind.build();
            let mut last: Option<u32> = None;
            for (i, obs) in seq.iter().enumerate() {
                let mut obs = obs.clone();
                if closed_loop {
                    obs.now_s = 5.0 * i as f64;
                    if let Some(t) = last {
                        obs.desired_workers = t;
                        obs.running_workers = t;
                    }
                }
                let d = policy.observe(&obs);
                prop_assert!(d.target >= obs.config.lower() && d.target <= obs.config.upper(),
                    "{kind}: {} outside [{}, {}]: {}", d.target, obs.config.lower(), obs.config.upper(), d.reason);
                prop_assert!(!d.reason.is_empty());
                prop_assert_eq!(d.is_change(), d.target != obs.desired_workers);
                last = Some(d.target);
            }
        }
    }
}

/// Fixed underlying metrics, each reported with ±20% multiplicative noise.
#[derive(Clone, Debug)]
struct Stationary {
    consumers: u32,
    step: f64,
    wait_fraction: f64,
    rate: f64,
    capacity_factor: f64,
    fill: f64,
    min: u32,
    max: u32,
    start: u32,
    priced: bool,
    seed: u64,
}

fn stationary() -> impl Strategy<Value = Stationary> {
    (
        1..5u32,
        0.01..1.0f64,
        0.0..0.9f64,
        0.1..50.0f64,
        1.0..3.0f64,
        0.0..1.0f64,
        0..4u32,
        1..40u32,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(
            |(consumers, step, wait_fraction, rate, capacity_factor, fill, min, span, priced, seed)| {
                (min..=min + span).prop_map(move |start| Stationary {
                    consumers,
                    step,
                    wait_fraction,
                    rate,
                    capacity_factor,
                    fill,
                    min,
                    max: min + span,
                    start,
                    priced,
                    seed,
                })
            },
        )
}

impl Stationary {
    fn observe(&self, rng: &mut ChaCha8Rng, now_s: f64, workers: u32) -> Observation {
        let mut noise = || 0.8 + 0.4 * ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64);
        let b = 256.0;
        let worker = |n: &mut dyn FnMut() -> f64| WorkerMetrics {
            elements_per_second: self.rate * b * n(),
            batches_per_second: self.rate * n(),
            bytes_per_second: 0.0,
            stages: vec![StageTime {
                stage: "s".into(),
                seconds_per_element: 8.0 / (self.rate * self.capacity_factor) / b * n(),
            }],
            buffered_parts: (self.fill * 8.0 * n()).round().min(8.0) as u32,
            buffer_capacity: 8,
            active_leases: 1,
            cpu_cores_used: (8.0 / self.capacity_factor * n()).min(8.0),
            cores: 8,
            finish_seconds_per_element: 0.0,
        };
        let workers: Vec<WorkerMetrics> = (0..workers).map(|_| worker(&mut noise)).collect();
        let wait = self.step * self.wait_fraction / (1.0 - self.wait_fraction);
        let consumers = (0..self.consumers)
            .map(|i| ConsumerMetrics {
                consumer_index: i,
                step_seconds: self.step * noise(),
                wait_seconds: wait * noise(),
                buffered_batches: 2,
                batches_total: (now_s * 10.0) as u64,
                batches_per_second: 1.0 / (self.step + wait),
                ..Default::default()
            })
            .collect();
        let (w, t) = if self.priced { (Some(1.0), Some(2.0)) } else { (None, None) };
        Observation {
            now_s,
            running_workers: 0,
            desired_workers: 0,
            workers,
            jobs: vec![JobMetrics {
                name: "j".into(),
                batches_per_epoch: 1_000_000,
                consumers,
                ..Default::default()
            }],
            config: PoolConfig {
                min_workers: self.min,
                max_workers: self.max,
                elements_per_batch: 256,
                worker_cost_per_hour: w,
                trainer_cost_per_hour: t,
                idle_after_s: None,
            },
        }
    }
}

proptest! {
    #[test]
    fn granary_changes_direction_at_most_once_per_20_evaluations(s in stationary()) {
        let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
        let reversals = reversals(s.start, |i, count| s.observe(&mut rng, 5.0 * (i + 1) as f64, count));
        for pair in reversals.windows(2) {
            prop_assert!(pair[1] - pair[0] >= 20, "reversals at {:?}", reversals);
        }
    }
}

proptest! {
    /// Even input that swings between starved and idle every `period` evaluations cannot make
    /// Granary reverse more than once per 20 evaluations: the cooldown holds.
    #[test]
    fn granary_cooldown_holds_on_swinging_input(a in stationary(), b in stationary(), period in 1..30usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(a.seed ^ b.seed);
        let (mut starved, mut idle) = (a.clone(), b.clone());
        starved.wait_fraction = 0.5;
        starved.fill = 0.0;
        idle.wait_fraction = 0.0;
        idle.fill = 1.0;
        idle.step = starved.step * 8.0;
        idle.min = starved.min;
        idle.max = starved.max;
        idle.priced = starved.priced;
        let reversals = reversals(starved.start, |i, count| {
            let regime = if (i / period) % 2 == 0 { &starved } else { &idle };
            regime.observe(&mut rng, 5.0 * (i + 1) as f64, count)
        });
        for pair in reversals.windows(2) {
            prop_assert!(pair[1] - pair[0] >= 20, "reversals at {:?}", reversals);
        }
    }
}

/// Idle times including none, zero, negative and NaN.
fn idle_after() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        Just(Some(0.0)),
        Just(Some(-5.0)),
        Just(Some(f64::NAN)),
        (0.0..600.0f64).prop_map(Some)
    ]
}

proptest! {
    /// Under the scale-to-zero rule every policy stays within its bounds (zero allowed with
    /// `min_workers: 0` and an idle time, or once every job completed), explains itself, never
    /// leaves a pool at zero while a trainer is attached, and goes to zero only without one.
    #[test]
    fn scale_to_zero_keeps_the_bounds(
        seq in prop::collection::vec((observation(), any::<bool>()), 1..25),
        idle in idle_after(),
        zero_min in any::<bool>(),
    ) {
        for kind in PolicyKind::ALL {
            let mut policy = kind.build();
            let mut rule = ScaleToZero::new();
            let mut last: Option<u32> = None;
            for (i, (obs, completed)) in seq.iter().enumerate() {
                let mut obs = obs.clone();
                obs.now_s = 100.0 * i as f64;
                obs.config.idle_after_s = idle;
                if zero_min {
                    obs.config.min_workers = 0;
                }
                if let Some(t) = last {
                    obs.desired_workers = t;
                    obs.running_workers = t;
                }
                let d = rule.decide(policy.as_mut(), &obs, *completed);
                let attached = obs.consumer_count() > 0;
                let zero_ok = (obs.config.min_workers == 0 && idle.is_some_and(|s| !s.is_nan()))
                    || (*completed && !attached);
                let lower = if zero_ok { 0 } else { obs.config.lower() };
                prop_assert!(d.target >= lower && d.target <= obs.config.upper(),
                    "{kind}: {} outside [{lower}, {}]: {}", d.target, obs.config.upper(), d.reason);
                prop_assert!(!d.reason.is_empty());
                prop_assert_eq!(d.is_change(), d.target != obs.desired_workers);
                // Without an idle time the rule stands aside: a `min_workers` of 0 is then the
                // policy's own bound.
                if d.target == 0 && obs.config.upper() > 0 && obs.desired_workers > 0 && (zero_ok || obs.config.lower() > 0) {
                    prop_assert!(!attached, "{kind}: to zero with a trainer attached: {}", d.reason);
                }
                if attached && obs.config.upper() > 0 && (zero_ok || obs.config.lower() > 0) {
                    prop_assert!(d.target >= 1, "{kind}: a trainer is attached: {}", d.reason);
                }
                last = Some(d.target);
            }
        }
    }

    /// With `min_workers` of 1 or more, or no idle time, and no completed pool, the rule
    /// changes nothing.
    #[test]
    fn scale_to_zero_without_an_idle_time_changes_nothing(
        seq in prop::collection::vec(observation(), 1..25),
        idle in idle_after(),
    ) {
        for kind in PolicyKind::ALL {
            let (mut bare, mut wrapped) = (kind.build(), kind.build());
            let mut rule = ScaleToZero::new();
            for obs in &seq {
                let mut obs = obs.clone();
                obs.config.idle_after_s = idle;
                if obs.config.min_workers == 0 && idle.is_some_and(|s| !s.is_nan()) {
                    obs.config.min_workers = 1;
                }
                prop_assert_eq!(rule.decide(wrapped.as_mut(), &obs, false), bare.observe(&obs));
            }
        }
    }
}
