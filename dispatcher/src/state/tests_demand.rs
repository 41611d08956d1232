//! Demand-driven leasing ([`super::demand`]): the workers produce for the jobs whose consumers
//! ask for data or read, and never for jobs joined by clients that do not read. The clock is
//! data: each call gets its `now`.

use super::*;
use granary_proto::v1 as pb;

pub(super) fn setup(splits: usize) -> (State, String) {
    setup_epochs(splits, 1)
}

/// A pipeline of `epochs` epochs of `splits` splits, leased one epoch ahead whatever their size,
/// and a worker.
fn setup_epochs(splits: usize, epochs: u32) -> (State, String) {
    let mut s = State::new(Timing::one_epoch_ahead(), 1);
    let facts = PipelineFacts {
        manifest_json: "{}".into(),
        base_dir: "/".into(),
        counts: vec![10; splits],
        counts_known: true,
        batch: 5,
        epochs,
        drop_remainder: false,
        shuffle: false,
        seed: 1,
        mixing: None,
    };
    s.register_pipeline("p", facts).unwrap();
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    let w = s.register_worker(&req, 0).unwrap().0;
    (s, w)
}

/// Joins `job`; `wants_data` as a registration says it.
fn join_asking(s: &mut State, job: &str, wants_data: bool, now: u64) -> pb::RegisterClientResponse {
    let req =
        pb::RegisterClientRequest { pipeline: "p".into(), job: job.into(), wants_data, ..Default::default() };
    s.register_client(&req, now).unwrap()
}

/// Joins `job` as the clients do: reading at once.
pub(super) fn join(s: &mut State, job: &str, now: u64) -> pb::RegisterClientResponse {
    join_asking(s, job, true, now)
}

fn beat(s: &mut State, c: &pb::RegisterClientResponse, delivered: u64, wants_data: bool, now: u64) {
    let req = pb::ClientHeartbeatRequest {
        client_id: c.client_id.clone(),
        pipeline: "p".into(),
        job: c.job.clone(),
        delivered,
        wants_data,
        ..Default::default()
    };
    s.client_heartbeat(&req, now).unwrap();
}

#[test]
fn clients_that_join_and_never_read_get_no_splits_and_a_reading_trainer_gets_all() {
    let (mut s, w) = setup(40);
    let trainer = join(&mut s, "train", 0);
    // Half of the idle clients said at registration that they read, and then that they do not;
    // the other half never said it.
    let bogus: Vec<_> = (0..50).map(|i| join_asking(&mut s, &format!("bogus-{i}"), i % 2 == 0, 0)).collect();
    for b in bogus.iter().step_by(2) {
        beat(&mut s, b, 0, false, 1);
    }
    beat(&mut s, &trainer, 0, true, 1);
    for _ in 0..20 {
        let lease = s.lease(&w, 2).unwrap().expect("the trainer's job has splits to produce");
        assert_eq!(lease.job, "train", "a job nobody reads is not produced for");
    }
    let asking: Vec<&String> = s.pipelines["p"].asking.iter().collect();
    assert_eq!(asking, vec!["train"], "leasing looks no more at the jobs nobody asks of");
    // Once the trainer holds enough and stops reading, nothing is produced at all.
    beat(&mut s, &trainer, 4, false, 3);
    let stalled = 3 + 10 * u64::from(Timing::default().heartbeat_ms);
    assert!(s.lease(&w, stalled).unwrap().is_none());
}

#[test]
fn a_consumer_is_served_from_its_registration_while_it_asks_or_reads() {
    let (mut s, w) = setup(40);
    let hb = u64::from(Timing::default().heartbeat_ms);
    join_asking(&mut s, "idle", false, 0);
    assert!(s.lease(&w, 0).unwrap().is_none(), "a registration that does not ask is not served");
    let c = join(&mut s, "train", 0);
    assert!(s.lease(&w, 0).unwrap().is_some(), "a new consumer is served before its first heartbeat");
    assert!(s.lease(&w, 4 * hb).unwrap().is_none(), "a registration alone asks for a while only");
    beat(&mut s, &c, 0, true, 4 * hb);
    assert!(s.lease(&w, 4 * hb).unwrap().is_some(), "asking for data is served");
    assert!(s.lease(&w, 8 * hb).unwrap().is_none(), "a consumer that went silent is not");
    // Reading (its delivered count moves on) keeps it served for a while without asking.
    beat(&mut s, &c, 3, false, 10 * hb);
    assert!(s.lease(&w, 19 * hb).unwrap().is_some());
    assert!(s.lease(&w, 20 * hb).unwrap().is_none(), "a consumer that stopped reading is not served");
    beat(&mut s, &c, 3, true, 30 * hb);
    assert!(s.lease(&w, 30 * hb).unwrap().is_some(), "until it asks again");
}

#[test]
fn replays_for_a_resumed_consumer_are_served() {
    let (mut s, w) = setup(4);
    let c = join(&mut s, "train", 0);
    let lease = s.lease(&w, 0).unwrap().unwrap();
    beat(&mut s, &c, 0, false, 100);
    // The consumer resumes from nothing delivered: its registration asks for the replay.
    let resume = pb::ResumePoint { epoch: 0, delivered: vec![], plan_fingerprint: c.plan_fingerprint };
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        job: "train".into(),
        consumer_index: Some(0),
        resume: Some(resume),
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&req, 200).unwrap();
    let replay = s.lease(&w, 200).unwrap().unwrap();
    assert_eq!((replay.split, replay.only_consumer), (lease.split, Some(0)));
}

/// Every consumer of every job heartbeats at `now`, asking for data, at the position it reported:
/// what live trainers do while a test's clock jumps past their registration.
pub(super) fn asking(s: &mut State, now: u64) {
    let mut beats = Vec::new();
    for (pipeline, p) in &s.pipelines {
        for (job, j) in &p.jobs {
            for (index, c) in &j.consumers {
                beats.push(pb::ClientHeartbeatRequest {
                    client_id: c.client_id.clone(),
                    pipeline: pipeline.clone(),
                    job: job.clone(),
                    consumer_index: *index,
                    epoch: c.epoch,
                    delivered: c.delivered,
                    finished: c.finished,
                    wants_data: true,
                    ..Default::default()
                });
            }
        }
    }
    for beat in beats {
        s.client_heartbeat(&beat, now).unwrap();
    }
}

#[test]
fn leasing_is_woken_when_a_consumer_asks_or_moves_to_a_new_epoch_or_a_split_goes_back() {
    let (mut s, w) = setup_epochs(2, 3);
    s.take_leasable();
    let trainer = join(&mut s, "train", 0);
    assert!(s.take_leasable(), "a registration that asks for data");
    let idle = join_asking(&mut s, "idle", false, 0);
    beat(&mut s, &idle, 0, false, 1);
    assert!(!s.take_leasable(), "a client that neither asks nor moves on");
    // Epochs 0 and 1 are leasable (one ahead of the consumer); epoch 2 is not yet.
    let leases: Vec<_> =
        (0..4).map(|i| s.lease(&w, 2 + i).unwrap().expect("a split of epochs 0 and 1")).collect();
    assert!(s.lease(&w, 10).unwrap().is_none());
    s.give_back(&w, leases[0].lease_id, None).unwrap();
    assert!(s.take_leasable(), "a split given back");
    assert!(s.lease(&w, 11).unwrap().is_some());
    let moved = pb::ClientHeartbeatRequest {
        client_id: trainer.client_id.clone(),
        pipeline: "p".into(),
        job: trainer.job.clone(),
        epoch: 1,
        wants_data: true,
        ..Default::default()
    };
    s.client_heartbeat(&moved, 12).unwrap();
    assert!(s.take_leasable(), "the consumer moved to a new epoch");
    assert_eq!(s.lease(&w, 13).unwrap().map(|l| l.epoch), Some(2));
    beat(&mut s, &idle, 0, false, 14);
    assert!(!s.take_leasable());
}
