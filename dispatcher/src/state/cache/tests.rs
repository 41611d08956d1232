//! The autocacher's rules in the state machine: leases compute until the decision and carry its
//! cache tasks after it,
//! completions update entries, and the journal rebuilds all of it.

use crate::state::*;
use granary_policies::caching::Action;
use granary_proto::v1 as pb;

pub(super) const STORE: &str = "file:///tmp/granary-cache-test/";

pub(super) fn fp(n: u8) -> String {
    format!("{:064x}", u64::from(n) + 0xabc0)
}

pub(super) fn manifest(policy: &str) -> String {
    let at = if policy == "at" { r#","at":"small""# } else { "" };
    format!(
        r#"{{"spec":{{"stages":[{{"op":"image.decode"}},{{"op":"image.resize","name":"small"}},{{"op":"image.flip"}}],
            "scaling":{{"workerCostPerHour":0.5,"trainerCostPerHour":2.0}},
            "cache":{{"policy":"{policy}"{at},"store":"{STORE}","ttl":"1h"}}}}}}"#
    )
}

pub(super) fn facts(policy: &str, splits: usize, epochs: u32) -> PipelineFacts {
    PipelineFacts {
        manifest_json: manifest(policy),
        base_dir: "/".into(),
        counts: vec![10; splits],
        counts_known: true,
        batch: 5,
        epochs,
        drop_remainder: false,
        shuffle: true,
        seed: 1,
        mixing: None,
    }
}

pub(super) fn profile() -> pb::CacheProfile {
    let boundary = |index: u32, stage: &str| pb::CacheBoundary {
        index,
        stage: stage.into(),
        fingerprint: fp(index as u8),
        prefix_seconds_per_element: 0.001 * f64::from(index + 1),
        suffix_seconds_per_element: 0.001,
        bytes_per_element: 1000.0,
        encode_seconds_per_element: 0.0001,
        decode_seconds_per_element: 0.0001,
        source_fingerprints: Vec::new(),
    };
    pb::CacheProfile {
        compute_seconds_per_element: 0.004,
        cores: 4,
        read_bytes_per_second: 1e9,
        write_bytes_per_second: 5e8,
        boundaries: vec![boundary(0, "source"), boundary(1, "image.decode"), boundary(2, "small")],
        sampled_elements: 100,
        error: String::new(),
    }
}

/// A state with pipeline `name` (policy `at` unless told), one consumer and one worker.
pub(super) fn setup(s: &mut State, name: &str, policy: &str, splits: usize, epochs: u32) -> String {
    s.register_pipeline(name, facts(policy, splits, epochs)).unwrap();
    join(s, name);
    worker(s, name)
}

pub(super) fn join(s: &mut State, name: &str) {
    let req = pb::RegisterClientRequest {
        pipeline: name.into(),
        num_consumers: 1,
        consumer_index: Some(0),
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&req, 0).unwrap();
}

pub(super) fn worker(s: &mut State, name: &str) -> String {
    let req = pb::RegisterWorkerRequest {
        address: "127.0.0.1:1".into(),
        pipeline: name.into(),
        ..Default::default()
    };
    s.register_worker(&req, 0).unwrap().0
}

fn decide(s: &mut State, name: &str) -> Option<granary_policies::caching::CacheDecision> {
    let generation = s.pipeline_info(name).unwrap().generation;
    s.cache_profile(name, generation, profile(), BTreeMap::new(), 0).unwrap()
}

pub(super) fn mode(lease: &pb::Lease) -> pb::CacheMode {
    let task = lease.cache.as_ref().unwrap();
    pb::CacheMode::try_from(task.mode).unwrap()
}

pub(super) fn finish(s: &mut State, lease: &pb::Lease, outcome: pb::CacheOutcome) {
    let req = pb::CompleteSplitRequest { cache: Some(outcome), ..crate::state::tests::completion(lease) };
    s.complete(&crate::state::tests::by_holder(s, req)).unwrap();
}

pub(super) fn written(bytes: u64) -> pb::CacheOutcome {
    pb::CacheOutcome { bytes_written: bytes, written: true, ..Default::default() }
}

pub(super) fn read(bytes: u64) -> pb::CacheOutcome {
    pb::CacheOutcome { bytes_read: bytes, ..Default::default() }
}

/// Leases every split the worker gets now, completing each as `outcome` says.
pub(super) fn drain(
    s: &mut State,
    w: &str,
    now: u64,
    mut outcome: impl FnMut(&pb::Lease) -> pb::CacheOutcome,
) -> Vec<pb::Lease> {
    let mut got = Vec::new();
    while let Some(l) = s.lease(w, now).unwrap() {
        let o = outcome(&l);
        finish(s, &l, o);
        got.push(l);
    }
    got
}

/// Completes with what the task asks: written for a write, read for a read.
pub(super) fn as_asked(l: &pb::Lease) -> pb::CacheOutcome {
    match mode(l) {
        pb::CacheMode::Write => written(100 + l.split),
        pb::CacheMode::Read => read(100 + l.split),
        pb::CacheMode::Compute => pb::CacheOutcome::default(),
    }
}

#[test]
fn splits_compute_until_the_decision_and_write_after_it() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "at", 2, 1);
    assert!(s.pipeline_info("p").unwrap().cache_profile_wanted);
    // The epoch does not wait for the profile: the first split computes meanwhile.
    let early = s.lease(&w, 0).unwrap().unwrap();
    assert_eq!(mode(&early), pb::CacheMode::Compute);
    let d = decide(&mut s, "p").unwrap();
    assert_eq!(d.action, Action::Write { boundary: 2 });
    assert!(!s.pipeline_info("p").unwrap().cache_profile_wanted);
    let l = s.lease(&w, 1).unwrap().unwrap();
    assert_eq!(mode(&l), pb::CacheMode::Write);
    let task = l.cache.unwrap();
    assert_eq!((task.boundary, task.fingerprint), (2, fp(2)));
    // A second profile changes nothing.
    assert!(decide(&mut s, "p").is_none());
    // A pipeline that never caches is leased at once, with compute tasks.
    let mut t = State::new(Timing::default(), 1);
    let w = setup(&mut t, "p", "never", 2, 1);
    assert!(!t.pipeline_info("p").unwrap().cache_profile_wanted);
    assert_eq!(mode(&t.lease(&w, 0).unwrap().unwrap()), pb::CacheMode::Compute);
}

#[test]
fn a_failed_profile_computes_and_the_wait_ends_after_30_s() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 2, 1);
    let mut bad = profile();
    bad.error = "store unreachable".into();
    let d = s.cache_profile("p", 1, bad, BTreeMap::new(), 0).unwrap().unwrap();
    assert_eq!(d.action, Action::Compute);
    assert!(d.reason.contains("store unreachable"), "{}", d.reason);
    assert_eq!(mode(&s.lease(&w, 0).unwrap().unwrap()), pb::CacheMode::Compute);

    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "auto", 3, 1);
    s.expire(1000);
    assert_eq!(mode(&s.lease(&w, 1000).unwrap().unwrap()), pb::CacheMode::Compute);
    crate::state::tests_demand::asking(&mut s, 1000 + PROFILE_WAIT_MS - 1);
    assert_eq!(mode(&s.lease(&w, 1000 + PROFILE_WAIT_MS - 1).unwrap().unwrap()), pb::CacheMode::Compute);
    assert!(s.cache_report("p").unwrap().decision.is_none());
    let l = s.lease(&w, 1000 + PROFILE_WAIT_MS).unwrap().unwrap();
    assert_eq!(mode(&l), pb::CacheMode::Compute);
    let report = s.cache_report("p").unwrap();
    let reason = report.decision.unwrap().reason;
    assert!(reason.contains("no cache profile arrived within 30 s"), "{reason}");
    // A late profile is ignored.
    assert!(decide(&mut s, "p").is_none());
    // A stale generation is refused.
    assert!(matches!(
        s.cache_profile("p", 7, profile(), BTreeMap::new(), 0),
        Err(DispatchError::FailedPrecondition(_))
    ));
}

#[test]
fn splits_written_in_epoch_0_are_read_in_epoch_1() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "at", 3, 2);
    decide(&mut s, "p");
    let mut first = Vec::new();
    for _ in 0..3 {
        let l = s.lease(&w, 0).unwrap().unwrap();
        assert_eq!((l.epoch, mode(&l)), (0, pb::CacheMode::Write));
        finish(&mut s, &l, written(100 + l.split));
        first.push(l);
    }
    let second = drain(&mut s, &w, 0, as_asked);
    assert_eq!(second.len(), 3);
    assert!(second.iter().all(|l| l.epoch == 1 && mode(l) == pb::CacheMode::Read));

    let report = s.cache_report("p").unwrap();
    assert_eq!(report.policy, "at");
    assert_eq!(report.stage.as_deref(), Some("small"));
    assert_eq!(report.fingerprint, Some(fp(2)));
    let e: Vec<(u32, &str, u64, u64, u64, u64)> = report
        .epochs
        .iter()
        .map(|e| (e.epoch, e.mode.as_str(), e.splits_written, e.splits_read, e.bytes_written, e.bytes_read))
        .collect();
    assert_eq!(e, vec![(0, "write", 3, 0, 303, 0), (1, "read", 0, 3, 0, 303)]);
    let predicted = report.decision.unwrap().predicted;
    let close = |a: Option<f64>, b: Option<f64>| {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!((a - b).abs() < 1e-9 * b, "{a} vs {b}");
    };
    close(report.epochs[0].predicted_items_per_s, predicted.write_items_per_s);
    close(report.epochs[1].predicted_items_per_s, predicted.read_items_per_s);
}

#[test]
fn a_bad_split_is_never_read_again() {
    // Epoch by epoch: the consumer's moves open each next one.
    let mut s = State::new(Timing::one_epoch_ahead(), 1);
    let w = setup(&mut s, "p", "at", 2, 3);
    decide(&mut s, "p");
    for _ in 0..2 {
        let l = s.lease(&w, 0).unwrap().unwrap();
        finish(&mut s, &l, as_asked(&l));
    }
    // Epoch 1: split 0's entry turns out bad while reading; split 1 reads fine.
    let mut leases = Vec::new();
    while let Some(l) = s.lease(&w, 0).unwrap() {
        assert_eq!(mode(&l), pb::CacheMode::Read);
        let outcome = if l.split == 0 {
            pb::CacheOutcome {
                bad: true,
                recomputed: 7,
                problem: "crc mismatch".into(),
                ..Default::default()
            }
        } else {
            read(50)
        };
        finish(&mut s, &l, outcome);
        leases.push(l);
    }
    assert_eq!(leases.len(), 2);
    // Epoch 2 (the consumer moves on to epoch 1): split 0 computes, split 1 reads.
    let hb = pb::ClientHeartbeatRequest {
        client_id: s.pipelines["p"].jobs["p"].consumers[&0].client_id.clone(),
        pipeline: "p".into(),
        job: "p".into(),
        epoch: 1,
        ..Default::default()
    };
    s.client_heartbeat(&hb, 0).unwrap();
    let third = drain(&mut s, &w, 0, as_asked);
    let modes: BTreeMap<u64, pb::CacheMode> = third.iter().map(|l| (l.split, mode(l))).collect();
    assert_eq!(modes, BTreeMap::from([(0, pb::CacheMode::Compute), (1, pb::CacheMode::Read)]));
    let report = s.cache_report("p").unwrap();
    let e1 = &report.epochs[1];
    assert_eq!((e1.mode.as_str(), e1.splits_bad, e1.splits_read, e1.recomputed), ("read", 1, 1, 7));
    // Its prediction weighs the bad (recomputed) split as computing and the other as reading.
    let p = report.decision.unwrap().predicted;
    let expected = 2.0 / (1.0 / p.read_items_per_s.unwrap() + 1.0 / p.compute_items_per_s);
    let got = e1.predicted_items_per_s.unwrap();
    assert!((got - expected).abs() < 1e-9 * expected, "{got} vs {expected}");
}

#[test]
fn pipelines_with_the_same_entry_share_it() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "at", 3, 1);
    decide(&mut s, "p");
    // p writes splits while q decides: q sees p's complete splits and p's writes in progress.
    let a = s.lease(&w, 0).unwrap().unwrap();
    let b = s.lease(&w, 0).unwrap().unwrap();
    finish(&mut s, &a, written(10));
    let v = setup(&mut s, "q", "at", 3, 1);
    decide(&mut s, "q");
    let q: Vec<pb::Lease> = drain(&mut s, &v, 0, as_asked);
    let modes: BTreeMap<u64, pb::CacheMode> = q.iter().map(|l| (l.split, mode(l))).collect();
    assert_eq!(modes[&a.split], pb::CacheMode::Read);
    assert_eq!(modes[&b.split], pb::CacheMode::Compute, "b is being written by p");
    // Never two writers of one split: the third split went to whoever came first.
    let c = s.lease(&w, 0).unwrap().unwrap();
    let writers = usize::from(mode(&c) == pb::CacheMode::Write)
        + q.iter().filter(|l| l.split == c.split && mode(l) == pb::CacheMode::Write).count();
    assert_eq!(writers, 1);

    // A pipeline that finds the whole entry complete reads it and writes nothing.
    finish(&mut s, &b, written(10));
    finish(&mut s, &c, as_asked(&c));
    let u = setup(&mut s, "r", "at", 3, 1);
    let existing = BTreeMap::from([(fp(2), s.cache_entries[&(STORE.to_string(), fp(2))].complete.clone())]);
    let d = s.cache_profile("r", 1, profile(), existing, 0).unwrap().unwrap();
    assert_eq!(d.action, Action::Read { boundary: 2 });
    let r = drain(&mut s, &u, 0, as_asked);
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|l| mode(l) == pb::CacheMode::Read));
    // Each pipeline touches the entry once, when it starts reading it.
    let touches = s.take_cache_touches();
    assert_eq!(touches, vec![(STORE.to_string(), fp(2)); 3]);
}

#[test]
fn a_lost_writer_frees_its_split() {
    let mut s = State::new(Timing::default(), 1);
    let w1 = setup(&mut s, "p", "at", 1, 1);
    decide(&mut s, "p");
    let lost = s.lease(&w1, 0).unwrap().unwrap();
    assert_eq!(mode(&lost), pb::CacheMode::Write);
    let w2 = worker(&mut s, "p");
    let hb = pb::WorkerHeartbeatRequest { worker_id: w2.clone(), ..Default::default() };
    s.worker_heartbeat(&hb, 3000).unwrap();
    s.expire(5000);
    crate::state::tests_demand::asking(&mut s, 5000);
    let again = s.lease(&w2, 5000).unwrap().unwrap();
    assert_eq!((again.split, mode(&again)), (lost.split, pb::CacheMode::Write));
    // Returned unfinished: the next lease writes it again.
    s.give_back(&w2, again.lease_id, None).unwrap();
    let third = s.lease(&w2, 5000).unwrap().unwrap();
    assert_eq!(mode(&third), pb::CacheMode::Write);
}

#[test]
fn the_journal_rebuilds_entries_and_decisions() {
    let mut s = State::new(Timing::default(), 1);
    let w = setup(&mut s, "p", "at", 3, 2);
    decide(&mut s, "p");
    drain(&mut s, &w, 0, |l| {
        if l.epoch == 1 && l.split == 2 {
            pb::CacheOutcome { bad: true, ..Default::default() }
        } else {
            as_asked(l)
        }
    });
    let events = s.take_events();
    assert!(events.iter().any(|e| matches!(e, Event::CacheDecided { .. })));
    assert!(events.iter().any(|e| matches!(e, Event::CacheSplitBad { split: 2, .. })));
    // Through JSON, as the journal stores them.
    let json = serde_json::to_string(&events).unwrap();
    let events: Vec<Event> = serde_json::from_str(&json).unwrap();
    let mut t = State::new(Timing::default(), 2);
    for e in &events {
        t.apply(e);
    }
    assert_eq!(t.cache_entries, s.cache_entries);
    assert_eq!(t.pipelines["p"].cache.decision, s.pipelines["p"].cache.decision);
    assert_eq!(t.snapshot_events(), s.snapshot_events());
    let key = (STORE.to_string(), fp(2));
    assert_eq!(t.cache_entries[&key].complete.len(), 2);
    assert!(t.cache_entries[&key].bad.contains(&2));
    // Compaction replays to the same state.
    let mut u = State::new(Timing::default(), 3);
    for e in &s.snapshot_events() {
        u.apply(e);
    }
    assert_eq!(u.cache_entries, s.cache_entries);
    // Eviction is journaled and replayed too.
    s.cache_evicted(STORE, &fp(2));
    for e in &s.take_events() {
        u.apply(e);
    }
    assert!(u.cache_entries.is_empty());
    assert!(!u.pipeline_info("p").unwrap().cache_profile_wanted);
}

#[test]
fn eviction_sees_stores_budgets_and_entries_in_use() {
    let mut s = State::new(Timing::default(), 1);
    setup(&mut s, "p", "at", 1, 1);
    assert!(!s.caching());
    decide(&mut s, "p");
    assert!(s.caching());
    let stores = s.cache_stores();
    assert_eq!(stores.len(), 1);
    assert_eq!(stores[0].url, STORE);
    assert_eq!(stores[0].ttl_s, Some(3600));
    assert_eq!(stores[0].in_use, BTreeSet::from([fp(2)]));
    // Once its consumer finished, the entry may go.
    let hb = pb::ClientHeartbeatRequest {
        client_id: s.pipelines["p"].jobs["p"].consumers[&0].client_id.clone(),
        pipeline: "p".into(),
        job: "p".into(),
        epoch: 1,
        finished: true,
        ..Default::default()
    };
    s.client_heartbeat(&hb, 0).unwrap();
    assert!(s.cache_stores()[0].in_use.is_empty());
}
