//! Bad elements: failed attempts at a split and skipped elements (`spec.errors`), and both
//! surviving a restart, from the journal as written and from a compacted snapshot of it.

use super::*;
use granary_proto::v1 as pb;

/// Four splits of 10 listed elements, batch 4, one epoch, under `errors` (JSON, or none).
fn facts(errors: &str, counts_known: bool) -> PipelineFacts {
    PipelineFacts {
        manifest_json: format!(r#"{{"spec": {{{errors}}}}}"#),
        base_dir: "/".into(),
        counts: vec![10; 4],
        counts_known,
        batch: 4,
        epochs: 1,
        drop_remainder: false,
        shuffle: true,
        seed: 3,
        mixing: None,
    }
}

const SKIP_ONE: &str = r#""errors": {"policy": "skip", "maxSkipped": 1}"#;

fn setup(facts: PipelineFacts) -> (State, String) {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("p", facts).unwrap();
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        num_consumers: 1,
        consumer_index: Some(0),
        wants_data: true,
        ..Default::default()
    };
    s.register_client(&req, 0).unwrap();
    let req = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    let worker = s.register_worker(&req, 0).unwrap().0;
    (s, worker)
}

/// A state rebuilt from `events` by a restarted dispatcher.
fn replayed(events: &[Event]) -> State {
    let mut s = State::new(Timing::default(), 2);
    for event in events {
        s.apply(event);
    }
    s
}

const BAD: &str = "spec.stages[0] (`image.decode`) failed on element `img_0042.jpg`: invalid JPEG";

#[test]
fn failed_attempts_survive_a_restart_and_the_third_fails_the_pipeline() {
    let (mut s, w) = setup(facts("", true));
    let mut journal = Vec::new();
    let first = s.lease(&w, 0).unwrap().unwrap();
    s.give_back(&w, first.lease_id, Some(BAD)).unwrap();
    let second = s.lease(&w, 0).unwrap().unwrap();
    assert_eq!((second.epoch, second.split), (first.epoch, first.split), "the failed split comes back first");
    s.give_back(&w, second.lease_id, Some(BAD)).unwrap();
    journal.extend(s.take_events());
    assert_eq!(journal.iter().filter(|e| matches!(e, Event::SplitFailed { .. })).count(), 2);
    assert!(s.failure("p").is_none(), "two attempts failed, not three");

    // A restarted dispatcher knows both attempts, from the journal and from a snapshot of it:
    // one more failure is the last.
    for events in [journal.clone(), s.snapshot_events()] {
        let mut restarted = replayed(&events);
        assert!(restarted.failure("p").is_none());
        let req = pb::RegisterWorkerRequest { address: "127.0.0.1:2".into(), ..Default::default() };
        let w2 = restarted.register_worker(&req, 0).unwrap().0;
        let req = pb::RegisterClientRequest {
            pipeline: "p".into(),
            num_consumers: 1,
            consumer_index: Some(0),
            wants_data: true,
            ..Default::default()
        };
        restarted.register_client(&req, 0).unwrap();
        let third = restarted.lease(&w2, 0).unwrap().unwrap();
        restarted.give_back(&w2, third.lease_id, Some(BAD)).unwrap();
        let why = restarted.failure("p").expect("the third failed attempt fails the pipeline");
        assert!(why.contains("failed 3 times"), "{why}");
        assert!(why.contains("`img_0042.jpg`"), "the failure names the element: {why}");
        assert!(restarted.lease(&w2, 0).unwrap().is_none(), "a failed pipeline leases nothing more");
        // And the failure itself survives another restart.
        let again = replayed(&restarted.snapshot_events());
        assert_eq!(again.failure("p").as_deref(), Some(why.as_str()));
    }
}

#[test]
fn skipped_elements_count_once_per_split_and_survive_a_restart() {
    let (mut s, w) = setup(facts(SKIP_ONE, false));
    let lease = s.lease(&w, 0).unwrap().unwrap();
    assert!(lease.count_first, "skips make the count known only once computed");
    s.count_split(&w, lease.lease_id, 9).unwrap();
    let done = pb::CompleteSplitRequest {
        worker_id: w.clone(),
        lease_id: lease.lease_id,
        pipeline: "p".into(),
        job: "p".into(),
        epoch: 0,
        split: lease.split,
        elements: 9,
        skipped: 1,
        skip_error: BAD.into(),
        ..Default::default()
    };
    s.complete(&done).unwrap();
    assert_eq!(s.skipped("p"), 1);
    // The same completion again (a retried call) counts nothing more.
    s.complete(&done).unwrap();
    assert_eq!(s.skipped("p"), 1);
    assert!(s.failure("p").is_none(), "one skip is within maxSkipped: 1");
    let journal = s.take_events();
    assert!(journal.iter().any(|e| matches!(e, Event::SplitDone { skipped: 1, .. })));
    for events in [journal.clone(), s.snapshot_events()] {
        assert_eq!(replayed(&events).skipped("p"), 1);
    }

    // A second skip passes maxSkipped: the pipeline fails, saying so and naming the element.
    let next = s.lease(&w, 0).unwrap().unwrap();
    s.count_split(&w, next.lease_id, 9).unwrap();
    let done = pb::CompleteSplitRequest {
        lease_id: next.lease_id,
        split: next.split,
        skip_error: "spec.stages[0] (`image.decode`) failed on element `img_0077.jpg`: bad".into(),
        ..done
    };
    s.complete(&done).unwrap();
    assert_eq!(s.skipped("p"), 2);
    let why = s.failure("p").expect("past maxSkipped");
    assert!(why.contains("more than spec.errors.maxSkipped (1)"), "{why}");
    assert!(why.contains("img_0077.jpg"), "{why}");
    // A restart, from the journal or from a compaction's snapshot, fails it alike, still naming
    // the element.
    let mut journal = journal;
    journal.extend(s.take_events());
    for events in [journal, s.snapshot_events()] {
        let restarted = replayed(&events);
        assert_eq!(restarted.skipped("p"), 2);
        let why = restarted.failure("p").expect("past maxSkipped after a restart");
        assert!(why.contains("maxSkipped") && why.contains("img_0077.jpg"), "{why}");
    }
}

#[test]
fn without_max_skipped_any_number_of_skips_is_accepted() {
    let (mut s, w) = setup(facts(r#""errors": {"policy": "skip"}"#, false));
    while let Some(lease) = s.lease(&w, 0).unwrap() {
        s.count_split(&w, lease.lease_id, 8).unwrap();
        let done = pb::CompleteSplitRequest {
            worker_id: w.clone(),
            lease_id: lease.lease_id,
            pipeline: "p".into(),
            job: "p".into(),
            split: lease.split,
            elements: 8,
            skipped: 2,
            ..Default::default()
        };
        s.complete(&done).unwrap();
    }
    assert_eq!(s.skipped("p"), 8);
    assert!(s.failure("p").is_none());
}
