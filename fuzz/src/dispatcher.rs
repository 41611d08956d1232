//! Dispatcher requests, served in-process by a fresh dispatcher per input.

use crate::input::Input;
use crate::runtime::runtime;
use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig, Listing};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_server::Dispatcher as Api;
use prost::Message;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use tonic::Request;

/// Requests one input may make: enough to walk a split from lease to completion several times.
const MAX_REQUESTS: usize = 64;

/// Every source lists four splits of four elements.
struct FourSplits;

impl Catalog for FourSplits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<Listing, String> {
        Ok(Listing::single(vec![4; 4]))
    }
}

/// The pipeline every dispatcher starts with, `p`.
fn pipeline() -> &'static granary_crds::Manifest {
    static MANIFEST: OnceLock<granary_crds::Manifest> = OnceLock::new();
    MANIFEST.get_or_init(|| {
        let text = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
                    source: {url: \"memory://fuzz/\", format: files}\n  stages: [{op: image.decode}]\n  \
                    batch: {size: 2}\n  epochs: 2\n";
        match granary_crds::parse_manifest(text, Path::new("/"), &[]) {
            Ok(manifest) => manifest,
            Err(e) => panic!("the fuzz target's own manifest is invalid: {e}"),
        }
    })
}

/// Ids the dispatcher answered, put into later requests whose kind byte has its high bit set,
/// so that the fuzzer reaches past "unknown worker" without guessing ids.
#[derive(Default)]
struct Known {
    worker: String,
    client: String,
    job: String,
    lease: Option<pb::Lease>,
}

/// Serves a sequence of requests: each is a kind byte (the request type; its high bit fills in
/// the ids the dispatcher answered before), then the protobuf message framed by a u16 length.
/// A fresh dispatcher (no journal, no authentication) with pipeline `p` registered serves them.
pub fn dispatcher_requests(data: &[u8]) {
    runtime().block_on(serve(data));
}

async fn serve(data: &[u8]) {
    let dispatcher = match Dispatcher::new(DispatcherConfig::default(), Arc::new(FourSplits)).await {
        Ok(d) => d,
        Err(e) => panic!("cannot start a dispatcher: {e}"),
    };
    if let Err(e) = dispatcher.register("p", pipeline()).await {
        panic!("cannot register the fuzz pipeline: {e}");
    }
    let mut input = Input::new(data);
    let mut known = Known::default();
    for _ in 0..MAX_REQUESTS {
        if input.is_empty() {
            break;
        }
        let kind = input.byte();
        let message = input.framed();
        request(&dispatcher, kind, message, &mut known).await;
    }
}

/// Decodes `message` as the request `kind` names and serves it; a message that does not decode
/// is what the server would refuse before the handler.
async fn request(d: &Dispatcher, kind: u8, message: &[u8], known: &mut Known) {
    let fill = kind & 0x80 != 0;
    let worker = |id: &mut String| {
        if fill {
            id.clone_from(&known.worker);
        }
    };
    match kind & 0x7f {
        0 => {
            let Ok(mut req) = pb::RegisterPipelineRequest::decode(message) else { return };
            if fill && req.manifest_json.is_empty() {
                req.manifest_json = serde_json::to_string(&pipeline().pipeline).unwrap_or_default();
            }
            let _ = d.register_pipeline(Request::new(req)).await;
        }
        1 => {
            let Ok(req) = pb::GetPipelineRequest::decode(message) else { return };
            let _ = d.get_pipeline(Request::new(req)).await;
        }
        2 => {
            let Ok(mut req) = pb::RegisterWorkerRequest::decode(message) else { return };
            if fill {
                req.pipeline = "p".into();
            }
            if let Ok(r) = d.register_worker(Request::new(req)).await {
                known.worker = r.into_inner().worker_id;
            }
        }
        3 => {
            let Ok(mut req) = pb::WorkerHeartbeatRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            let _ = d.worker_heartbeat(Request::new(req)).await;
        }
        4 => {
            let Ok(mut req) = pb::LeaseSplitRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            if let Ok(r) = d.lease_split(Request::new(req)).await
                && let Some(lease) = r.into_inner().lease
            {
                known.lease = Some(lease);
            }
        }
        5 => {
            let Ok(mut req) = pb::RenewLeaseRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            let _ = d.renew_lease(Request::new(req)).await;
        }
        6 => {
            let Ok(mut req) = pb::CompleteSplitRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            if fill && let Some(lease) = &known.lease {
                req.lease_id = lease.lease_id;
                req.pipeline.clone_from(&lease.pipeline);
                req.job.clone_from(&lease.job);
                req.epoch = lease.epoch;
                req.split = lease.split;
            }
            let _ = d.complete_split(Request::new(req)).await;
        }
        7 => {
            let Ok(mut req) = pb::CountSplitRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            if fill && let Some(lease) = &known.lease {
                req.lease_id = lease.lease_id;
            }
            let _ = d.count_split(Request::new(req)).await;
        }
        8 => {
            let Ok(mut req) = pb::ReturnLeaseRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            if fill && let Some(lease) = &known.lease {
                req.lease_id = lease.lease_id;
            }
            let _ = d.return_lease(Request::new(req)).await;
        }
        9 => {
            let Ok(mut req) = pb::RegisterClientRequest::decode(message) else { return };
            if fill {
                req.pipeline = "p".into();
            }
            if let Ok(r) = d.register_client(Request::new(req)).await {
                let r = r.into_inner();
                known.client = r.client_id;
                known.job = r.job;
            }
        }
        10 => {
            let Ok(mut req) = pb::ClientHeartbeatRequest::decode(message) else { return };
            if fill {
                req.client_id.clone_from(&known.client);
                req.pipeline = "p".into();
                req.job.clone_from(&known.job);
            }
            let _ = d.client_heartbeat(Request::new(req)).await;
        }
        11 => {
            let Ok(mut req) = pb::GetEpochPlanRequest::decode(message) else { return };
            if fill {
                req.pipeline = "p".into();
                req.job.clone_from(&known.job);
            }
            let _ = d.get_epoch_plan(Request::new(req)).await;
        }
        12 => {
            let Ok(mut req) = pb::RequestReplayRequest::decode(message) else { return };
            if fill {
                req.client_id.clone_from(&known.client);
                req.pipeline = "p".into();
                req.job.clone_from(&known.job);
            }
            let _ = d.request_replay(Request::new(req)).await;
        }
        13 => {
            let Ok(req) = pb::ListWorkersRequest::decode(message) else { return };
            let _ = d.list_workers(Request::new(req)).await;
        }
        14 => {
            let Ok(mut req) = pb::ReportCacheProfileRequest::decode(message) else { return };
            worker(&mut req.worker_id);
            if fill {
                req.pipeline = "p".into();
            }
            let _ = d.report_cache_profile(Request::new(req)).await;
        }
        _ => {}
    }
}
