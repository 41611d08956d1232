//! Rules of the state machine, driven as the service drives them.

use super::*;
use granary_proto::v1 as pb;

fn facts(counts: Vec<u64>, batch: u64, epochs: u32) -> PipelineFacts {
    PipelineFacts {
        manifest_json: "{}".into(),
        base_dir: "/".into(),
        counts,
        counts_known: true,
        batch,
        epochs,
        drop_remainder: false,
        shuffle: true,
        seed: 1,
        mixing: None,
    }
}

fn client(state: &mut State, index: u32, k: u32, now: u64) -> pb::RegisterClientResponse {
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        num_consumers: k,
        consumer_index: Some(index),
        wants_data: true,
        ..Default::default()
    };
    state.register_client(&req, now).unwrap()
}

fn worker(state: &mut State, now: u64) -> String {
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    state.register_worker(&req, now).unwrap().0
}

/// The completion of `lease`, every element produced.
pub(super) fn completion(lease: &pb::Lease) -> pb::CompleteSplitRequest {
    pb::CompleteSplitRequest {
        lease_id: lease.lease_id,
        pipeline: lease.pipeline.clone(),
        job: lease.job.clone(),
        epoch: lease.epoch,
        split: lease.split,
        elements: lease.elements,
        ..Default::default()
    }
}

/// `req` sent by the worker that holds its lease.
pub(super) fn by_holder(state: &State, mut req: pb::CompleteSplitRequest) -> pb::CompleteSplitRequest {
    if let Some(held) = state.leases.get(&req.lease_id) {
        req.worker_id = held.worker.clone();
    }
    req
}

fn complete(state: &mut State, lease: &pb::Lease) {
    state.complete(&by_holder(state, completion(lease))).unwrap();
}

#[test]
fn leases_follow_the_seeded_order_and_stop_one_epoch_ahead() {
    let mut s = State::new(Timing::one_epoch_ahead(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 3)).unwrap();
    client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let mut got = Vec::new();
    while let Some(lease) = s.lease(&w, 0).unwrap() {
        got.push((lease.epoch, lease.split));
        complete(&mut s, &lease);
    }
    // Epochs 0 and 1 only: the consumer is still in epoch 0.
    assert_eq!(got.len(), 8);
    let order0: Vec<u64> = got.iter().filter(|g| g.0 == 0).map(|g| g.1).collect();
    assert_eq!(
        order0,
        PlanSettings {
            counts: vec![10; 4],
            counts_known: true,
            batch: 5,
            consumers: 1,
            mode: Mode::Distributed,
            drop_remainder: false,
            shuffle: true,
            seed: 1,
            mixing: None,
        }
        .order(0)
    );
}

#[test]
fn small_epochs_are_leased_as_many_ahead_as_hold_the_minimum_of_splits() {
    // Epochs of 8 splits: 4 of them hold 32, so epochs 0 to 4 are leasable while the consumer
    // is in epoch 0, and each epoch it moves on opens one more.
    assert_eq!(MIN_SPLITS_AHEAD, 32);
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 8], 5, 10)).unwrap();
    let c = client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let drain = |s: &mut State| {
        let mut epochs = Vec::new();
        while let Some(lease) = s.lease(&w, 0).unwrap() {
            epochs.push(lease.epoch);
            complete(s, &lease);
        }
        epochs
    };
    let first = drain(&mut s);
    assert_eq!(first.len(), 5 * 8);
    assert!(first.windows(2).all(|w| w[0] <= w[1]), "in epoch order: {first:?}");
    assert_eq!(first.last(), Some(&4));
    let moved = pb::ClientHeartbeatRequest {
        client_id: c.client_id.clone(),
        pipeline: "p".into(),
        job: c.job.clone(),
        epoch: 1,
        wants_data: true,
        ..Default::default()
    };
    s.client_heartbeat(&moved, 0).unwrap();
    assert_eq!(drain(&mut s), vec![5; 8]);
    // Epochs of the minimum or more are leased one ahead, as before.
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; MIN_SPLITS_AHEAD], 5, 10)).unwrap();
    client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let mut leased = 0;
    while let Some(lease) = s.lease(&w, 0).unwrap() {
        assert!(lease.epoch <= 1);
        leased += 1;
    }
    assert_eq!(leased, 2 * MIN_SPLITS_AHEAD);
}

#[test]
fn lease_outcomes_are_counted_per_pipeline() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let a = s.lease(&w, 0).unwrap().unwrap();
    let b = s.lease(&w, 0).unwrap().unwrap();
    complete(&mut s, &a);
    s.give_back(&w, b.lease_id, None).unwrap();
    assert_eq!(s.split_counts("p"), SplitCounts { leased: 2, completed: 1, requeued: 1 });
    // A silent worker's lease comes back too.
    let c = s.lease(&w, 0).unwrap().unwrap();
    s.expire(Timing::default().lease_ms + 1);
    assert!(!s.leases.contains_key(&c.lease_id));
    assert_eq!(s.split_counts("p"), SplitCounts { leased: 3, completed: 1, requeued: 2 });
    assert_eq!(s.split_counts("unknown"), SplitCounts::default());
}

#[test]
fn a_dead_workers_leases_come_back_first() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    client(&mut s, 0, 1, 0);
    let w1 = worker(&mut s, 0);
    let lost = s.lease(&w1, 0).unwrap().unwrap();
    let w2 = worker(&mut s, 0);
    // w2 keeps heartbeating, w1 goes silent.
    let hb = pb::WorkerHeartbeatRequest { worker_id: w2.clone(), ..Default::default() };
    s.worker_heartbeat(&hb, 3000).unwrap();
    s.expire(5000);
    assert!(!s.workers.contains_key(&w1));
    super::tests_demand::asking(&mut s, 5000);
    let again = s.lease(&w2, 5000).unwrap().unwrap();
    assert_eq!((again.epoch, again.split), (lost.epoch, lost.split));
    assert!(again.only_consumer.is_none());
    // The dead worker's late completion is not an error and changes nothing twice.
    complete(&mut s, &lost);
    complete(&mut s, &again);
}

#[test]
fn resume_replays_produced_splits_for_that_consumer_only() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    let first = client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let a = s.lease(&w, 0).unwrap().unwrap();
    complete(&mut s, &a);
    let resume = pb::ResumePoint { epoch: 0, delivered: vec![], plan_fingerprint: first.plan_fingerprint };
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        consumer_index: Some(0),
        num_consumers: 1,
        resume: Some(resume),
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&req, 10).unwrap();
    let replay = s.lease(&w, 10).unwrap().unwrap();
    assert_eq!((replay.split, replay.only_consumer), (a.split, Some(0)));
    // A stale session is told it was taken over.
    let hb = pb::ClientHeartbeatRequest {
        client_id: first.client_id,
        pipeline: "p".into(),
        job: "p".into(),
        ..Default::default()
    };
    assert!(matches!(s.client_heartbeat(&hb, 20), Err(DispatchError::FailedPrecondition(_))));
}

#[test]
fn a_late_heartbeat_does_not_move_a_consumer_back() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 2], 5, 2)).unwrap();
    let session = client(&mut s, 0, 1, 0);
    let beat = |epoch, delivered, finished| pb::ClientHeartbeatRequest {
        client_id: session.client_id.clone(),
        pipeline: "p".into(),
        job: "p".into(),
        epoch,
        delivered,
        finished,
        ..Default::default()
    };
    let seen = |s: &State| {
        let c = &s.pipelines["p"].jobs["p"].consumers[&0];
        (c.epoch, c.delivered, c.finished, c.last_seen)
    };
    s.client_heartbeat(&beat(1, 4, true), 10).unwrap();
    // The epoch-start heartbeat of epoch 1, sent before, arrives after.
    s.client_heartbeat(&beat(1, 0, false), 11).unwrap();
    assert_eq!(seen(&s), (1, 4, true, 11));
    s.client_heartbeat(&beat(0, 4, false), 12).unwrap();
    assert_eq!(seen(&s), (1, 4, true, 12));
}

#[test]
fn workers_hear_of_finished_consumers_as_gone() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 2], 5, 1)).unwrap();
    let first = client(&mut s, 0, 2, 0);
    client(&mut s, 1, 2, 0);
    let w = worker(&mut s, 0);
    // Workers hear of the consumers of the jobs they produce for.
    s.lease(&w, 0).unwrap().unwrap();
    let gone = |s: &mut State| {
        let beat = pb::WorkerHeartbeatRequest { worker_id: w.clone(), ..Default::default() };
        s.worker_heartbeat(&beat, 1).unwrap().gone.iter().map(|c| c.consumer_index).collect::<Vec<_>>()
    };
    assert!(gone(&mut s).is_empty());
    let finished = pb::ClientHeartbeatRequest {
        client_id: first.client_id.clone(),
        pipeline: "p".into(),
        job: "p".into(),
        epoch: 0,
        delivered: 2,
        finished: true,
        ..Default::default()
    };
    s.client_heartbeat(&finished, 1).unwrap();
    // Its queue on the workers is dropped; the other consumer still reads.
    assert_eq!(gone(&mut s), vec![0]);
}

#[test]
fn refusals_say_what_is_wrong() {
    let mut s = State::new(Timing::default(), 1);
    let req = pb::RegisterClientRequest { pipeline: "nope".into(), ..Default::default() };
    let e = s.register_client(&req, 0).unwrap_err();
    assert!(e.to_string().contains("no pipeline named `nope`"), "{e}");
    s.register_pipeline("p", facts(vec![3], 2, 1)).unwrap();
    client(&mut s, 0, 2, 0);
    let req = pb::RegisterClientRequest { pipeline: "p".into(), num_consumers: 3, ..Default::default() };
    let e = s.register_client(&req, 0).unwrap_err();
    assert!(e.to_string().contains("has 2 consumers, not 3"), "{e}");
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        num_consumers: 2,
        consumer_index: Some(5),
        wants_data: true,
        ..Default::default()
    };
    assert!(matches!(s.register_client(&req, 0), Err(DispatchError::InvalidArgument(_))));
    let hb = pb::WorkerHeartbeatRequest { worker_id: "ghost".into(), ..Default::default() };
    assert!(matches!(s.worker_heartbeat(&hb, 0), Err(DispatchError::NotFound(_))));
}

#[test]
fn journal_events_rebuild_progress() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let a = s.lease(&w, 0).unwrap().unwrap();
    complete(&mut s, &a);
    let events = s.take_events();
    let mut t = State::new(Timing::default(), 2);
    for e in &events {
        t.apply(e);
    }
    assert_eq!(t.snapshot_events(), s.snapshot_events());
    client(&mut t, 0, 1, 0);
    let w = worker(&mut t, 0);
    let mut rest = Vec::new();
    let mut replays = Vec::new();
    while let Some(l) = t.lease(&w, 0).unwrap() {
        if l.only_consumer.is_some() {
            replays.push(l.split)
        } else {
            rest.push(l.split)
        }
        complete(&mut t, &l);
    }
    // The three splits not produced yet, and (since this consumer registered afresh, without a
    // position) the produced one again, for it alone.
    assert_eq!(rest.len(), 3);
    assert!(!rest.contains(&a.split));
    assert_eq!(replays, vec![a.split]);
}

#[test]
fn a_removed_pipeline_ends_its_leases_and_stays_removed_after_replay() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let a = s.lease(&w, 0).unwrap().unwrap();
    s.unregister_pipeline("p");
    s.unregister_pipeline("never-registered");
    assert!(s.pipeline_names().is_empty());
    assert!(s.leases.is_empty());
    assert!(s.workers.values().all(|w| w.leases.is_empty()));
    assert!(s.complete(&by_holder(&s, completion(&a))).is_err(), "the lease ended with its pipeline");
    let mut t = State::new(Timing::default(), 2);
    for e in &s.take_events() {
        t.apply(e);
    }
    assert!(t.pipeline_names().is_empty());
    // Registered again, it starts over.
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    assert_eq!(s.progress("p").len(), 0);
}

#[test]
fn a_split_that_fails_three_times_fails_its_pipeline_with_the_cause() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 2], 5, 1)).unwrap();
    let c = client(&mut s, 0, 1, 0);
    let w = worker(&mut s, 0);
    let heartbeat = |s: &mut State| {
        let hb = pb::ClientHeartbeatRequest {
            client_id: c.client_id.clone(),
            pipeline: "p".into(),
            job: "p".into(),
            consumer_index: 0,
            ..Default::default()
        };
        s.client_heartbeat(&hb, 10).unwrap().failed
    };
    // Given back without a cause (a worker shutting down) does not count.
    let first = s.lease(&w, 0).unwrap().unwrap();
    s.give_back(&w, first.lease_id, None).unwrap();
    for attempt in 1..=3 {
        let lease = s.lease(&w, 0).unwrap().unwrap();
        assert_eq!(
            (lease.epoch, lease.split),
            (first.epoch, first.split),
            "the failed split comes back first"
        );
        assert!(s.failure("p").is_none(), "attempt {attempt}");
        assert!(heartbeat(&mut s).is_empty());
        s.give_back(&w, lease.lease_id, Some("spec.stages[1] (`python.map`) failed on element `a`: boom"))
            .unwrap();
    }
    let why = s.failure("p").unwrap();
    assert!(why.contains(&format!("split {} of epoch 0 failed 3 times", first.split)), "{why}");
    assert!(why.ends_with("failed on element `a`: boom"), "{why}");
    assert_eq!(heartbeat(&mut s), why, "the trainer learns it at its next heartbeat");
    assert!(s.lease(&w, 0).unwrap().is_none(), "a failed pipeline gets no more work");
}

#[test]
fn only_a_leases_holder_completes_it() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts(vec![10; 4], 5, 1)).unwrap();
    client(&mut s, 0, 1, 0);
    let holder = worker(&mut s, 0);
    let other = worker(&mut s, 0);
    let lease = s.lease(&holder, 0).unwrap().unwrap();
    let forged = pb::CompleteSplitRequest { worker_id: other.clone(), elements: 1, ..completion(&lease) };
    let error = s.complete(&forged).unwrap_err();
    assert!(matches!(error, DispatchError::PermissionDenied(_)), "{error}");
    assert!(s.leases.contains_key(&lease.lease_id), "the holder keeps its lease");
    assert!(s.failure("p").is_none(), "a wrong count from another worker fails nothing");
    complete(&mut s, &lease);
}

#[test]
fn registration_tells_the_client_the_largest_part_when_the_shape_is_static() {
    let mut f = facts(vec![4; 2], 2, 1);
    assert_eq!(f.max_part_bytes(), 0, "an unreadable manifest: unknown");
    let text = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
                source: {url: \"memory://data/\", format: files}\n  \
                stages: [{op: image.decode}, {op: image.center_crop, size: 32}]\n  batch: {size: 2}\n";
    let manifest = granary_crds::parse_manifest(text, std::path::Path::new("/"), &[]).unwrap();
    f.manifest_json = serde_json::to_string(&manifest.pipeline).unwrap();
    let bytes = f.max_part_bytes();
    assert!(bytes > 2 * 32 * 32 * 3 && bytes < 1 << 20, "{bytes}");
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", f).unwrap();
    assert_eq!(client(&mut s, 0, 1, 0).max_part_bytes, bytes);
}
