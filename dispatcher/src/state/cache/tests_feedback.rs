//! The closed loop in the state machine: each finished epoch's measured time against the
//! prediction, a re-decision when it is off by more than 25%, none when it is within or the spec
//! forces the policy, and never a read of an incomplete entry. The clock is the `now` of lease
//! requests: an epoch runs from its first grant to the first request after its last completion.

use super::tests::{STORE, finish, fp, mode, setup, written};
use super::{Chosen, decided_compute};
use crate::state::*;
use granary_policies::caching::Action;
use granary_proto::v1 as pb;

/// The profile, taken under load: computing (4 cores of 1 worker, 4 ms of CPU per
/// element: 1000 elements/s) and writing `small` then reading it predict about the same (no
/// gain). `cpu` scales the CPU time of the whole pipeline.
fn loaded_profile(cpu: f64) -> pb::CacheProfile {
    pb::CacheProfile {
        compute_seconds_per_element: 0.004 * cpu,
        cores: 4,
        read_bytes_per_second: 2e6,
        write_bytes_per_second: 2e6,
        boundaries: vec![pb::CacheBoundary {
            index: 2,
            stage: "small".into(),
            fingerprint: fp(2),
            prefix_seconds_per_element: 0.003,
            suffix_seconds_per_element: 0.0008,
            bytes_per_element: 1000.0,
            encode_seconds_per_element: 0.0001,
            decode_seconds_per_element: 0.0002,
            source_fingerprints: Vec::new(),
        }],
        sampled_elements: 100,
        error: String::new(),
    }
}

fn decide_with(s: &mut State, name: &str, profile: pb::CacheProfile) -> Action {
    let generation = s.pipeline_info(name).unwrap().generation;
    s.cache_profile(name, generation, profile, BTreeMap::new(), 0).unwrap().unwrap().action
}

/// Leases the 3 splits of epoch 0 at time 0 and completes each as `outcome` says.
fn run_epoch_0(
    s: &mut State,
    w: &str,
    mut outcome: impl FnMut(&pb::Lease) -> pb::CacheOutcome,
) -> Vec<pb::Lease> {
    let leases: Vec<pb::Lease> = (0..3).map(|_| s.lease(w, 0).unwrap().unwrap()).collect();
    assert!(leases.iter().all(|l| l.epoch == 0));
    for l in &leases {
        let o = outcome(l);
        finish(s, l, o);
    }
    leases
}

/// The first lease request at `now` (the boundary's tick), with the consumer asking.
fn lease_at(s: &mut State, w: &str, now: u64) -> pb::Lease {
    crate::state::tests_demand::asking(s, now);
    s.lease(w, now).unwrap().unwrap()
}

fn decided(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e, Event::CacheDecided { .. })).count()
}

#[test]
fn a_computing_epoch_three_times_slower_than_predicted_re_decides_to_write() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(1.0)), Action::Compute);
    let reason = s.cache_report("p").unwrap().decision.unwrap().reason;
    assert!(reason.contains("no gain"), "{reason}");
    let epoch_0 = run_epoch_0(&mut s, &w, |_| pb::CacheOutcome::default());
    assert!(epoch_0.iter().all(|l| mode(l) == pb::CacheMode::Compute));
    s.take_events();
    // 30 elements predicted at 1000/s (0.03 s) took 0.09 s.
    let next = lease_at(&mut s, &w, 90);
    assert_eq!((next.epoch, mode(&next)), (1, pb::CacheMode::Write), "epoch 1 writes at once");
    assert_eq!(decided(&s.take_events()), 1, "the re-decision is journaled");

    let report = s.cache_report("p").unwrap();
    let decision = report.decision.as_ref().unwrap();
    assert_eq!(decision.action, Action::Write { boundary: 2 });
    let text =
        "epoch 0: predicted 0.03 s computing, measured 0.09 s (+200%): re-deciding → write `small` (cut 2)";
    assert!(decision.reason.starts_with(text), "{}", decision.reason);
    assert_eq!(report.last_check.as_deref(), Some(text));
    assert_eq!(report.redecisions, 1);
    let check = &report.checks[0];
    assert_eq!((check.epoch, check.action.as_str(), check.verdict.as_str()), (0, "compute", "re-decided"));
    assert_eq!(check.elements, 30);
    assert!((check.predicted_seconds - 0.03).abs() < 1e-9 && (check.measured_seconds - 0.09).abs() < 1e-9);
    let e0 = &report.epochs[0];
    assert!((e0.predicted_items_per_s.unwrap() - 1000.0).abs() < 1e-6);
    assert!((e0.measured_items_per_s.unwrap() - 1000.0 / 3.0).abs() < 1e-6);
    assert_eq!(report.state(), "writing");
    // The figures stay corrected: the next decision's compute rate is the measured one.
    let corrected = decision.predicted.compute_items_per_s;
    assert!((corrected - 1000.0 / 3.0).abs() < 1e-6, "{corrected}");
}

#[test]
fn a_prediction_within_25_percent_changes_nothing() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(1.0)), Action::Compute);
    run_epoch_0(&mut s, &w, |_| pb::CacheOutcome::default());
    let before = s.pipelines["p"].cache.decision.clone();
    s.take_events();
    // 0.036 s against 0.03 s: +20%.
    let next = lease_at(&mut s, &w, 36);
    assert_eq!((next.epoch, mode(&next)), (1, pb::CacheMode::Compute));
    assert_eq!(decided(&s.take_events()), 0);
    assert_eq!(s.pipelines["p"].cache.decision, before);
    let report = s.cache_report("p").unwrap();
    assert_eq!(report.redecisions, 0);
    assert_eq!(report.checks[0].verdict, "within");
    let text = report.last_check.unwrap();
    assert!(
        text.starts_with("epoch 0: predicted 0.03 s computing, measured 0.04 s (+20%): within 25%"),
        "{text}"
    );
    assert!(s.pipelines["p"].cache.corrections.is_identity());
}

#[test]
fn a_policy_forced_by_the_spec_is_checked_but_never_re_decided() {
    // `policy: at` writes `small` although the profile sees no gain; its epoch takes 10 times
    // the prediction.
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "at", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(1.0)), Action::Write { boundary: 2 });
    run_epoch_0(&mut s, &w, |l| written(100 + l.split));
    let before = s.pipelines["p"].cache.decision.clone();
    s.take_events();
    let next = lease_at(&mut s, &w, 480);
    assert_eq!((next.epoch, mode(&next)), (1, pb::CacheMode::Read));
    assert_eq!(decided(&s.take_events()), 0);
    assert_eq!(s.pipelines["p"].cache.decision, before);
    let check = &s.cache_report("p").unwrap().checks[0];
    assert_eq!((check.action.as_str(), check.verdict.as_str()), ("write", "held"));
    assert!(check.text.contains("(+900%): `policy: at` is set by the spec"), "{}", check.text);

    // `policy: never` has no decision, so nothing to check.
    let mut t = State::new(Timing::default(), 1);
    let w = setup(&mut t, "q", "never", 3, 3);
    run_epoch_0(&mut t, &w, |_| pb::CacheOutcome::default());
    lease_at(&mut t, &w, 480);
    let report = t.cache_report("q").unwrap();
    assert!(report.checks.is_empty() && report.decision.is_none());
}

#[test]
fn the_loop_never_reads_an_incomplete_entry() {
    // Writing wins from the start (computing takes 3 times the CPU); one split's write fails, so
    // the entry misses it when epoch 0 turns out far slower than predicted.
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(3.0)), Action::Write { boundary: 2 });
    let failed = run_epoch_0(&mut s, &w, |l| {
        if l.split == 1 {
            pb::CacheOutcome { problem: "store timeout".into(), ..Default::default() }
        } else {
            written(100)
        }
    });
    assert!(failed.iter().all(|l| mode(l) == pb::CacheMode::Write));
    let first = lease_at(&mut s, &w, 2000);
    let report = s.cache_report("p").unwrap();
    assert_eq!(report.checks[0].verdict, "re-decided", "{:?}", report.checks);
    assert_ne!(report.decision.as_ref().map(|d| d.action), Some(Action::Read { boundary: 2 }));
    // Epoch 1 reads only the complete splits and writes the missing one.
    let mut epoch_1 = vec![first];
    while let Some(l) = s.lease(&w, 2000).unwrap() {
        epoch_1.push(l);
    }
    let key = (STORE.to_string(), fp(2));
    for l in epoch_1.iter().filter(|l| l.epoch == 1) {
        let complete = s.cache_entries[&key].complete.contains_key(&l.split);
        let expected = if complete { pb::CacheMode::Read } else { pb::CacheMode::Write };
        assert_eq!(mode(l), expected, "split {}", l.split);
    }
    assert!(epoch_1.iter().any(|l| l.split == 1 && mode(l) == pb::CacheMode::Write));

    // A decision to read that entry (as a policy could make from stale figures) writes instead.
    let mut read = s.pipelines["p"].cache.decision.clone().unwrap();
    read.decision.action = Action::Read { boundary: 2 };
    s.never_read_incomplete("p", &mut read);
    assert_eq!(read.decision.action, Action::Write { boundary: 2 });
    assert!(read.decision.reason.ends_with("(the entry is not complete: its missing splits are written)"));
}

#[test]
fn an_entry_written_when_the_pipeline_re_decided_stays_until_the_write_ends() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(3.0)), Action::Write { boundary: 2 });
    let writing = s.lease(&w, 0).unwrap().unwrap();
    assert_eq!(mode(&writing), pb::CacheMode::Write);
    // The pipeline now computes (as after a re-decision); the write in flight keeps its entry.
    let compute = Chosen::compute(decided_compute("computing".into(), 1000.0), 1);
    s.pipelines.get_mut("p").unwrap().cache.decision = Some(compute);
    assert!(s.cache_stores()[0].in_use.contains(&fp(2)));
    finish(&mut s, &writing, written(100));
    assert!(s.cache_stores()[0].in_use.is_empty());
}

#[test]
fn a_slow_epoch_is_not_blamed_on_the_pipeline_while_the_consumers_set_the_pace() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 3);
    assert_eq!(decide_with(&mut s, "p", loaded_profile(1.0)), Action::Compute);
    run_epoch_0(&mut s, &w, |_| pb::CacheOutcome::default());
    // The worker's queues are full: the trainer reads slower than the pipeline produces.
    let metrics = pb::WorkerMetrics { buffered_parts: 19, buffer_capacity: 20, ..Default::default() };
    let hb =
        pb::WorkerHeartbeatRequest { worker_id: w.clone(), metrics: Some(metrics), ..Default::default() };
    s.worker_heartbeat(&hb, 50).unwrap();
    let next = lease_at(&mut s, &w, 90);
    assert_eq!(mode(&next), pb::CacheMode::Compute);
    let check = &s.cache_report("p").unwrap().checks[0];
    assert_eq!(check.verdict, "held");
    assert!(check.text.contains("(+200%): the consumers set the pace"), "{}", check.text);
    assert!(s.pipelines["p"].cache.corrections.is_identity());
}
