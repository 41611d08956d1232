//! The blocking client, driven from a plain thread.

mod support;

use std::collections::BTreeSet;

use granary_client::{BlockingClient, ClientOptions};
use support::dispatcher::{FakeDispatcher, State};
use support::worker::{FakeWorker, part, split_end};

#[test]
fn iterates_a_job_without_an_async_runtime() {
    let servers = tokio::runtime::Runtime::new().unwrap();
    let ((address, _state, _stop), to_a) = servers.block_on(async {
        let (a, to_a) = FakeWorker::serve().await;
        let state = State {
            pipeline: "p".into(),
            epochs: 1,
            plan: vec![(0, vec![(0, 0, 4)]), (1, vec![(0, 4, 6)])],
            workers: vec![a],
            heartbeat_ms: 50,
            ..State::default()
        };
        (FakeDispatcher::serve(state).await, to_a)
    });
    let mut options = ClientOptions::new("p");
    options.dispatcher = Some(address);
    let mut client = BlockingClient::open(options).unwrap();
    assert_eq!((client.epochs(), client.job()), (1, "p"));
    to_a.send(part(0, 1, 0, 4, 6)).unwrap();
    to_a.send(part(0, 0, 0, 0, 4)).unwrap();
    to_a.send(split_end(0, 0)).unwrap();
    let slots: BTreeSet<u64> = client.by_ref().map(|batch| batch.unwrap().slot).collect();
    assert_eq!(slots, BTreeSet::from([0, 1]));
    assert_eq!(client.checkpoint().delivered, vec![(0, 2)]);
    drop(client);
}
