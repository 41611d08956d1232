//! Two dispatchers (`granary run` processes) on one journal on the S3-compatible server: the
//! second takes the journal over, the first's next change is refused `UNAVAILABLE` and its
//! process ends in failure, and a third dispatcher reopening the journal finds every change
//! either acknowledged, and not the refused one.

use granary_e2e::s3::S3Server;
use granary_e2e::{Dispatcher, dataset};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::Code;

const JOURNAL: &str = "s3://journal/dispatcher/";

/// `granary run MANIFEST --serve 127.0.0.1:0 --workers 0 --journal JOURNAL` with the S3
/// server's credentials and loopback endpoint, once it printed its ready line.
fn start(manifest: &Path, env: &[(String, String)]) -> Dispatcher {
    granary_e2e::chaos::start_dispatcher_env(manifest, "127.0.0.1:0", JOURNAL, env)
}

/// Registers pipeline `name` with the manifest of the run's own pipeline: a change the journal
/// records. (A job is recorded only with its first lease, so joining one writes nothing.)
fn register(rt: &tokio::runtime::Runtime, d: &Dispatcher, name: &str) -> Result<(), tonic::Status> {
    rt.block_on(async {
        let mut client = DispatcherClient::connect(format!("http://{}", d.address))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let own = client.get_pipeline(pb::GetPipelineRequest { name: "e2e".into() }).await?.into_inner();
        let request = pb::RegisterPipelineRequest {
            name: name.into(),
            manifest_json: own.manifest_json,
            base_dir: own.base_dir,
        };
        client.register_pipeline(request).await.map(|_| ())
    })
}

/// Whether dispatcher `d` knows pipeline `name`.
fn knows(rt: &tokio::runtime::Runtime, d: &Dispatcher, name: &str) -> bool {
    rt.block_on(async {
        let mut client =
            DispatcherClient::connect(format!("http://{}", d.address)).await.expect("the dispatcher");
        match client.get_pipeline(pb::GetPipelineRequest { name: name.into() }).await {
            Ok(_) => true,
            Err(e) if e.code() == Code::NotFound => false,
            Err(e) => panic!("GetPipeline {name}: {e:?}"),
        }
    })
}

#[test]
fn the_fenced_dispatcher_stops_and_nothing_acknowledged_is_lost() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = dataset(8, 4, 4, 1);
    let s3 = S3Server::start(&data.dir.path().join("s3"), 0, &["journal"]);
    let env = s3.env();

    let mut first = start(&data.manifest, &env);
    register(&rt, &first, "before").expect("the first dispatcher takes a pipeline");
    let second = start(&data.manifest, &env);
    register(&rt, &second, "after").expect("the second dispatcher takes a pipeline");

    // The second took the journal over: the first refuses its next change, and ends.
    let refused = register(&rt, &first, "late").expect_err("the fenced dispatcher refuses a change");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("fenced"), "{refused:?}");
    let start_wait = Instant::now();
    let status = loop {
        if let Some(status) = first.proc.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(30),
            "the fenced dispatcher still runs after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the fenced dispatcher ended with {status}");
    drop(second);

    // Reopened: the acknowledged pipelines exist, the refused one does not.
    let third = start(&data.manifest, &env);
    assert!(knows(&rt, &third, "before") && knows(&rt, &third, "after"), "an acknowledged change survives");
    assert!(!knows(&rt, &third, "late"), "the refused change was never recorded");
    drop(third);
    s3.kill();
}
