//! The client against a fake dispatcher and fake workers, in process on loopback.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use granary_client::{Batch, Client, ClientError, ClientOptions, Position};
use granary_proto::v1::StreamMessage;
use support::dispatcher::{FakeDispatcher, State};
use support::worker::{FakeWorker, part, split_end};
use tokio::sync::mpsc;

type Sender = mpsc::UnboundedSender<StreamMessage>;

/// Slot 0 = split 0 [0, 4); slot 1 = split 0 [4, 6) + split 1 [0, 2); slot 2 = split 1 [2, 6).
fn state(epochs: u32, workers: &[&str]) -> State {
    State {
        pipeline: "p".into(),
        epochs,
        plan: vec![(0, vec![(0, 0, 4)]), (1, vec![(0, 4, 6), (1, 0, 2)]), (2, vec![(1, 2, 6)])],
        workers: workers.iter().map(|w| w.to_string()).collect(),
        heartbeat_ms: 50,
        ..State::default()
    }
}

fn send_split0(worker: &Sender, epoch: u32) {
    worker.send(part(epoch, 0, 0, 0, 4)).unwrap();
    worker.send(part(epoch, 1, 0, 4, 6)).unwrap();
    worker.send(split_end(epoch, 0)).unwrap();
}

fn send_split1(worker: &Sender, epoch: u32) {
    worker.send(part(epoch, 1, 1, 0, 2)).unwrap();
    worker.send(part(epoch, 2, 1, 2, 6)).unwrap();
    worker.send(split_end(epoch, 1)).unwrap();
}

async fn next(client: &mut Client) -> Option<Batch> {
    tokio::time::timeout(Duration::from_secs(20), client.next())
        .await
        .expect("no batch within 20 s")
        .map(|b| b.unwrap())
}

async fn collect(client: &mut Client) -> Vec<Batch> {
    let mut batches = Vec::new();
    while let Some(batch) = next(client).await {
        batches.push(batch);
        assert!(batches.len() < 100, "too many batches");
    }
    batches
}

fn slots(batches: &[Batch], epoch: u32) -> BTreeSet<u64> {
    batches.iter().filter(|b| b.epoch == epoch).map(|b| b.slot).collect()
}

async fn open(address: &str) -> Client {
    Client::connect(Some(address), "p").await.unwrap()
}

async fn eventually(state: &Arc<Mutex<State>>, what: impl Fn(&State) -> bool) {
    for _ in 0..200 {
        if what(&state.lock().unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("condition not reached within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_batch_once_across_workers_and_epochs() {
    let (a, to_a) = FakeWorker::serve().await;
    let (b, to_b) = FakeWorker::serve().await;
    let (address, state, _stop) = FakeDispatcher::serve(state(2, &[&a, &b])).await;
    let mut client = open(&format!("http://{address}")).await;
    assert_eq!(
        (client.epochs(), client.consumer_index(), client.num_consumers(), client.job()),
        (2, 0, 1, "p")
    );

    // Next-epoch parts early, duplicates from the other worker.
    to_b.send(part(1, 0, 0, 0, 4)).unwrap();
    send_split0(&to_a, 0);
    send_split1(&to_b, 0);
    send_split0(&to_b, 0);
    send_split0(&to_a, 1);
    send_split1(&to_b, 1);

    let batches = collect(&mut client).await;
    assert_eq!(batches.len(), 6);
    assert_eq!(slots(&batches, 0), BTreeSet::from([0, 1, 2]));
    assert_eq!(slots(&batches, 1), BTreeSet::from([0, 1, 2]));
    let joined = batches.iter().find(|b| b.slot == 1).unwrap();
    assert_eq!(joined.keys, vec!["0/4", "0/5", "1/0", "1/1"]);
    assert_eq!(&joined.tensor("x").unwrap().data[..], &[4, 5, 100, 101]);
    assert_eq!(joined.len(), 4);
    assert!(client.duplicates() >= 1);
    assert!(client.next().await.is_none());

    let position = client.checkpoint();
    assert_eq!((position.epoch, position.delivered.clone()), (1, vec![(0, 3)]));
    // Heartbeats travel on separate calls, so the final one need not arrive last.
    let state = state.lock().unwrap();
    let last = state.heartbeats.iter().find(|h| h.finished).expect("a final heartbeat says finished");
    assert_eq!((last.epoch, last.delivered), (1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_unreachable_dispatchers_are_clear() {
    let (address, _state, _stop) = FakeDispatcher::serve(state(1, &[])).await;
    let error = Client::connect(Some(&address), "nope").await.unwrap_err();
    assert!(matches!(error, ClientError::Refused { .. }), "{error}");
    assert!(error.to_string().contains("unknown pipeline `nope`"), "{error}");

    let (listener, closed) = support::listen().await;
    drop(listener);
    let error = Client::connect(Some(&closed.to_string()), "p").await.unwrap_err();
    assert!(matches!(error, ClientError::Unreachable { .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains(&closed.to_string()) && text.contains("unreachable"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_end_with_missing_parts_asks_for_a_replay() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, _stop) = FakeDispatcher::serve(state(1, &[&a])).await;
    let (on_replay, mut replays) = mpsc::unbounded_channel();
    state.lock().unwrap().on_replay = Some(on_replay);
    let mut client = open(&address).await;

    to_a.send(part(0, 0, 0, 0, 4)).unwrap();
    to_a.send(split_end(0, 0)).unwrap();
    send_split1(&to_a, 0);
    let replay = tokio::time::timeout(Duration::from_secs(5), async {
        let mut client_batches = Vec::new();
        loop {
            tokio::select! {
                request = replays.recv() => return (request.unwrap(), client_batches),
                batch = client.next() => client_batches.push(batch.unwrap().unwrap()),
            }
        }
    })
    .await
    .unwrap();
    let (request, mut batches) = replay;
    assert_eq!((request.epoch, request.splits.clone()), (0, vec![0]));
    send_split0(&to_a, 0);
    batches.extend(collect(&mut client).await);
    assert_eq!(batches.len(), 3);
    assert_eq!(slots(&batches, 0), BTreeSet::from([0, 1, 2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_asks_for_every_split_with_missing_parts() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, _stop) = FakeDispatcher::serve(state(1, &[&a])).await;
    let (on_replay, mut replays) = mpsc::unbounded_channel();
    state.lock().unwrap().on_replay = Some(on_replay);
    let mut client = open(&address).await;

    to_a.send(part(0, 0, 0, 0, 4)).unwrap();
    to_a.send(part(0, 1, 0, 4, 6)).unwrap();
    to_a.send(part(0, 1, 1, 0, 2)).unwrap();
    let first = next(&mut client).await.unwrap();
    let second = next(&mut client).await.unwrap();
    assert_eq!(BTreeSet::from([first.slot, second.slot]), BTreeSet::from([0, 1]));

    let waiting = tokio::spawn(async move {
        let batch = next(&mut client).await;
        (client, batch)
    });
    let request = tokio::time::timeout(Duration::from_secs(5), replays.recv()).await.unwrap().unwrap();
    assert_eq!((request.epoch, request.splits), (0, vec![1]));
    to_a.send(part(0, 2, 1, 2, 6)).unwrap();
    let (mut client, batch) = waiting.await.unwrap();
    assert_eq!(batch.unwrap().slot, 2);
    assert!(next(&mut client).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_a_checkpoint() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, _stop) = FakeDispatcher::serve(state(2, &[&a])).await;
    let mut client = open(&address).await;
    send_split0(&to_a, 0);
    let first = next(&mut client).await.unwrap();
    assert_eq!(first.slot, 0);
    let saved = client.checkpoint().to_bytes();
    drop(client);

    // A new process: new workers, everything of epoch 0 sent again.
    let (c, to_c) = FakeWorker::serve().await;
    state.lock().unwrap().workers = vec![c];
    let mut options = ClientOptions::new("p");
    options.dispatcher = Some(address.clone());
    options.resume = Some(Position::from_bytes(&saved).unwrap());
    let mut client = Client::open(options).await.unwrap();
    {
        let state = state.lock().unwrap();
        let resume = state.registrations.last().unwrap().resume.clone().unwrap();
        assert_eq!((resume.epoch, resume.delivered.len(), resume.plan_fingerprint), (0, 1, 42));
        assert_eq!((resume.delivered[0].start, resume.delivered[0].end), (0, 1));
    }
    send_split0(&to_c, 0);
    send_split1(&to_c, 0);
    send_split0(&to_c, 1);
    send_split1(&to_c, 1);
    let batches = collect(&mut client).await;
    assert_eq!(slots(&batches, 0), BTreeSet::from([1, 2]));
    assert_eq!(slots(&batches, 1), BTreeSet::from([0, 1, 2]));
    assert_eq!(batches.len(), 5);
}

/// A trainer that registered before any worker streams from the first one to register, long
/// before its next regular heartbeat (a minute here) would have named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_the_first_worker_without_waiting_a_heartbeat_interval() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, _stop) =
        FakeDispatcher::serve(State { heartbeat_ms: 60_000, ..state(1, &[]) }).await;
    let mut client = open(&address).await;
    eventually(&state, |state| !state.heartbeats.is_empty()).await;
    state.lock().unwrap().workers.push(a);
    send_split0(&to_a, 0);
    send_split1(&to_a, 0);
    let batches = collect(&mut client).await;
    assert_eq!(slots(&batches, 0), BTreeSet::from([0, 1, 2]));
    // Once a worker is listed, heartbeats go back to the dispatcher's interval.
    let heartbeats = state.lock().unwrap().heartbeats.len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = state.lock().unwrap().heartbeats.len();
    // The final heartbeat of the finished client may still arrive.
    assert!(after <= heartbeats + 1, "{heartbeats} heartbeats, then {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_again_when_the_dispatcher_forgets() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, _stop) = FakeDispatcher::serve(state(1, &[&a])).await;
    let mut client = open(&address).await;
    send_split0(&to_a, 0);
    assert_eq!(next(&mut client).await.unwrap().slot, 0);

    state.lock().unwrap().forget = true;
    eventually(&state, |state| state.registrations.len() == 2).await;
    {
        let state = state.lock().unwrap();
        let again = &state.registrations[1];
        assert_eq!((again.job.as_str(), again.consumer_index), ("p", Some(0)));
        let resume = again.resume.clone().unwrap();
        assert_eq!((resume.epoch, resume.delivered.len()), (0, 1));
    }
    send_split1(&to_a, 0);
    let batches = collect(&mut client).await;
    assert_eq!(slots(&batches, 0), BTreeSet::from([1, 2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_delivering_while_the_dispatcher_is_down() {
    let (a, to_a) = FakeWorker::serve().await;
    let (address, state, stop) = FakeDispatcher::serve(state(1, &[&a])).await;
    let mut client = open(&address).await;
    eventually(&state, |state| !state.heartbeats.is_empty()).await;
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    send_split0(&to_a, 0);
    send_split1(&to_a, 0);
    let batches = collect(&mut client).await;
    assert_eq!(slots(&batches, 0), BTreeSet::from([0, 1, 2]));
}
