//! Two dispatchers on one journal: the second takes it over, the first's next change fails as
//! fenced and it stops serving (every request `UNAVAILABLE`, its server ended with an error),
//! and reopening finds everything either acknowledged.

use granary_dispatcher::host::{ControlPlane, HostError, HostOptions, Metrics};
use granary_dispatcher::{Catalog, DispatcherConfig, DispatcherError};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

struct FourSplits;

impl Catalog for FourSplits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<granary_dispatcher::Listing, String> {
        Ok(granary_dispatcher::Listing::single(vec![4; 4]))
    }
}

fn manifest(name: &str) -> granary_crds::Manifest {
    let text = format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: {name}}}\nspec:\n  \
         source: {{url: \"memory://data/\", format: files}}\n  stages: [{{op: image.decode}}]\n  \
         batch: {{size: 2}}\n  epochs: 1\n"
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

async fn start(journal: &Path) -> ControlPlane {
    let options = HostOptions {
        dispatcher: DispatcherConfig { journal: Some(journal.display().to_string()), ..Default::default() },
        metrics: Metrics::Off,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    ControlPlane::start(options, Arc::new(FourSplits), listener).await.unwrap()
}

/// Registers `name`; the error's message when refused.
async fn register(plane: &ControlPlane, name: &str) -> Result<(), String> {
    plane.dispatcher().register(name, &manifest(name)).await.map(drop).map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_fenced_dispatcher_stops_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let mut first = start(&journal).await;
    register(&first, "a").await.unwrap();
    let second = start(&journal).await;
    assert_eq!(second.dispatcher().pipelines(), vec!["a".to_string()]);
    register(&second, "b").await.unwrap();

    // The first's next change hits the second's records: fenced, not acknowledged.
    let refused = register(&first, "c").await.unwrap_err();
    assert!(refused.contains("stopped serving") && refused.contains("fenced"), "{refused}");
    assert!(first.dispatcher().halt_reason().is_some());
    let ended = tokio::time::timeout(Duration::from_secs(30), first.served()).await.expect("the server ends");
    assert!(
        matches!(ended, Err(HostError::Dispatcher(DispatcherError::Halted(_)))),
        "the fenced dispatcher's server ended with {ended:?}"
    );
    // Whatever is asked of it now fails UNAVAILABLE, or finds nobody listening.
    let refused = register(&first, "d").await.unwrap_err();
    assert!(refused.contains("stopped serving"), "{refused}");
    if let Ok(mut client) = DispatcherClient::connect(format!("http://{}", first.address())).await {
        let answer = client
            .register_client(pb::RegisterClientRequest { pipeline: "a".into(), ..Default::default() })
            .await;
        assert!(answer.is_err_and(|s| s.code() == tonic::Code::Unavailable));
    }
    first.stop(Duration::from_secs(5)).await;

    // The second carries on; reopening finds what both acknowledged, and nothing else.
    register(&second, "e").await.unwrap();
    second.stop(Duration::from_secs(5)).await;
    let third = start(&journal).await;
    let mut pipelines = third.dispatcher().pipelines();
    pipelines.sort();
    assert_eq!(pipelines, vec!["a", "b", "e"]);
    third.stop(Duration::from_secs(5)).await;
}
