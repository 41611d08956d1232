//! Scale to zero in the dispatcher's autoscaler: a trainer registering while the pool is at zero
//! wakes it, a trainer that never reported counts as attached, and a completed pipeline releases
//! its workers.

use super::*;
use crate::catalog::{Catalog, Listing};
use crate::pool::PoolFuture;
use crate::service::DispatcherConfig;
use granary_policies::{GranaryConfig, GranaryPolicy};
use granary_proto::v1::dispatcher_server::Dispatcher as _;
use tokio::sync::mpsc;

struct FourSplits;

impl Catalog for FourSplits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<Listing, String> {
        Ok(Listing::single(vec![4; 4]))
    }
}

/// A pool that reports each count it is asked for, and runs none of them.
struct Told(mpsc::UnboundedSender<u32>);

impl WorkerPool for Told {
    fn scale_to(&mut self, n: u32) -> PoolFuture<'_, ()> {
        let _ = self.0.send(n);
        Box::pin(async { Ok(()) })
    }

    fn current(&mut self) -> PoolFuture<'_, u32> {
        Box::pin(async { Ok(0) })
    }
}

async fn dispatcher() -> Dispatcher {
    let d = Dispatcher::new(DispatcherConfig::default(), Arc::new(FourSplits)).await.unwrap();
    let text = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
                source: {url: \"memory://data/\", format: files}\n  stages: [{op: image.decode}]\n  \
                batch: {size: 2}\n  epochs: 1\n";
    let manifest = granary_crds::parse_manifest(text, std::path::Path::new("/"), &[]).unwrap();
    d.register("p", &manifest).await.unwrap();
    d
}

fn autoscaler(
    d: &Dispatcher,
    bounds: PoolConfig,
    initial: u32,
) -> (Autoscaler, mpsc::UnboundedReceiver<u32>) {
    let (told, asked) = mpsc::unbounded_channel();
    let policy = GranaryPolicy::new(GranaryConfig::for_period(3600.0));
    let pool: SharedPool = Arc::new(tokio::sync::Mutex::new(Told(told)));
    let a =
        Autoscaler::new(d.clone(), "p", Box::new(policy), pool, bounds, Duration::from_secs(3600), initial);
    (a, asked)
}

/// Registers a trainer of `job` through the gRPC API, as a client does.
async fn trainer(d: &Dispatcher, job: &str) -> pb::RegisterClientResponse {
    let req = pb::RegisterClientRequest {
        pipeline: "p".into(),
        job: job.into(),
        num_consumers: 1,
        wants_data: true,
        ..Default::default()
    };
    d.register_client(tonic::Request::new(req)).await.unwrap().into_inner()
}

#[tokio::test]
async fn a_trainer_registering_at_zero_wakes_the_autoscaler_which_starts_workers() {
    let d = dispatcher().await;
    let bounds =
        PoolConfig { min_workers: 0, max_workers: 4, idle_after_s: Some(0.0), ..PoolConfig::default() };
    let (a, mut asked) = autoscaler(&d, bounds, 1);
    let scaling = a.scaling();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(a.run(async move { drop(stopped.await) }));
    // The first evaluation, at once: nobody attached for the 0 s allowed.
    assert_eq!(asked.recv().await, Some(0));
    assert_eq!(
        scaling.report().last_reason.split(':').next(),
        Some("no trainer attached for 0 s (idle after 0 s)")
    );

    // The period is an hour: only the registration can wake it before then.
    trainer(&d, "train").await;
    // A guard against hanging, not a measure: an unwoken autoscaler would wait an hour.
    let woken = tokio::time::timeout(Duration::from_secs(60), asked.recv()).await;
    assert_eq!(woken.ok().flatten(), Some(1), "woken by the registration");
    let report = scaling.report();
    assert_eq!(report.desired, 1);
    assert!(
        report.last_reason.starts_with("a trainer connected: starting workers"),
        "{}",
        report.last_reason
    );
    assert_eq!(report.cold_starts, 1);
    let _ = stop.send(());
    task.await.unwrap();
}

#[tokio::test]
async fn a_trainer_that_never_reported_counts_as_attached() {
    let d = dispatcher().await;
    let bounds =
        PoolConfig { min_workers: 0, max_workers: 4, idle_after_s: Some(0.0), ..PoolConfig::default() };
    let (mut a, _asked) = autoscaler(&d, bounds, 0);
    assert_eq!(a.evaluate().await.target, 0);
    trainer(&d, "train").await;
    assert!(d.snapshot("p").consumers.is_empty(), "no metrics yet");
    let observation = a.observe(Instant::now());
    assert_eq!(observation.consumer_count(), 1);
    assert_eq!(a.evaluate().await.target, 1);
}

#[tokio::test]
async fn the_policy_sees_where_each_job_finishes_and_its_trainers_hosts() {
    let d = dispatcher().await;
    let (a, _asked) = autoscaler(&d, PoolConfig::default(), 1);
    let t = trainer(&d, "train").await;
    let beat = |idle: Option<f64>, finish: f64| pb::ClientHeartbeatRequest {
        client_id: t.client_id.clone(),
        pipeline: "p".into(),
        job: t.job.clone(),
        consumer_index: t.consumer_index,
        wants_data: true,
        host_idle_cores: idle,
        finish_cores: finish,
        metrics: Some(pb::ClientMetrics { step_seconds: 0.1, batches_per_second: 8.0, ..Default::default() }),
        ..Default::default()
    };
    d.client_heartbeat(tonic::Request::new(beat(Some(3.0), 0.4))).await.unwrap();
    let job = &a.observe(Instant::now()).jobs[0];
    assert_eq!(job.finishing, Place::Client);
    let c = &job.consumers[0];
    assert_eq!((c.host_idle_cores, c.finish_cores, c.batches_per_second), (Some(3.0), 0.4, 8.0));
    // The host got busy: placement hands the finishing to the workers, and the client's last
    // figure no longer counts as finishing now.
    d.client_heartbeat(tonic::Request::new(beat(Some(0.1), 0.4))).await.unwrap();
    let job = &a.observe(Instant::now()).jobs[0];
    assert_eq!(job.finishing, Place::Workers);
    assert_eq!((job.consumers[0].host_idle_cores, job.consumers[0].finish_cores), (Some(0.1), 0.0));
}

#[tokio::test]
async fn a_completed_pipeline_releases_its_workers_and_a_new_trainer_starts_them() {
    let d = dispatcher().await;
    let bounds = PoolConfig { min_workers: 2, max_workers: 4, ..PoolConfig::default() };
    let (mut a, _asked) = autoscaler(&d, bounds, 2);
    let first = trainer(&d, "train").await;
    assert_eq!(a.evaluate().await.target, 2, "a trainer reads: the minimum holds");

    let done = pb::ClientHeartbeatRequest {
        client_id: first.client_id,
        pipeline: "p".into(),
        job: first.job,
        consumer_index: first.consumer_index,
        epoch: first.epochs,
        finished: true,
        ..Default::default()
    };
    d.client_heartbeat(tonic::Request::new(done)).await.unwrap();
    let decision = a.evaluate().await;
    assert_eq!(
        (decision.target, decision.reason.as_str()),
        (0, "every job completed: releasing every worker")
    );
    assert_eq!(a.evaluate().await.target, 0, "and stays there");

    trainer(&d, "another").await;
    assert_eq!(a.evaluate().await.target, 2, "a new job's trainer starts the pool again");
}
