//! A `LeaseSplit` call with nothing to lease waits for work to become leasable, over a real
//! connection on 127.0.0.1: a worker whose consumer is an epoch behind gets the next epoch's
//! split as soon as the consumer says it moved on, in the same call, rather than an empty answer
//! to try again later. One call may lease several splits (`max_leases`).

use granary_dispatcher::state::Timing;
use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// Splits per epoch.
const SPLITS: usize = 4;

struct Splits;

impl Catalog for Splits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<granary_dispatcher::Listing, String> {
        Ok(granary_dispatcher::Listing::single(vec![4; SPLITS]))
    }
}

fn manifest_json() -> String {
    let text = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
         source: {url: \"memory://data/\", format: files}\n  stages: [{op: image.decode}]\n  \
         batch: {size: 2}\n  epochs: 3\n";
    let manifest = granary_crds::parse_manifest(text, Path::new("/"), &[]).unwrap();
    serde_json::to_string(&manifest.pipeline).unwrap()
}

/// A plaintext dispatcher on 127.0.0.1 whose lease calls wait up to `wait` for work, leasing
/// exactly one epoch ahead of the consumer (these epochs of 4 splits would otherwise run 8 ahead,
/// see `Timing::min_splits_ahead`), so that the consumer's moves open each next epoch.
async fn start(wait: Duration) -> (DispatcherClient<Channel>, tokio::sync::oneshot::Sender<()>) {
    let timing = Timing { lease_wait_ms: wait.as_millis() as u64, min_splits_ahead: 0, ..Timing::default() };
    let config = DispatcherConfig { timing, ..Default::default() };
    let dispatcher = Dispatcher::new(config, Arc::new(Splits)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = dispatcher
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    let client = DispatcherClient::connect(format!("http://{address}")).await.unwrap();
    (client, stop)
}

/// Registers the pipeline, a worker and a reading consumer; returns the worker's and the
/// consumer's ids.
async fn setup(rpc: &mut DispatcherClient<Channel>) -> (String, pb::RegisterClientResponse) {
    let pipeline = pb::RegisterPipelineRequest {
        name: "p".into(),
        manifest_json: manifest_json(),
        base_dir: "/".into(),
    };
    rpc.register_pipeline(pipeline).await.unwrap();
    let worker = pb::RegisterWorkerRequest {
        address: "127.0.0.1:1".into(),
        pipeline: "p".into(),
        ..Default::default()
    };
    let worker_id = rpc.register_worker(worker).await.unwrap().into_inner().worker_id;
    let consumer = pb::RegisterClientRequest { pipeline: "p".into(), wants_data: true, ..Default::default() };
    let session = rpc.register_client(consumer).await.unwrap().into_inner();
    (worker_id, session)
}

fn lease_request(worker_id: &str) -> pb::LeaseSplitRequest {
    pb::LeaseSplitRequest { worker_id: worker_id.to_string(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lease_call_gets_the_next_epoch_as_soon_as_the_consumer_moves_on() {
    // Long enough that an answer with a lease can only come from the consumer's heartbeat.
    let (mut rpc, _stop) = start(Duration::from_secs(60)).await;
    let (worker_id, session) = setup(&mut rpc).await;
    // Epochs are leased at most one ahead of the slowest consumer: epochs 0 and 1 now.
    for _ in 0..2 * SPLITS {
        let lease = rpc.lease_split(lease_request(&worker_id)).await.unwrap().into_inner().lease;
        assert!(lease.is_some_and(|l| l.epoch < 2));
    }
    let mut waiting = rpc.clone();
    let id = worker_id.clone();
    let call = tokio::spawn(async move { waiting.lease_split(lease_request(&id)).await });
    // Let the call reach the dispatcher and wait; the outcome does not depend on it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "the lease call answered at once with nothing to lease");
    let beat = pb::ClientHeartbeatRequest {
        client_id: session.client_id.clone(),
        pipeline: "p".into(),
        job: session.job.clone(),
        epoch: 1,
        wants_data: true,
        ..Default::default()
    };
    rpc.client_heartbeat(beat).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), call).await.unwrap().unwrap().unwrap();
    let lease = answer.into_inner().lease.expect("a lease of the epoch now open");
    assert_eq!(lease.epoch, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_with_nothing_to_lease_answers_within_its_wait_and_a_backed_up_worker_at_once() {
    let (mut rpc, _stop) = start(Duration::from_millis(100)).await;
    let (worker_id, session) = setup(&mut rpc).await;
    for _ in 0..2 * SPLITS {
        rpc.lease_split(lease_request(&worker_id)).await.unwrap();
    }
    let answer = rpc.lease_split(lease_request(&worker_id)).await.unwrap().into_inner();
    assert!(answer.lease.is_none());
    assert!(answer.retry_after_ms > 0, "the worker is told when to ask again");
    // A worker that reports backed-up jobs waits on its own queues, not on the dispatcher.
    let backed_up = vec![pb::JobRef { pipeline: "p".into(), job: session.job.clone() }];
    let request = pb::LeaseSplitRequest { worker_id, backed_up, ..Default::default() };
    let answer = rpc.lease_split(request).await.unwrap().into_inner();
    assert!(answer.lease.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_leases_as_many_splits_as_asked_for_while_there_are_some() {
    let (mut rpc, _stop) = start(Duration::from_millis(100)).await;
    let (worker_id, _) = setup(&mut rpc).await;
    let ask =
        |max_leases| pb::LeaseSplitRequest { worker_id: worker_id.clone(), max_leases, ..Default::default() };
    let first = rpc.lease_split(ask(3)).await.unwrap().into_inner();
    let mut leases: Vec<pb::Lease> = first.lease.into_iter().chain(first.more).collect();
    assert_eq!(leases.len(), 3, "three leases in one answer");
    // Two epochs are leasable (8 splits): 5 remain, and a call asking for more gets those 5.
    let rest = rpc.lease_split(ask(100)).await.unwrap().into_inner();
    assert_eq!(rest.retry_after_ms, 0);
    leases.extend(rest.lease.into_iter().chain(rest.more));
    assert_eq!(leases.len(), 2 * SPLITS);
    let mut granted: Vec<(u32, u64)> = leases.iter().map(|l| (l.epoch, l.split)).collect();
    granted.sort_unstable();
    granted.dedup();
    assert_eq!(granted.len(), 2 * SPLITS, "each split of the two epochs once: {granted:?}");
    let mut ids: Vec<u64> = leases.iter().map(|l| l.lease_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2 * SPLITS, "each lease has an id of its own");
    let none = rpc.lease_split(ask(4)).await.unwrap().into_inner();
    assert!(none.lease.is_none() && none.more.is_empty());
}
