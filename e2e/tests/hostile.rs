//! Hostile callers against a served run with TLS on, all real processes on 127.0.0.1:
//! `granary run --serve --tls --credentials DIR --workers 1` (the dispatcher and its worker
//! process) and a legitimate trainer process reading the pipeline, while this test attacks the
//! dispatcher's and the worker's gRPC endpoints. Every attack is refused with UNAUTHENTICATED or
//! PERMISSION_DENIED, or fails its TLS handshake; what the owner can read of the dispatcher's
//! state is the same before and after; the trainer gets every element exactly once.
//!
//! The attackers hold what a real one could: the CA certificate (public), the pipeline's trainer
//! token (an insider), tokens for other pipelines of the same deployment (minted here from the
//! run's master key in DIR, as the operator would for other tenants), tokens and capabilities of
//! another deployment's key, and certificates from another CA.

use granary_e2e::*;
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_proto::v1::worker_client::WorkerClient;
use granary_security::token::ANY;
use granary_security::{Authority, Bearer, Capability, CapabilitySigner, MasterKey, Role, TlsMaterial};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

const LONG: Duration = Duration::from_secs(120);
const HOUR: Duration = Duration::from_secs(3600);
/// The pipeline the run serves (the dataset's `metadata.name`) and its trainer's job.
const PIPELINE: &str = "e2e";
/// Another tenant's pipeline, registered by the owner beside it.
const OTHER: &str = "team/other";
/// A pipeline nobody registered, whose worker principal attacks leases it does not hold.
const THIRD: &str = "team/third";

type Rpc = DispatcherClient<InterceptedService<Channel, Bearer>>;

/// The run under attack: where it listens and what its credentials folder holds.
struct Run {
    dispatcher: String,
    ca: String,
    key: MasterKey,
}

impl Run {
    async fn channel(&self, address: &str, identity: Option<(&str, &str)>) -> Result<Channel, String> {
        let tls = TlsMaterial::from_pem(&self.ca, identity).client("localhost");
        Endpoint::from_shared(format!("https://{address}"))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }

    /// The dispatcher over TLS, sending `token` when given.
    async fn rpc(&self, token: Option<&str>) -> Rpc {
        let channel = self.channel(&self.dispatcher, None).await.expect("TLS to the dispatcher");
        DispatcherClient::with_interceptor(channel, Bearer::new(token).expect("an ASCII token"))
    }

    async fn as_role(&self, role: Role, scope: &str) -> Rpc {
        self.rpc(Some(&self.key.mint(role, scope))).await
    }
}

/// The attacks made, each refused.
#[derive(Default)]
struct Tally(Vec<String>);

impl Tally {
    /// `result` must be UNAUTHENTICATED or PERMISSION_DENIED.
    fn refused<T: std::fmt::Debug>(&mut self, attack: &str, result: Result<T, tonic::Status>) {
        match result {
            Ok(answer) => panic!("{attack}: accepted ({answer:?})"),
            Err(status) => assert!(
                matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied),
                "{attack}: {:?} {}",
                status.code(),
                status.message()
            ),
        }
        self.0.push(attack.to_string());
    }

    /// A transport-level attack: the connection, or the first call on it, must fail.
    fn handshake_fails<T: std::fmt::Debug>(&mut self, attack: &str, result: Result<T, String>) {
        assert!(result.is_err(), "{attack}: served ({result:?})");
        self.0.push(attack.to_string());
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What the owner reads of the dispatcher through its API: the pipelines' facts, the workers,
/// the trainer's and the other tenant's epoch plans, and that no attacker's pipeline exists.
/// Progress counters are left out: the legitimate trainer moves them.
async fn snapshot(owner: &mut Rpc) -> String {
    let mut out = String::new();
    for name in [PIPELINE, OTHER] {
        let p = owner.get_pipeline(pb::GetPipelineRequest { name: name.into() }).await.unwrap().into_inner();
        out += &format!(
            "{}: generation {} splits {} elements {} epochs {} batch {} {} {}\n",
            p.name, p.generation, p.splits, p.elements, p.epochs, p.batch_size, p.base_dir, p.manifest_json
        );
    }
    for name in [PIPELINE, OTHER, THIRD] {
        let listed = owner.list_workers(pb::ListWorkersRequest { pipeline: name.into() }).await.unwrap();
        let mut workers: Vec<String> =
            listed.into_inner().workers.iter().map(|w| format!("{}@{}", w.worker_id, w.address)).collect();
        workers.sort();
        out += &format!("{name} workers: {workers:?}\n");
    }
    for (pipeline, job) in [(PIPELINE, PIPELINE), (OTHER, "x")] {
        let plan =
            pb::GetEpochPlanRequest { pipeline: pipeline.into(), job: job.into(), ..Default::default() };
        let plan = owner.get_epoch_plan(plan).await.unwrap().into_inner();
        out += &format!("{pipeline}/{job} plan {} of {} slots\n", plan.plan_fingerprint, plan.slots.len());
    }
    let evil = owner.get_pipeline(pb::GetPipelineRequest { name: "team/evil".into() }).await;
    out += &format!("team/evil: {:?}\n", evil.map_err(|s| s.code()).map(|_| ()));
    out
}

fn register(name: &str, info: &pb::PipelineInfo) -> pb::RegisterPipelineRequest {
    pb::RegisterPipelineRequest {
        name: name.into(),
        manifest_json: info.manifest_json.clone(),
        base_dir: info.base_dir.clone(),
    }
}

fn worker(pipeline: &str) -> pb::RegisterWorkerRequest {
    pb::RegisterWorkerRequest {
        address: "127.0.0.1:9".into(),
        pipeline: pipeline.into(),
        ..Default::default()
    }
}

fn stream(pipeline: &str, job: &str, consumer: u32, capability: &str) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        pipeline: pipeline.into(),
        job: job.into(),
        consumer_index: consumer,
        client_id: "attacker".into(),
        capability: capability.into(),
    }
}

/// The other tenant's legitimate worker and trainer, heartbeating until `stop` so that the
/// lease one holds and the session the other opened stay what they were.
fn keep_alive(
    mut rpc: [Rpc; 3],
    worker: String,
    lease: u64,
    idler: String,
    session: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Bounded: 240 rounds of 250 ms, far longer than the test.
        for _ in 0..240 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let beat = pb::WorkerHeartbeatRequest {
                worker_id: worker.clone(),
                leases: vec![lease],
                ..Default::default()
            };
            rpc[0].worker_heartbeat(beat).await.expect("the other tenant's worker heartbeats");
            let idle = pb::WorkerHeartbeatRequest { worker_id: idler.clone(), ..Default::default() };
            rpc[1].worker_heartbeat(idle).await.expect("the idle worker heartbeats");
            let client = pb::ClientHeartbeatRequest {
                client_id: session.clone(),
                pipeline: OTHER.into(),
                job: "x".into(),
                ..Default::default()
            };
            rpc[2].client_heartbeat(client).await.expect("the other tenant's trainer heartbeats");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

#[test]
fn hostile_clients_are_refused_while_a_trainer_reads_exactly_once() {
    // 2 epochs of 16 batches; the trainer's 300 ms steps keep it reading through the attacks.
    let data = dataset(64, 4, 4, 2);
    let journal = data.dir.path().join("journal");
    let folder = tempfile::tempdir().expect("a credentials folder");
    let credentials = folder.path().join("credentials");
    let dir = credentials.to_str().expect("a UTF-8 path");
    let extra = ["--workers", "1", "--tls", "--credentials", dir];
    let d = start_dispatcher_with(&data.manifest, "127.0.0.1:0", &journal, &extra);
    let ca_file = d.ready["tls_ca"].as_str().expect("the ready line names the CA").to_string();
    assert!(ca_file.starts_with(dir), "the CA is kept in the credentials folder: {ca_file}");
    let token_file = d.ready["token_file"].as_str().expect("the ready line names the trainer token");
    let token = std::fs::read_to_string(token_file).expect("the trainer token").trim().to_string();
    let master = std::fs::read_to_string(credentials.join("master.key")).expect("the kept master key");
    let run = Run {
        dispatcher: d.address.clone(),
        ca: std::fs::read_to_string(&ca_file).expect("the CA"),
        key: MasterKey::decode(&master).expect("a master key"),
    };

    let env = [("GRANARY_TLS_CA", ca_file.as_str()), ("GRANARY_TOKEN", token.as_str())];
    let mut trainer = start_consumer_env(&d.address, PIPELINE, &["--step-ms", "300"], &env);
    trainer.collect(2, LONG);
    assert_eq!(trainer.seen.len(), 2, "the trainer reads before the attacks");

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let attacks = rt.block_on(attack(&run, &token));
    assert!(attacks.0.len() >= 15, "only {} attacks: {:?}", attacks.0.len(), attacks.0);
    eprintln!("{} attacks refused: {:#?}", attacks.0.len(), attacks.0);
    assert!(
        trainer.proc.child.try_wait().expect("the trainer's status").is_none(),
        "the trainer finished before the attacks did, so it did not read through them: give it \
         longer steps"
    );
    assert!(trainer.finish(LONG), "the legitimate trainer did not finish");
    assert_exactly_once(&trainer.seen, &data.keys, 2);
}

/// Sets up the other tenants, attacks, and checks that the owner's view did not change.
async fn attack(run: &Run, trainer_token: &str) -> Tally {
    let mut owner = run.as_role(Role::Owner, ANY).await;
    let e2e =
        owner.get_pipeline(pb::GetPipelineRequest { name: PIPELINE.into() }).await.unwrap().into_inner();
    let workers = owner.list_workers(pb::ListWorkersRequest { pipeline: PIPELINE.into() }).await.unwrap();
    let real_worker = workers.into_inner().workers.first().cloned().expect("the run's worker registered");

    // Another tenant: its pipeline, a trainer whose job makes leases, and a worker holding one.
    owner.register_pipeline(register(OTHER, &e2e)).await.expect("the owner registers another pipeline");
    let mut other_trainer = run.as_role(Role::Trainer, OTHER).await;
    let join = pb::RegisterClientRequest {
        pipeline: OTHER.into(),
        job: "x".into(),
        wants_data: true,
        ..Default::default()
    };
    let session = other_trainer.register_client(join).await.expect("the other tenant consumes").into_inner();
    let mut other_worker = run.as_role(Role::Worker, OTHER).await;
    let holder = other_worker.register_worker(worker(OTHER)).await.unwrap().into_inner().worker_id;
    let lease = other_worker
        .lease_split(pb::LeaseSplitRequest { worker_id: holder.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .lease
        .expect("a split of the other pipeline to lease");
    // A registered worker that holds no lease: of a pipeline not registered yet.
    let mut idle = run.as_role(Role::Worker, THIRD).await;
    let idler = idle.register_worker(worker(THIRD)).await.unwrap().into_inner().worker_id;
    let stop = Arc::new(AtomicBool::new(false));
    let beats = [
        run.as_role(Role::Worker, OTHER).await,
        run.as_role(Role::Worker, THIRD).await,
        run.as_role(Role::Trainer, OTHER).await,
    ];
    let alive = keep_alive(
        beats,
        holder.clone(),
        lease.lease_id,
        idler.clone(),
        session.client_id.clone(),
        stop.clone(),
    );
    let before = snapshot(&mut owner).await;

    let mut t = Tally::default();
    let mut anonymous = run.rpc(None).await;
    let mut trainer = run.rpc(Some(trainer_token)).await;
    let stale_key = MasterKey::generate().unwrap();
    let mut stale = run.rpc(Some(&stale_key.mint(Role::Owner, ANY))).await;

    // Re-registering the served pipeline (its workers would read another source).
    t.refused(
        "anonymous re-registers the pipeline",
        anonymous.register_pipeline(register(PIPELINE, &e2e)).await,
    );
    t.refused(
        "its trainer re-registers the pipeline",
        trainer.register_pipeline(register(PIPELINE, &e2e)).await,
    );
    t.refused(
        "another tenant's worker re-registers it",
        other_worker.register_pipeline(register(PIPELINE, &e2e)).await,
    );
    t.refused(
        "an owner token of a previous run's key",
        stale.register_pipeline(register(PIPELINE, &e2e)).await,
    );
    let altered = {
        let real = run.key.mint(Role::Trainer, OTHER);
        let mut parts: Vec<&str> = real.split('.').collect();
        parts[1] = "owner";
        parts.join(".")
    };
    let mut altered = run.rpc(Some(&altered)).await;
    t.refused(
        "a trainer token altered to the owner's",
        altered.register_pipeline(register(PIPELINE, &e2e)).await,
    );

    // Registering as a worker of the pipeline, at any address.
    t.refused("anonymous registers as a worker", anonymous.register_worker(worker(PIPELINE)).await);
    t.refused("a trainer registers as a worker", trainer.register_worker(worker(PIPELINE)).await);
    t.refused(
        "another tenant's worker registers for it",
        other_worker.register_worker(worker(PIPELINE)).await,
    );
    let steal = pb::RegisterWorkerRequest { worker_id: real_worker.worker_id.clone(), ..worker(THIRD) };
    t.refused("re-registering under the run's worker id", idle.register_worker(steal).await);

    // Leases: acting as the run's worker, and completing or giving back a lease held by another.
    let as_real = pb::LeaseSplitRequest { worker_id: real_worker.worker_id.clone(), ..Default::default() };
    t.refused("leasing as the run's worker", idle.lease_split(as_real).await);
    let complete = |worker_id: &str, pipeline: &str| pb::CompleteSplitRequest {
        worker_id: worker_id.into(),
        lease_id: lease.lease_id,
        pipeline: pipeline.into(),
        job: lease.job.clone(),
        epoch: lease.epoch,
        split: lease.split,
        elements: lease.elements,
        ..Default::default()
    };
    t.refused(
        "completing as the run's worker",
        idle.complete_split(complete(&real_worker.worker_id, PIPELINE)).await,
    );
    t.refused("completing a lease it does not hold", idle.complete_split(complete(&idler, THIRD)).await);
    t.refused("completing it, naming its pipeline", idle.complete_split(complete(&idler, OTHER)).await);
    let give_back = |worker_id: &str| pb::ReturnLeaseRequest {
        worker_id: worker_id.into(),
        lease_id: lease.lease_id,
        ..Default::default()
    };
    t.refused("giving back a lease it does not hold", idle.return_lease(give_back(&idler)).await);
    t.refused("giving back as the lease's holder", idle.return_lease(give_back(&holder)).await);
    t.refused(
        "giving back as the run's worker",
        trainer.return_lease(give_back(&real_worker.worker_id)).await,
    );

    // The trainer's job and consumer index.
    let take = |index: u32| pb::RegisterClientRequest {
        pipeline: PIPELINE.into(),
        job: PIPELINE.into(),
        consumer_index: Some(index),
        ..Default::default()
    };
    t.refused("another tenant's trainer takes consumer 0", other_trainer.register_client(take(0)).await);
    t.refused("a worker takes consumer 0", other_worker.register_client(take(0)).await);
    t.refused("anonymous takes consumer 0", anonymous.register_client(take(0)).await);
    let stale_trainer = stale_key.mint(Role::Trainer, PIPELINE);
    let mut replayed = run.rpc(Some(&stale_trainer)).await;
    t.refused("a trainer token of a previous run's key", replayed.register_client(take(0)).await);

    // Reading or listing pipelines by name.
    let plan =
        pb::GetEpochPlanRequest { pipeline: PIPELINE.into(), job: PIPELINE.into(), ..Default::default() };
    t.refused("another tenant reads the trainer's plan", other_trainer.get_epoch_plan(plan).await);
    let list = pb::ListWorkersRequest { pipeline: PIPELINE.into() };
    t.refused("another tenant lists the run's workers", other_trainer.list_workers(list).await);
    let typo = other_trainer.get_pipeline(pb::GetPipelineRequest { name: "e2".into() }).await;
    if let Err(status) = &typo {
        assert!(
            !status.message().contains(PIPELINE),
            "an unknown name lists pipelines: {}",
            status.message()
        );
    }
    t.refused("an unknown pipeline name", typo);

    // The worker's stream of the trainer's batches.
    let mut worker_rpc =
        WorkerClient::new(run.channel(&real_worker.address, None).await.expect("TLS to the worker"));
    t.refused(
        "a stream with no capability",
        worker_rpc.stream_batches(stream(PIPELINE, PIPELINE, 0, "")).await,
    );
    let signer = CapabilitySigner::new(&run.key);
    let mut capability = Capability {
        pipeline: PIPELINE.into(),
        job: PIPELINE.into(),
        consumer: 0,
        expires_ms: unix_ms() - 60_000,
    };
    let expired = signer.sign(&capability);
    t.refused(
        "an expired capability",
        worker_rpc.stream_batches(stream(PIPELINE, PIPELINE, 0, &expired)).await,
    );
    capability.expires_ms = unix_ms() + 600_000;
    let forged = CapabilitySigner::new(&stale_key).sign(&capability);
    t.refused(
        "a capability signed by another key",
        worker_rpc.stream_batches(stream(PIPELINE, PIPELINE, 0, &forged)).await,
    );
    // A capability of consumer 0 (as if captured) replayed for another consumer and job.
    let captured = signer.sign(&capability);
    t.refused(
        "a capability replayed for consumer 1",
        worker_rpc.stream_batches(stream(PIPELINE, PIPELINE, 1, &captured)).await,
    );
    t.refused(
        "a capability replayed for another job",
        worker_rpc.stream_batches(stream(PIPELINE, "eval", 0, &captured)).await,
    );
    // The other tenant's real capability, for its own job, used to read this pipeline's.
    let theirs = &session.capability;
    t.refused(
        "another job's capability, for the trainer's job",
        worker_rpc.stream_batches(stream(PIPELINE, PIPELINE, 0, theirs)).await,
    );
    t.refused(
        "another pipeline's capability",
        worker_rpc.stream_batches(stream(PIPELINE, "x", 0, theirs)).await,
    );

    // Transport: plaintext, and a client certificate from another CA, to both servers. Each
    // probe carries credentials the service would accept (the owner's token, a valid
    // capability), so only the transport can refuse it.
    let probe = Capability { job: "probe".into(), consumer: 7, ..capability.clone() };
    let probe = Probe { owner: run.key.mint(Role::Owner, ANY), capability: signer.sign(&probe) };
    for (server, address, worker) in
        [("dispatcher", &run.dispatcher, false), ("worker", &real_worker.address, true)]
    {
        let plain = Endpoint::from_shared(format!("http://{address}")).map_err(|e| e.to_string());
        let plain = match plain {
            Ok(endpoint) => endpoint
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(10))
                .connect()
                .await
                .map_err(|e| format!("{e:?}")),
            Err(e) => Err(e),
        };
        t.handshake_fails(&format!("plaintext to the {server}"), probe.call(plain, worker).await);
        let stranger = Authority::generate("someone else's CA", HOUR).expect("a CA");
        let leaf = stranger.issue(Role::Owner, ANY, &[], HOUR).expect("a leaf");
        let foreign = run.channel(address, Some((&leaf.cert_pem, &leaf.key_pem))).await;
        t.handshake_fails(
            &format!("another CA's certificate at the {server}"),
            probe.call(foreign, worker).await,
        );
    }

    let after = snapshot(&mut owner).await;
    stop.store(true, Ordering::Relaxed);
    alive.await.expect("the other tenant's heartbeats");
    assert_eq!(after, before, "an attack changed the dispatcher's state");
    t
}

/// A call the service would serve, over a connection only the transport can refuse.
struct Probe {
    owner: String,
    capability: String,
}

impl Probe {
    /// Reads the pipeline from the dispatcher with the owner's token, or opens a stream at the
    /// worker with a valid capability, over `channel`.
    async fn call(&self, channel: Result<Channel, String>, worker: bool) -> Result<(), String> {
        let channel = channel?;
        if worker {
            let request = stream(PIPELINE, "probe", 7, &self.capability);
            return WorkerClient::new(channel)
                .stream_batches(request)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
        }
        let bearer = Bearer::new(Some(&self.owner)).map_err(|e| e.to_string())?;
        let mut rpc = DispatcherClient::with_interceptor(channel, bearer);
        rpc.get_pipeline(pb::GetPipelineRequest { name: PIPELINE.into() })
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
