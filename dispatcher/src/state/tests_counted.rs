//! Pipelines whose split output counts are learnt as splits are computed (filters, packing):
//! count-first leases, partial plans, mismatches, and recovery from the journal.

use super::*;
use granary_proto::v1 as pb;

/// Four splits of 10 listed elements each, batch 4, counts unknown.
fn facts() -> PipelineFacts {
    PipelineFacts {
        manifest_json: "{}".into(),
        base_dir: "/".into(),
        counts: vec![10; 4],
        counts_known: false,
        batch: 4,
        epochs: 1,
        drop_remainder: false,
        shuffle: true,
        seed: 3,
        mixing: None,
    }
}

fn setup(consumers: u32) -> (State, String) {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts()).unwrap();
    for index in 0..consumers {
        let req = pb::RegisterClientRequest {
            pipeline: "p".into(),
            num_consumers: consumers,
            consumer_index: Some(index),
            wants_data: true,
            ..Default::default()
        };
        s.register_client(&req, 0).unwrap();
    }
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    let worker = s.register_worker(&req, 0).unwrap().0;
    (s, worker)
}

fn plan(s: &mut State, consumer: u32, from_slot: u64) -> pb::EpochPlan {
    let req = pb::GetEpochPlanRequest {
        pipeline: "p".into(),
        job: "p".into(),
        consumer_index: consumer,
        epoch: 0,
        from_slot,
    };
    s.epoch_plan(&req).unwrap()
}

fn done(lease: &pb::Lease, elements: u64) -> pb::CompleteSplitRequest {
    pb::CompleteSplitRequest {
        lease_id: lease.lease_id,
        pipeline: lease.pipeline.clone(),
        job: lease.job.clone(),
        epoch: lease.epoch,
        split: lease.split,
        elements,
        ..Default::default()
    }
}

/// Output counts by split id.
const COUNTS: [u64; 4] = [7, 3, 9, 5];

#[test]
fn splits_are_counted_first_and_routed_once_the_splits_before_them_are() {
    let (mut s, w) = setup(2);
    let leases: Vec<pb::Lease> = (0..4).map(|_| s.lease(&w, 0).unwrap().unwrap()).collect();
    assert!(leases.iter().all(|l| l.count_first && l.parts.is_empty()));
    assert!(plan(&mut s, 0, 0).partial);
    // Counted last to first: nothing can be routed until the first split in order is counted.
    for lease in leases[1..].iter().rev() {
        let parts = s.count_split(&w, lease.lease_id, COUNTS[lease.split as usize]).unwrap();
        assert_eq!(
            parts, None,
            "split {} was routed before the splits ahead of it were counted",
            lease.split
        );
    }
    let first = s.count_split(&w, leases[0].lease_id, COUNTS[leases[0].split as usize]).unwrap();
    assert!(first.is_some());
    // Now every count is known: every split routes, and the plan is complete.
    let mut routed = 0;
    for lease in &leases {
        let parts = s.count_split(&w, lease.lease_id, COUNTS[lease.split as usize]).unwrap().unwrap();
        routed += parts.iter().map(|p| p.hi - p.lo).sum::<u64>();
        s.complete(&super::tests::by_holder(&s, done(lease, COUNTS[lease.split as usize]))).unwrap();
    }
    assert_eq!(routed, COUNTS.iter().sum::<u64>());
    // 24 elements in batches of 4: 6 batches, 3 per consumer.
    let (a, b) = (plan(&mut s, 0, 0), plan(&mut s, 1, 0));
    assert!(!a.partial && !b.partial);
    assert_eq!((a.slots.len(), b.slots.len()), (3, 3));
    // A client extending its plan gets only the slots it lacks.
    let rest = plan(&mut s, 0, 2);
    assert_eq!(rest.slots.iter().map(|slot| slot.slot).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn a_split_counted_twice_differently_fails_the_pipeline() {
    let (mut s, w) = setup(1);
    let lease = s.lease(&w, 0).unwrap().unwrap();
    s.count_split(&w, lease.lease_id, 4).unwrap();
    let again = s.count_split(&w, lease.lease_id, 5);
    assert!(
        matches!(again, Err(DispatchError::FailedPrecondition(ref m)) if m.contains("decided differently"))
    );
    assert!(s.failure("p").is_some_and(|m| m.contains("yielded 5 elements, and 4")));
}

#[test]
fn a_count_from_a_worker_without_the_lease_is_refused() {
    let (mut s, w) = setup(1);
    let lease = s.lease(&w, 0).unwrap().unwrap();
    assert!(matches!(s.count_split("someone-else", lease.lease_id, 4), Err(DispatchError::NotFound(_))));
    assert!(matches!(s.count_split(&w, lease.lease_id + 100, 4), Err(DispatchError::NotFound(_))));
}

#[test]
fn a_replayed_split_is_leased_with_its_parts_once_counted() {
    let (mut s, w1) = setup(1);
    let leases: Vec<pb::Lease> = (0..4).map(|_| s.lease(&w1, 0).unwrap().unwrap()).collect();
    for lease in &leases {
        s.count_split(&w1, lease.lease_id, COUNTS[lease.split as usize]).unwrap();
    }
    // The worker dies before delivering anything: its splits come back, now with their parts.
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:2".into(), ..Default::default() };
    let w2 = s.register_worker(&req, 0).unwrap().0;
    let hb = pb::WorkerHeartbeatRequest { worker_id: w2.clone(), ..Default::default() };
    s.worker_heartbeat(&hb, 3000).unwrap();
    s.expire(5000);
    super::tests_demand::asking(&mut s, 5000);
    let again = s.lease(&w2, 5000).unwrap().unwrap();
    assert!(!again.count_first);
    assert_eq!(again.elements, COUNTS[again.split as usize]);
    assert_eq!(again.parts.iter().map(|p| p.hi - p.lo).sum::<u64>(), again.elements);
}

#[test]
fn learnt_counts_survive_a_restart() {
    let (mut s, w) = setup(1);
    let leases: Vec<pb::Lease> = (0..4).map(|_| s.lease(&w, 0).unwrap().unwrap()).collect();
    for lease in &leases[..2] {
        s.count_split(&w, lease.lease_id, COUNTS[lease.split as usize]).unwrap();
    }
    s.complete(&super::tests::by_holder(&s, done(&leases[0], COUNTS[leases[0].split as usize]))).unwrap();
    let mut events = std::mem::take(&mut s.events);
    assert!(events.iter().any(|e| matches!(e, Event::SplitCounted { .. })));
    // Replaying the journal, or a compacted snapshot of it, knows the same counts.
    for journal in [std::mem::take(&mut events), s.snapshot_events()] {
        let mut restarted = State::new(Timing::default(), 2);
        for event in &journal {
            restarted.apply(event);
        }
        let job = restarted.pipelines.get_mut("p").unwrap().jobs.get_mut("p").unwrap();
        let epoch = job.epoch(0);
        for lease in &leases[..2] {
            assert_eq!(epoch.plan.count(lease.split), Some(COUNTS[lease.split as usize]));
        }
        assert_eq!(epoch.plan.count(leases[2].split), None);
    }
}
