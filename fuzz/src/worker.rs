//! A worker's client-facing requests: `StreamBatches`.

use crate::input::Input;
use crate::runtime::runtime;
use futures::{FutureExt, StreamExt};
use granary_proto::v1::StreamBatchesRequest;
use granary_proto::v1::worker_server::Worker;
use granary_security::{Capability, CapabilitySigner, MasterKey};
use granary_worker::service::queues::{Capacity, Queues};
use granary_worker::service::server::{CapabilityGate, StreamLimits, WorkerApi};
use prost::Message;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::Request;

/// Requests one input may make.
const MAX_REQUESTS: usize = 32;

/// The dispatcher's capability signer the worker is given the key of (one per process).
fn signer() -> &'static CapabilitySigner {
    static SIGNER: OnceLock<CapabilitySigner> = OnceLock::new();
    SIGNER.get_or_init(|| match MasterKey::generate() {
        Ok(key) => CapabilitySigner::new(&key),
        Err(e) => panic!("cannot make a master key: {e}"),
    })
}

/// Serves `StreamBatches` requests on a fresh worker API. The first byte sets the worker up:
/// bit 0, capabilities are required; bit 1, the dispatcher's key is known; bit 2, each request's
/// capability is replaced by one the dispatcher signed for its pipeline, job and consumer
/// (valid for an hour); bit 3, the worker is dedicated to pipeline `p`. Then a manifest (JSON,
/// u16-framed) that sizes pipeline `p`'s messages, then requests (protobuf, u16-framed). A
/// stream that opens is polled once.
pub fn worker_requests(data: &[u8]) {
    let mut input = Input::new(data);
    let setup = input.byte();
    let gate = Arc::new(CapabilityGate::new(setup & 1 != 0));
    if setup & 2 != 0 {
        gate.set_key(signer().public_key());
    }
    let limits = Arc::new(StreamLimits::default());
    limits.learn_json("p", &String::from_utf8_lossy(input.framed()));
    let dedicated = (setup & 8 != 0).then(|| "p".to_string());
    let api = WorkerApi::new(Arc::new(Queues::new(Capacity::default())), dedicated)
        .with_gate(gate)
        .with_limits(limits);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let expires_ms = (now + Duration::from_secs(3600)).as_millis() as u64;
    runtime().block_on(async {
        for _ in 0..MAX_REQUESTS {
            if input.is_empty() {
                break;
            }
            let Ok(mut request) = StreamBatchesRequest::decode(input.framed()) else { continue };
            if setup & 4 != 0 {
                request.capability = signer().sign(&Capability {
                    pipeline: request.pipeline.clone(),
                    job: request.job.clone(),
                    consumer: request.consumer_index,
                    expires_ms,
                });
            }
            if let Ok(stream) = api.stream_batches(Request::new(request)).await {
                let mut stream = stream.into_inner();
                let _ = stream.next().now_or_never();
            }
        }
    });
}
