//! Bounded state: unread jobs are collected after the GC timeout (journaled), names and counts
//! are capped, and workers hear only of the consumers of the jobs they produce for. The clock is
//! data: each call gets its `now`.

use super::collect::UNPRODUCED_BATCH;
use super::*;
use granary_proto::v1 as pb;

const GC_MS: u64 = 60_000;

fn timing() -> Timing {
    Timing { job_gc_ms: GC_MS, ..Timing::default() }
}

fn facts() -> PipelineFacts {
    PipelineFacts {
        manifest_json: "{}".into(),
        base_dir: "/".into(),
        counts: vec![10; 4],
        counts_known: true,
        batch: 5,
        epochs: 1,
        drop_remainder: false,
        shuffle: false,
        seed: 1,
        mixing: None,
    }
}

fn setup() -> State {
    let mut s = State::new(timing(), 1);
    s.register_pipeline("p", facts()).unwrap();
    s.take_events();
    s
}

fn join(s: &mut State, job: &str, now: u64) -> Result<pb::RegisterClientResponse, DispatchError> {
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        job: job.into(),
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&req, now)
}

fn beat(s: &mut State, c: &pb::RegisterClientResponse, finished: bool, now: u64) {
    let req = pb::ClientHeartbeatRequest {
        client_id: c.client_id.clone(),
        pipeline: "p".into(),
        job: c.job.clone(),
        finished,
        ..Default::default()
    };
    s.client_heartbeat(&req, now).unwrap();
}

fn worker(s: &mut State, now: u64) -> String {
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    s.register_worker(&req, now).unwrap().0
}

fn jobs(s: &State) -> Vec<String> {
    s.progress("p").into_iter().map(|j| j.job).collect()
}

fn collected(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobCollected { job, .. } => Some(job.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_unread_job_is_collected_after_the_timeout_and_stays_collected_after_a_restart() {
    let mut s = setup();
    let journal = s.snapshot_events();
    let c = join(&mut s, "a", 0).unwrap();
    let w = worker(&mut s, 0);
    let lease = s.lease(&w, 0).unwrap().unwrap();
    beat(&mut s, &c, false, 30_000);
    let mut journal = [journal, s.take_events()].concat();
    // The trainer stops at 30 s: gone after the client timeout, collected GC_MS after its last
    // heartbeat, not before.
    for now in [35_000, 45_000, 30_000 + GC_MS] {
        s.renew(&w, &[lease.lease_id], now).unwrap();
        s.expire(now);
        assert_eq!(jobs(&s), vec!["a"], "at {now} ms");
    }
    s.expire(30_001 + GC_MS);
    assert!(jobs(&s).is_empty());
    let events = s.take_events();
    assert_eq!(collected(&events), vec!["a"]);
    assert!(s.leases.is_empty(), "the job's leases end with it");
    let revoked = s.renew(&w, &[lease.lease_id], 30_002 + GC_MS).unwrap();
    assert_eq!(revoked, vec![lease.lease_id], "its worker hears the lease was revoked");
    // Replaying the journal does not bring the job back.
    journal.extend(events);
    let mut t = State::new(timing(), 2);
    for e in &journal {
        t.apply(e);
    }
    assert!(jobs(&t).is_empty());
    assert_eq!(t.pipeline_names(), vec!["p"]);
}

#[test]
fn a_job_is_journaled_with_its_first_lease_and_one_never_leased_leaves_no_record() {
    let mut s = setup();
    let idle = join(&mut s, "idle", 0).unwrap();
    beat(&mut s, &idle, false, 1);
    let read = join(&mut s, "read", 1).unwrap();
    assert!(s.take_events().is_empty(), "joining writes nothing");
    assert!(!s.snapshot_events().iter().any(|e| matches!(e, Event::Job { .. })));
    let w = worker(&mut s, 1);
    let lease = s.lease(&w, 1).unwrap().unwrap();
    assert_eq!(lease.job, "read");
    let events = s.take_events();
    assert!(matches!(&events[..], [Event::Job { job, .. }] if job == "read"), "{events:?}");
    assert!(s.lease(&w, 1).unwrap().is_some());
    assert!(s.take_events().is_empty(), "the record is written once");
    // A restart from the journal knows the job that was leased, and not the idle one.
    let mut t = State::new(timing(), 2);
    for e in &s.snapshot_events() {
        t.apply(e);
    }
    assert_eq!(jobs(&t), vec!["read"]);
    // Collecting the idle job writes nothing either.
    beat(&mut s, &read, false, 2 + GC_MS);
    s.expire(2 + GC_MS);
    assert_eq!(jobs(&s), vec!["read"]);
    assert!(collected(&s.take_events()).is_empty());
}

#[test]
fn a_job_a_trainer_reads_is_never_collected() {
    let mut s = setup();
    let c = join(&mut s, "a", 0).unwrap();
    // Half an hour of heartbeats every 5 s, expiring at each.
    for step in 1..=360u64 {
        let now = step * 5_000;
        beat(&mut s, &c, false, now);
        s.expire(now);
    }
    assert_eq!(jobs(&s), vec!["a"]);
    assert!(collected(&s.take_events()).is_empty());
}

#[test]
fn a_pipeline_stays_completed_after_its_finished_jobs_are_collected_until_a_new_one_joins() {
    let mut s = setup();
    assert!(!s.completed("p"), "no job yet");
    let c = join(&mut s, "done", 0).unwrap();
    assert!(!s.completed("p"));
    beat(&mut s, &c, true, 1_000);
    assert!(s.completed("p"), "its one consumer finished");
    s.expire(1_001 + GC_MS);
    assert!(jobs(&s).is_empty() && s.completed("p"), "collected, and still complete");
    let c = join(&mut s, "next", 2_000 + GC_MS).unwrap();
    assert!(!s.completed("p"), "a new job is under way");
    // An unfinished job collected leaves the pipeline incomplete.
    s.expire(3_000 + 2 * GC_MS);
    assert!(jobs(&s).is_empty() && !s.completed("p"), "{:?}", c.job);
}

#[test]
fn a_finished_job_goes_once_its_trainers_stop_and_a_replayed_one_gets_a_full_timeout() {
    let mut s = setup();
    let c = join(&mut s, "done", 0).unwrap();
    beat(&mut s, &c, true, 1_000);
    s.expire(1_000 + GC_MS);
    assert_eq!(jobs(&s), vec!["done"], "heartbeats, even a finished trainer's, keep it");
    s.expire(1_001 + GC_MS);
    assert!(jobs(&s).is_empty(), "finished and silent for the GC timeout");
    // A restarted dispatcher knows the jobs but none of their trainers: it waits a full timeout
    // (from its own start) for them to come back.
    let mut s = setup();
    join(&mut s, "a", 0).unwrap();
    join(&mut s, "b", 0).unwrap();
    // A lease of each puts both jobs in the journal (see `Job::journaled`).
    let w = worker(&mut s, 0);
    let leased: Vec<String> = (0..2).filter_map(|_| s.lease(&w, 0).unwrap()).map(|l| l.job).collect();
    assert_eq!(leased, vec!["a", "b"]);
    let mut t = State::new(timing(), 2);
    for e in &s.snapshot_events() {
        t.apply(e);
    }
    let c = join(&mut t, "b", GC_MS / 2).unwrap();
    t.expire(GC_MS);
    assert_eq!(jobs(&t), vec!["a", "b"]);
    beat(&mut t, &c, false, GC_MS + 1);
    t.expire(GC_MS + 1);
    assert_eq!(jobs(&t), vec!["b"], "the job nobody claimed again goes");
}

#[test]
fn names_and_counts_are_capped_with_the_limit_and_the_fix_named() {
    let mut s = setup();
    let long = "j".repeat(MAX_JOB_NAME_BYTES + 1);
    let e = join(&mut s, &long, 0).unwrap_err();
    assert!(matches!(e, DispatchError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("at most 253"), "{e}");
    join(&mut s, &"j".repeat(MAX_JOB_NAME_BYTES), 0).unwrap();
    let e = join(&mut s, "a\u{0}b", 0).unwrap_err();
    assert!(e.to_string().contains("control characters"), "{e}");
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        num_consumers: MAX_CONSUMERS + 1,
        wants_data: true,
        ..Default::default()
    };
    let e = s.register_client(&req, 0).unwrap_err();
    assert!(e.to_string().contains("at most 4096"), "{e}");
    let e = s.register_pipeline(&"p".repeat(254), facts()).unwrap_err();
    assert!(e.to_string().contains("at most 253"), "{e}");
    // A replay request listing more splits than the plan has.
    let c = join(&mut s, "r", 0).unwrap();
    let req = pb::RequestReplayRequest {
        client_id: c.client_id.clone(),
        pipeline: "p".into(),
        job: "r".into(),
        splits: vec![0; 5],
        ..Default::default()
    };
    let e = s.request_replay(&req).unwrap_err();
    assert!(e.to_string().contains("each at most once"), "{e}");
}

#[test]
fn a_full_pipeline_refuses_new_jobs_until_one_is_unread() {
    let mut s = setup();
    let mut trainers = Vec::new();
    for i in 0..MAX_JOBS_PER_PIPELINE {
        trainers.push(join(&mut s, &format!("job-{i:04}"), i as u64).unwrap());
    }
    // Each job gets a split produced: every one has progress to keep.
    let w = worker(&mut s, 1_024);
    for _ in 0..MAX_JOBS_PER_PIPELINE {
        s.lease(&w, 1_024).unwrap().unwrap();
    }
    assert!(s.pipelines["p"].jobs.values().all(|j| j.journaled));
    let e = join(&mut s, "one-more", 2_000).unwrap_err();
    assert!(matches!(e, DispatchError::ResourceExhausted(_)), "{e:?}");
    assert!(e.to_string().contains("1024 jobs") && e.to_string().contains("share a job name"), "{e}");
    // Existing jobs still take their trainers back.
    let takeover = pb::RegisterClientRequest {
        pipeline: "p".into(),
        job: "job-0000".into(),
        consumer_index: Some(0),
        num_consumers: 1,
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&takeover, 2_000).unwrap();
    assert_eq!(jobs(&s).len(), MAX_JOBS_PER_PIPELINE);
    s.take_events();
    // Every trainer but the first two keeps reading; those two fall silent.
    let now = 20_000;
    for c in &trainers[2..] {
        beat(&mut s, c, false, now);
    }
    s.expire(now);
    join(&mut s, "one-more", now).unwrap();
    assert_eq!(collected(&s.take_events()), vec!["job-0001"], "the one idle longest makes room");
    join(&mut s, "two-more", now).unwrap();
    assert_eq!(collected(&s.take_events()), vec!["job-0000"]);
    let e = join(&mut s, "three-more", now).unwrap_err();
    assert!(matches!(e, DispatchError::ResourceExhausted(_)), "{e:?}");
    assert_eq!(jobs(&s).len(), MAX_JOBS_PER_PIPELINE);
}

#[test]
fn a_full_pipeline_makes_room_by_collecting_a_job_nothing_was_produced_for_and_nobody_asks_for() {
    let mut s = setup();
    let mut idle = Vec::new();
    for i in 0..MAX_JOBS_PER_PIPELINE {
        // Joined without asking for data, heartbeating without asking: never produced for.
        let req = pb::RegisterClientRequest {
            pipeline: "p".into(),
            job: format!("idle-{i:04}"),
            ..Default::default()
        };
        idle.push(s.register_client(&req, i as u64).unwrap());
    }
    for c in &idle[1..] {
        beat(&mut s, c, false, 2_000);
    }
    s.take_events();
    let trainer = join(&mut s, "train", 2_000).unwrap();
    let held = jobs(&s);
    assert_eq!(held.len(), MAX_JOBS_PER_PIPELINE - UNPRODUCED_BATCH + 1, "a batch of them makes room");
    let gone: Vec<String> = (0..UNPRODUCED_BATCH).map(|i| format!("idle-{i:04}")).collect();
    assert!(!held.iter().any(|j| gone.contains(j)), "the idle longest go (then by name)");
    assert!(held.iter().any(|j| j == &format!("idle-{UNPRODUCED_BATCH:04}")));
    assert!(s.take_events().is_empty(), "a job never produced for goes without a record");
    // A job that asks for data is kept, and so is one with progress.
    let w = worker(&mut s, 2_000);
    assert_eq!(s.lease(&w, 2_000).unwrap().unwrap().job, "train");
    beat(&mut s, &trainer, false, 2_001);
    join(&mut s, "another", 2_001).unwrap();
    assert!(jobs(&s).iter().any(|j| j == "train"));
}

#[test]
fn workers_hear_only_of_the_consumers_of_jobs_they_produce_for() {
    let mut s = setup();
    let a = join(&mut s, "a", 0).unwrap();
    let b = join(&mut s, "b", 0).unwrap();
    let w = worker(&mut s, 0);
    let idle = worker(&mut s, 0);
    let lease = s.lease(&w, 0).unwrap().unwrap();
    assert_eq!(lease.job, "a");
    beat(&mut s, &a, true, 1);
    beat(&mut s, &b, true, 1);
    let heard = |s: &mut State, worker: &str, queued: Vec<pb::JobRef>| {
        let req = pb::WorkerHeartbeatRequest {
            worker_id: worker.into(),
            leases: s.workers[worker].leases.iter().copied().collect(),
            queued,
            ..Default::default()
        };
        let gone = s.worker_heartbeat(&req, 2).unwrap().gone;
        gone.into_iter().map(|c| format!("{}#{}", c.job, c.consumer_index)).collect::<Vec<_>>()
    };
    assert_eq!(heard(&mut s, &w, Vec::new()), vec!["a#0"], "the job it holds a lease of");
    assert!(heard(&mut s, &idle, Vec::new()).is_empty(), "no lease, nothing queued: nothing");
    let queued = vec![pb::JobRef { pipeline: "p".into(), job: "b".into() }];
    assert_eq!(heard(&mut s, &idle, queued), vec!["b#0"], "the job it has parts queued for");
    // Once the lease is done the worker hears no more of job `a`.
    let done = pb::CompleteSplitRequest {
        worker_id: w.clone(),
        lease_id: lease.lease_id,
        pipeline: "p".into(),
        job: "a".into(),
        split: lease.split,
        elements: lease.elements,
        ..Default::default()
    };
    s.complete(&done).unwrap();
    assert!(heard(&mut s, &w, Vec::new()).is_empty());
    // A worker of another pipeline hears nothing of this one's, whatever it lists.
    let req = pb::RegisterWorkerRequest {
        address: "127.0.0.1:2".into(),
        pipeline: "q".into(),
        ..Default::default()
    };
    let other = s.register_worker(&req, 2).unwrap().0;
    let queued = vec![pb::JobRef { pipeline: "p".into(), job: "b".into() }];
    assert!(heard(&mut s, &other, queued).is_empty());
}

/// A state rebuilt from `events` by a restarted dispatcher.
fn replayed(events: &[Event]) -> State {
    let mut s = State::new(timing(), 1);
    for event in events {
        s.apply(event);
    }
    s
}

#[test]
fn a_restarted_dispatcher_knows_a_delivered_job_completed_though_its_trainer_never_comes_back() {
    let mut s = State::new(timing(), 1);
    s.register_pipeline("p", facts()).unwrap();
    let c = join(&mut s, "done", 0).unwrap();
    let w = worker(&mut s, 0);
    let mut journal = s.take_events();
    let mut partial = None;
    // Bounded: the epoch has 4 splits.
    for done in 1..=4 {
        let lease = s.lease(&w, 0).unwrap().expect("a split of the epoch");
        s.complete(&super::tests::by_holder(&s, super::tests::completion(&lease))).unwrap();
        journal.extend(s.take_events());
        if done == 3 {
            partial = Some(journal.clone());
        }
    }
    assert!(s.lease(&w, 0).unwrap().is_none(), "one epoch, all leased");
    assert!(!s.completed("p"), "the trainer has not said it finished");

    // Restarted after every split was delivered: complete, from the journal and from a snapshot
    // of it, although no consumer registered again.
    for events in [journal.clone(), s.snapshot_events()] {
        let restarted = replayed(&events);
        assert!(restarted.completed("p"), "{events:?}");
    }
    // Restarted with a split still to deliver: not complete.
    let partial = partial.expect("three splits done");
    assert!(!replayed(&partial).completed("p"));

    // And once the restarted dispatcher collects the job, the pipeline stays complete.
    let mut restarted = replayed(&journal);
    restarted.expire(1 + GC_MS);
    assert!(jobs(&restarted).is_empty() && restarted.completed("p"));
    beat(&mut s, &c, true, 1_000);
    assert!(s.completed("p"), "the live dispatcher: its trainer finished");
}
