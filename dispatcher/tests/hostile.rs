//! Hostile callers against a dispatcher with TLS and authentication on, over real connections on
//! 127.0.0.1: each attack is refused with UNAUTHENTICATED or PERMISSION_DENIED (or fails its
//! handshake), and what the dispatcher holds is the same before and after.

use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_security::token::ANY;
use granary_security::{Authority, MasterKey, Role, TlsMaterial};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

struct FourSplits;

impl Catalog for FourSplits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<granary_dispatcher::Listing, String> {
        Ok(granary_dispatcher::Listing::single(vec![4; 4]))
    }
}

const HOUR: Duration = Duration::from_secs(3600);

fn manifest_json() -> String {
    let text = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: p}\nspec:\n  \
         source: {url: \"memory://data/\", format: files}\n  stages: [{op: image.decode}]\n  \
         batch: {size: 2}\n  epochs: 1\n";
    let manifest = granary_crds::parse_manifest(text, Path::new("/"), &[]).unwrap();
    serde_json::to_string(&manifest.pipeline).unwrap()
}

/// A running dispatcher with its CA and key.
struct Fixture {
    address: String,
    ca: Authority,
    key: MasterKey,
    dispatcher: Dispatcher,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Fixture {
    let ca = Authority::generate("granary test CA", HOUR).unwrap();
    let key = MasterKey::generate().unwrap();
    let leaf = ca.issue(Role::Owner, ANY, &["localhost", "127.0.0.1"], HOUR).unwrap();
    let config = DispatcherConfig {
        auth_key: Some(key.clone()),
        tls: Some(TlsMaterial::from_pem(ca.cert_pem(), Some((&leaf.cert_pem, &leaf.key_pem)))),
        ..Default::default()
    };
    let dispatcher = Dispatcher::new(config, Arc::new(FourSplits)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = dispatcher.clone();
    tokio::spawn(async move {
        let _ = served
            .serve(listener, async {
                let _ = stopped.await;
            })
            .await;
    });
    Fixture { address, ca, key, dispatcher, _stop: stop }
}

type Client = DispatcherClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` when there is a token.
#[derive(Clone)]
struct Bearer(Option<String>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        Ok(request)
    }
}

impl Fixture {
    /// A TLS client trusting this CA, with `identity` (a certificate of its own) and `token`.
    async fn client(&self, identity: Option<(&str, &str)>, token: Option<String>) -> Result<Client, String> {
        let tls = TlsMaterial::from_pem(self.ca.cert_pem(), identity).client("localhost");
        let channel = Endpoint::from_shared(format!("https://{}", self.address))
            .unwrap()
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(DispatcherClient::with_interceptor(channel, Bearer(token)))
    }

    async fn with_token(&self, role: Role, scope: &str) -> Client {
        self.client(None, Some(self.key.mint(role, scope))).await.unwrap()
    }

    /// What the dispatcher holds, to compare before and after the attacks.
    fn snapshot(&self) -> String {
        let mut out = String::new();
        for name in self.dispatcher.pipelines() {
            out += &format!(
                "{name}: {:?} {:?} {:?} {:?}\n",
                self.dispatcher.progress(&name),
                self.dispatcher.failure(&name),
                self.dispatcher.workers(&name),
                self.dispatcher.split_counts(&name),
            );
        }
        out
    }
}

fn refused(result: Result<impl std::fmt::Debug, tonic::Status>, attack: &str) {
    match result {
        Ok(answer) => panic!("{attack}: accepted ({answer:?})"),
        Err(status) => assert!(
            matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied),
            "{attack}: {:?} {}",
            status.code(),
            status.message()
        ),
    }
}

fn register(name: &str) -> pb::RegisterPipelineRequest {
    pb::RegisterPipelineRequest { name: name.into(), manifest_json: manifest_json(), base_dir: "/".into() }
}

fn worker(pipeline: &str) -> pb::RegisterWorkerRequest {
    pb::RegisterWorkerRequest {
        address: "127.0.0.1:1".into(),
        pipeline: pipeline.into(),
        ..Default::default()
    }
}

fn consumer(pipeline: &str, job: &str) -> pb::RegisterClientRequest {
    pb::RegisterClientRequest {
        pipeline: pipeline.into(),
        job: job.into(),
        wants_data: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_callers_are_refused_and_change_nothing() {
    let f = start().await;
    let mut owner = f.with_token(Role::Owner, ANY).await;
    owner.register_pipeline(register("team/a")).await.unwrap();
    owner.register_pipeline(register("team/b")).await.unwrap();
    // The legitimate parties: a worker and a trainer of pipeline a.
    let mut worker_a = f.with_token(Role::Worker, "team/a").await;
    let worker_a_id = worker_a.register_worker(worker("team/a")).await.unwrap().into_inner();
    assert!(!worker_a_id.capability_key.is_empty(), "workers get the capability key");
    let mut trainer_a = f.with_token(Role::Trainer, "team/a").await;
    let session = trainer_a.register_client(consumer("team/a", "train")).await.unwrap().into_inner();
    assert!(session.capability.starts_with("grc1."), "trainers get a stream capability");
    let lease = worker_a
        .lease_split(pb::LeaseSplitRequest { worker_id: worker_a_id.worker_id.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .lease
        .expect("a split to lease");
    let mut worker_b = f.with_token(Role::Worker, "team/b").await;
    let b_id = worker_b.register_worker(worker("team/b")).await.unwrap().into_inner().worker_id;
    let before = f.snapshot();

    // 1. No credentials at all.
    let mut anonymous = f.client(None, None).await.unwrap();
    refused(anonymous.register_pipeline(register("team/evil")).await, "register a pipeline anonymously");
    refused(anonymous.register_worker(worker("")).await, "register as a worker anonymously");
    // 2. A trainer re-registers a pipeline (its workers would read a new source).
    refused(trainer_a.register_pipeline(register("team/a")).await, "a trainer re-registers the pipeline");
    // 3. A token made with another deployment's key.
    let forged = MasterKey::generate().unwrap().mint(Role::Owner, ANY);
    let mut forger = f.client(None, Some(forged)).await.unwrap();
    refused(forger.register_pipeline(register("team/a")).await, "a forged owner token");
    // 4. A token altered to another scope keeps its signature: refused.
    let altered = {
        let real = f.key.mint(Role::Worker, "team/b");
        let mut parts: Vec<String> = real.split('.').map(String::from).collect();
        parts[2] = f.key.mint(Role::Worker, "team/a").split('.').nth(2).unwrap().to_string();
        parts.join(".")
    };
    let mut altered = f.client(None, Some(altered)).await.unwrap();
    refused(altered.register_worker(worker("team/a")).await, "a token whose scope was altered");
    // 5. A worker of pipeline b registers for pipeline a.
    refused(worker_b.register_worker(worker("team/a")).await, "a worker of b registers for a");
    // 6. A trainer registers as a worker.
    refused(trainer_a.register_worker(worker("team/a")).await, "a trainer registers as a worker");
    // 7. Another principal acts as worker a: heartbeat, lease, complete, give back.
    let as_a =
        |worker_id: &str| pb::WorkerHeartbeatRequest { worker_id: worker_id.into(), ..Default::default() };
    refused(worker_b.worker_heartbeat(as_a(&worker_a_id.worker_id)).await, "a heartbeat as another worker");
    refused(
        worker_b
            .lease_split(pb::LeaseSplitRequest {
                worker_id: worker_a_id.worker_id.clone(),
                ..Default::default()
            })
            .await,
        "a lease as another worker",
    );
    let complete = |worker_id: &str| pb::CompleteSplitRequest {
        worker_id: worker_id.into(),
        lease_id: lease.lease_id,
        pipeline: lease.pipeline.clone(),
        job: lease.job.clone(),
        epoch: lease.epoch,
        split: lease.split,
        elements: 1,
        ..Default::default()
    };
    refused(worker_b.complete_split(complete(&worker_a_id.worker_id)).await, "completing as another worker");
    refused(worker_b.complete_split(complete(&b_id)).await, "completing another worker's lease");
    refused(
        worker_b
            .return_lease(pb::ReturnLeaseRequest {
                worker_id: b_id.clone(),
                lease_id: lease.lease_id,
                ..Default::default()
            })
            .await,
        "giving back another worker's lease",
    );
    // 8. A worker re-registers under another principal's worker id.
    let steal = pb::RegisterWorkerRequest { worker_id: worker_a_id.worker_id.clone(), ..worker("team/b") };
    refused(worker_b.register_worker(steal).await, "re-registering with another worker's id");
    // 9. A trainer of b consumes a, joins a's job, or uses a's session.
    let mut trainer_b = f.with_token(Role::Trainer, "team/b").await;
    refused(trainer_b.register_client(consumer("team/a", "train")).await, "a trainer of b consumes a");
    let heartbeat = pb::ClientHeartbeatRequest {
        client_id: session.client_id.clone(),
        pipeline: "team/a".into(),
        job: "train".into(),
        ..Default::default()
    };
    refused(trainer_b.client_heartbeat(heartbeat.clone()).await, "a heartbeat in another trainer's session");
    let heartbeat_b = pb::ClientHeartbeatRequest { pipeline: "team/b".into(), ..heartbeat.clone() };
    refused(trainer_b.client_heartbeat(heartbeat_b).await, "another trainer's session, naming own pipeline");
    refused(
        trainer_b
            .request_replay(pb::RequestReplayRequest {
                client_id: session.client_id.clone(),
                pipeline: "team/a".into(),
                job: "train".into(),
                ..Default::default()
            })
            .await,
        "a replay in another trainer's session",
    );
    refused(
        trainer_b
            .get_epoch_plan(pb::GetEpochPlanRequest {
                pipeline: "team/a".into(),
                job: "train".into(),
                ..Default::default()
            })
            .await,
        "reading another pipeline's plan",
    );
    // 10. A worker takes the trainer's job.
    refused(worker_a.register_client(consumer("team/a", "train")).await, "a worker consumes");
    // 11. Reading another pipeline, or listing them all.
    refused(
        trainer_b.get_pipeline(pb::GetPipelineRequest { name: "team/a".into() }).await,
        "reading another pipeline",
    );
    refused(
        trainer_b.list_workers(pb::ListWorkersRequest { pipeline: "team/a".into() }).await,
        "listing another pipeline's workers",
    );
    let unknown = trainer_b.get_pipeline(pb::GetPipelineRequest { name: "team/b-typo".into() }).await;
    let Err(status) = unknown else { panic!("an unknown pipeline was found") };
    assert!(
        !status.message().contains("team/a"),
        "an unknown name lists other pipelines: {}",
        status.message()
    );
    // 12. A client certificate from another CA: the handshake fails.
    let other_ca = Authority::generate("someone else's CA", HOUR).unwrap();
    let stranger = other_ca.issue(Role::Owner, ANY, &[], HOUR).unwrap();
    // The handshake fails (the server rejects the certificate), so the call never reaches the
    // service: a transport error, not a status the service chose.
    if let Ok(mut client) = f.client(Some((&stranger.cert_pem, &stranger.key_pem)), None).await {
        let answer = client.register_pipeline(register("team/a")).await;
        assert!(answer.is_err(), "a certificate from another CA was served: {answer:?}");
    }
    // 13. Plaintext to the TLS port.
    let plaintext = Endpoint::from_shared(format!("http://{}", f.address)).unwrap().connect().await;
    if let Ok(channel) = plaintext {
        let answer = DispatcherClient::new(channel).register_pipeline(register("team/a")).await;
        assert!(answer.is_err(), "plaintext was served: {answer:?}");
    }

    // The dispatcher holds what it held, and the legitimate parties carry on.
    assert_eq!(f.snapshot(), before, "an attack changed the dispatcher's state");
    let done = pb::CompleteSplitRequest { elements: lease.elements, ..complete(&worker_a_id.worker_id) };
    worker_a.complete_split(done).await.unwrap();
    assert_eq!(f.dispatcher.failure("team/a"), None);
    // A certificate from this CA naming the owner works without a token (mutual TLS).
    let owner_cert = f.ca.issue(Role::Owner, ANY, &[], HOUR).unwrap();
    let mut by_cert = f.client(Some((&owner_cert.cert_pem, &owner_cert.key_pem)), None).await.unwrap();
    by_cert.get_pipeline(pb::GetPipelineRequest { name: "team/a".into() }).await.unwrap();
}
