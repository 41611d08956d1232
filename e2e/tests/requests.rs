//! Malformed, oversized, out-of-order and misnamed gRPC requests get a status with a clear
//! message, and the service keeps working afterwards.

use bytes::{Buf, BufMut, Bytes};
use granary_e2e::*;
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_proto::v1::worker_client::WorkerClient;
use std::time::Duration;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Sends raw bytes as a request body, to test what the server does with garbage.
#[derive(Default)]
struct Raw;

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

async fn raw_call(address: &str, method: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
    match grpc.unary(tonic::Request::new(Bytes::from(body)), path, Raw).await {
        Ok(_) => tonic::Status::ok("accepted"),
        Err(status) => status,
    }
}

fn expect(status: tonic::Status, code: Code, words: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(words), "`{}` should mention `{words}`", status.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_statuses() {
    let data = dataset(24, 4, 8, 1);
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal"));
    let _worker = start_worker(&d.address);
    let mut client = DispatcherClient::connect(format!("http://{}", d.address)).await.expect("connect");

    // Unknown names.
    let e = client.get_pipeline(pb::GetPipelineRequest { name: "nope".into() }).await.unwrap_err();
    expect(e, Code::NotFound, "no pipeline named `nope`; registered: e2e");
    let e = client
        .register_client(pb::RegisterClientRequest { pipeline: "nope".into(), ..Default::default() })
        .await
        .unwrap_err();
    expect(e, Code::NotFound, "no pipeline named `nope`");
    let e = client.get_pipeline(pb::GetPipelineRequest { name: String::new() }).await.unwrap_err();
    expect(e, Code::InvalidArgument, "`name` is empty");

    // Out of order: heartbeats, completions and replays from nobody registered.
    let e = client
        .worker_heartbeat(pb::WorkerHeartbeatRequest { worker_id: "ghost".into(), ..Default::default() })
        .await
        .unwrap_err();
    expect(e, Code::NotFound, "register (again)");
    let e = client
        .complete_split(pb::CompleteSplitRequest {
            worker_id: "ghost".into(),
            lease_id: 42,
            pipeline: "e2e".into(),
            job: "e2e".into(),
            split: 999,
            ..Default::default()
        })
        .await
        .unwrap_err();
    expect(e, Code::NotFound, "job `e2e`");
    let e = client
        .request_replay(pb::RequestReplayRequest {
            client_id: "c".into(),
            pipeline: "e2e".into(),
            job: "e2e".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    expect(e, Code::NotFound, "register again");

    // Out of range.
    let reg = client
        .register_client(pb::RegisterClientRequest {
            pipeline: "e2e".into(),
            consumer_index: Some(3),
            num_consumers: 2,
            ..Default::default()
        })
        .await
        .unwrap_err();
    expect(reg, Code::InvalidArgument, "`consumer_index` 3 is out of range");
    let ok = client
        .register_client(pb::RegisterClientRequest { pipeline: "e2e".into(), ..Default::default() })
        .await
        .expect("a good registration")
        .into_inner();
    let e = client
        .get_epoch_plan(pb::GetEpochPlanRequest {
            pipeline: "e2e".into(),
            job: ok.job.clone(),
            epoch: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    expect(e, Code::InvalidArgument, "`epoch` 9 is out of range");

    // Malformed bytes and an oversized request.
    let e = raw_call(&d.address, "/granary.v1.Dispatcher/RegisterWorker", vec![0xff, 0xff, 0xff, 0xff]).await;
    assert_ne!(e.code(), Code::Ok, "garbage was accepted");
    assert!(!e.message().is_empty());
    let mut big = vec![0x0a];
    big.extend_from_slice(&[0x80, 0x80, 0x80, 0x03]); // field 1, length 6 MiB
    big.resize(6 << 20, b'x');
    let e = raw_call(&d.address, "/granary.v1.Dispatcher/RegisterPipeline", big).await;
    assert_ne!(e.code(), Code::Ok, "an oversized request was accepted");
    assert!(!e.message().is_empty());

    // The worker refuses a stream request that names nothing.
    let workers = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let w = client
                .list_workers(pb::ListWorkersRequest { pipeline: "e2e".into() })
                .await
                .expect("list")
                .into_inner()
                .workers;
            if !w.is_empty() {
                return w;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a worker registers");
    let mut worker = WorkerClient::connect(format!("http://{}", workers[0].address)).await.expect("worker");
    let e = worker.stream_batches(pb::StreamBatchesRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Still serving.
    let info = client.get_pipeline(pb::GetPipelineRequest { name: "e2e".into() }).await.expect("alive");
    assert_eq!(info.into_inner().elements, 24);
}
