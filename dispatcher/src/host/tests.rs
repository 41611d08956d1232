//! The host starts what it is asked to, runs autoscalers by name, and stops in order.

use super::*;
use crate::pool::PoolFuture;
use granary_crds::Manifest;
use granary_policies::PoolConfig;
use std::sync::Mutex;

/// Sources of no splits: nothing here registers a pipeline.
struct NoSources;

impl Catalog for NoSources {
    fn describe(&self, _: &Manifest) -> Result<crate::Listing, String> {
        Ok(Default::default())
    }
}

/// A pool that keeps a log of what happened to it and, when drained, notes whether the
/// dispatcher still served and whether any autoscaler still ran.
#[derive(Clone, Default)]
struct Logged {
    log: Arc<Mutex<Vec<String>>>,
    watch: Option<(SocketAddr, Autoscalers)>,
}

impl Logged {
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

impl WorkerPool for Logged {
    fn scale_to(&mut self, n: u32) -> PoolFuture<'_, ()> {
        self.note(format!("scale to {n}"));
        Box::pin(async { Ok(()) })
    }

    fn current(&mut self) -> PoolFuture<'_, u32> {
        Box::pin(async { Ok(0) })
    }
}

impl OwnedPool for Logged {
    fn drain(&mut self, grace: Duration) -> PoolFuture<'_, ()> {
        Box::pin(async move {
            let (address, autoscalers) = self.watch.clone().expect("watched");
            let serving = tokio::net::TcpStream::connect(address).await.is_ok();
            let autoscaled = autoscalers.is_running("p");
            self.note(format!(
                "drain within {}s, serving {serving}, autoscaled {autoscaled}",
                grace.as_secs()
            ));
            Ok(())
        })
    }
}

async fn start(metrics: Metrics) -> ControlPlane {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = HostOptions { dispatcher: DispatcherConfig::default(), metrics };
    ControlPlane::start(options, Arc::new(NoSources), listener).await.unwrap()
}

fn autoscaling(pool: SharedPool) -> Autoscaling {
    Autoscaling {
        pool,
        bounds: PoolConfig { min_workers: 2, max_workers: 4, ..PoolConfig::default() },
        period: Duration::from_secs(3600),
        initial: 2,
        first_after: Duration::from_secs(3600),
    }
}

/// The desired-workers series of pipeline `p` as scraped now.
fn desired(exposition: &Exposition, dispatcher: &Dispatcher) -> Option<String> {
    exposition.refresh(dispatcher);
    granary_telemetry::render(&exposition.registry())
        .lines()
        .find(|l| l.starts_with("granary_workers_desired{") && l.contains("pipeline=\"p\""))
        .map(str::to_string)
}

#[tokio::test]
async fn it_stops_autoscalers_then_drains_the_pool_while_serving_then_stops_serving() {
    let mut plane = start(Metrics::Serve("127.0.0.1:0".parse().unwrap())).await;
    let address = plane.address();
    let metrics = plane.metrics_address().expect("metrics served");
    assert!(tokio::net::TcpStream::connect(metrics).await.is_ok());
    let pool = Logged { watch: Some((address, plane.autoscalers())), ..Logged::default() };
    let shared = plane.own_pool(pool.clone(), 2).await.unwrap();
    assert!(plane.autoscalers().start("p", autoscaling(shared.clone())).is_some());
    assert!(plane.autoscalers().is_running("p"));

    let autoscalers = plane.autoscalers();
    plane.stop(Duration::from_secs(5)).await;
    assert_eq!(pool.log(), ["scale to 2", "drain within 5s, serving true, autoscaled false"]);
    assert!(tokio::net::TcpStream::connect(address).await.is_err(), "the dispatcher stopped serving");
    assert!(tokio::net::TcpStream::connect(metrics).await.is_err(), "the metrics endpoint stopped");
    assert!(autoscalers.start("p", autoscaling(shared)).is_none(), "nothing starts once stopping");
}

#[tokio::test]
async fn an_autoscaler_starts_and_stops_by_pipeline_and_is_reported() {
    let exposition = Arc::new(Exposition::new().unwrap());
    let plane = start(Metrics::Report(exposition.clone())).await;
    assert_eq!(plane.metrics_address(), None, "the caller serves a reported exposition");
    let autoscalers = plane.autoscalers();
    let pool: SharedPool = Arc::new(tokio::sync::Mutex::new(Logged::default()));

    let scaling = autoscalers.start("p", autoscaling(pool.clone())).unwrap();
    assert_eq!(scaling.report().desired, 2);
    assert!(autoscalers.is_running("p"));
    assert!(!autoscalers.is_running("q"));
    assert_eq!(autoscalers.scaling("p").map(|s| s.report().desired), Some(2));
    let series = desired(&exposition, plane.dispatcher()).expect("the autoscaler is reported");
    assert!(series.ends_with(" 2"), "{series}");

    assert!(autoscalers.stop("p"));
    assert!(!autoscalers.is_running("p"));
    assert!(autoscalers.scaling("p").is_none());
    assert!(!autoscalers.stop("p"), "stopping twice stops nothing");
    assert_eq!(desired(&exposition, plane.dispatcher()), None, "its series went with it");

    autoscalers.start("p", autoscaling(pool)).unwrap();
    autoscalers.fixed("p", 3);
    assert!(!autoscalers.is_running("p"), "a fixed count stops the autoscaler");
    let series = desired(&exposition, plane.dispatcher()).expect("the fixed count is reported");
    assert!(series.ends_with(" 3"), "{series}");
    plane.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_second_autoscaler_for_a_pipeline_replaces_the_first() {
    let plane = start(Metrics::Off).await;
    let autoscalers = plane.autoscalers();
    let pool: SharedPool = Arc::new(tokio::sync::Mutex::new(Logged::default()));
    let first = autoscalers.start("p", autoscaling(pool.clone())).unwrap();
    let second = autoscalers.start("p", Autoscaling { initial: 3, ..autoscaling(pool) }).unwrap();
    assert_eq!((first.report().desired, second.report().desired), (2, 3));
    assert_eq!(autoscalers.scaling("p").map(|s| s.report().desired), Some(3));
    plane.stop(Duration::from_secs(5)).await;
}
