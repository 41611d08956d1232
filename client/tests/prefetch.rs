//! The prefetch depth against a worker that delivers in bursts: a fake dispatcher and a fake
//! worker, in process on loopback.

mod support;

use std::time::Duration;

use granary_client::{Client, ClientOptions};
use support::dispatcher::{FakeDispatcher, State};
use support::worker::{FakeWorker, part, split_end};

/// Batches in the epoch: each slot is a split of one element.
const SLOTS: u64 = 40;
/// Slots the worker sends at once.
const BURST: u64 = 8;
/// Between bursts: longer than the trainer takes for one.
const BETWEEN: Duration = Duration::from_millis(400);
/// The trainer's step after each batch: long enough for a burst's messages to arrive within one.
const STEP: Duration = Duration::from_millis(20);

/// Reads the whole epoch from a worker that sends [`BURST`] slots every [`BETWEEN`], stepping
/// [`STEP`] after each batch; returns the client's depth at the end and the most a heartbeat
/// reported.
async fn bursts(prefetch_bytes: u64) -> (u32, u32) {
    let (worker, to_worker) = FakeWorker::serve().await;
    let state = State {
        pipeline: "p".into(),
        epochs: 1,
        plan: (0..SLOTS).map(|slot| (slot, vec![(slot, 0, 1)])).collect(),
        workers: vec![worker],
        heartbeat_ms: 50,
        ..State::default()
    };
    let (address, state, _stop) = FakeDispatcher::serve(state).await;
    let mut options = ClientOptions::new("p");
    options.dispatcher = Some(address);
    options.prefetch_bytes = prefetch_bytes;
    let mut client = Client::open(options).await.unwrap();
    assert_eq!(client.prefetch_batches(), 4, "the depth it starts with");

    let sender = tokio::spawn(async move {
        for first in (0..SLOTS).step_by(BURST as usize) {
            for slot in first..first + BURST {
                to_worker.send(part(0, slot, slot, 0, 1)).unwrap();
                to_worker.send(split_end(0, slot)).unwrap();
            }
            tokio::time::sleep(BETWEEN).await;
        }
        to_worker
    });
    let mut delivered = 0;
    while let Some(batch) =
        tokio::time::timeout(Duration::from_secs(20), client.next()).await.expect("no batch within 20 s")
    {
        batch.unwrap();
        delivered += 1;
        assert!(delivered <= SLOTS, "more batches than slots");
        tokio::time::sleep(STEP).await;
    }
    assert_eq!(delivered, SLOTS);
    let _worker = sender.await.unwrap();
    let reported = state
        .lock()
        .unwrap()
        .heartbeats
        .iter()
        .filter_map(|h| h.metrics.as_ref())
        .map(|m| m.prefetch_batches)
        .max();
    (client.prefetch_batches(), reported.unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_that_empties_a_full_buffer_deepens_its_prefetch() {
    // Each burst fills the 4 batches held ahead, and the trainer empties them before the next
    // one: the depth doubles.
    let (depth, reported) = bursts(granary_client::DEFAULT_PREFETCH_BYTES).await;
    assert!(depth >= 8, "the depth stayed at {depth}");
    assert!(reported >= 8, "the heartbeats reported at most {reported}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_the_prefetch_stays_at_four() {
    let (depth, reported) = bursts(0).await;
    assert_eq!((depth, reported), (4, 4));
}
