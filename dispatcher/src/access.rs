//! Who may do what at the dispatcher, when authentication is on (a master key is configured).
//!
//! Every request is authenticated ([`granary_security::Authenticator`]: a bearer token or a
//! CA-checked client certificate) and then authorized:
//! - registering a pipeline needs the owner;
//! - a worker's requests need a worker principal covering its pipeline, and the worker id the
//!   dispatcher issued to that principal: one principal cannot act as another's worker, and a
//!   lease's holder alone completes it or gives it back (the state checks the holder);
//! - a trainer's requests need a principal covering the pipeline; a job belongs to the
//!   principal that created it, and a client session to the principal that opened it;
//! - reading a pipeline's facts or workers needs a principal covering it, and an unknown name
//!   is answered without listing the others.
//!
//! Without a key every caller is the owner, as on `granary run`'s loopback default.

use granary_security::{Authenticator, Capability, CapabilitySigner, MasterKey, Principal, Role};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::Status;

/// How long a stream capability lasts; clients renew it with each heartbeat.
pub const CAPABILITY_TTL: Duration = Duration::from_secs(600);
/// Most principal bindings of each kind kept (worker ids, client sessions, jobs): a bound on
/// what unauthenticated-looking churn can make the dispatcher hold.
const MAX_BINDINGS: usize = 100_000;

/// The dispatcher's access control.
pub(crate) struct Access {
    auth: Authenticator,
    signer: CapabilitySigner,
    bound: Mutex<Bound>,
}

/// Which principal each worker id, client session and job belongs to.
#[derive(Default)]
struct Bound {
    workers: HashMap<String, Principal>,
    clients: HashMap<String, Principal>,
    jobs: HashMap<(String, String), Principal>,
}

fn denied(message: String) -> Status {
    Status::permission_denied(message)
}

impl Access {
    pub(crate) fn new(key: &MasterKey) -> Access {
        Access {
            auth: Authenticator::new(key.clone()),
            signer: CapabilitySigner::new(key),
            bound: Mutex::new(Bound::default()),
        }
    }

    fn bound(&self) -> std::sync::MutexGuard<'_, Bound> {
        self.bound.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Who made `request`.
    pub(crate) fn principal<T>(&self, request: &tonic::Request<T>) -> Result<Principal, Status> {
        self.auth.principal(request)
    }

    /// Whether the bindings grew to half their bound: time to drop those of workers, sessions
    /// and jobs the state no longer has.
    pub(crate) fn crowded(&self) -> bool {
        let bound = self.bound();
        [bound.workers.len(), bound.clients.len(), bound.jobs.len()]
            .into_iter()
            .any(|n| n >= MAX_BINDINGS / 2)
    }

    /// Keeps only the bindings of what the state still has.
    pub(crate) fn prune(&self, live: &crate::state::LiveIds) {
        let mut bound = self.bound();
        bound.workers.retain(|id, _| live.workers.contains(id));
        bound.clients.retain(|id, _| live.clients.contains(id));
        bound.jobs.retain(|key, _| live.jobs.contains(key));
    }

    /// The public key workers check capabilities with.
    pub(crate) fn capability_key(&self) -> Vec<u8> {
        self.signer.public_key()
    }

    /// A capability for consumer `consumer` of `job` of `pipeline`, and its expiry.
    pub(crate) fn capability(&self, pipeline: &str, job: &str, consumer: u32) -> (String, u64) {
        let expires_ms = unix_ms() + CAPABILITY_TTL.as_millis() as u64;
        let capability =
            Capability { pipeline: pipeline.to_string(), job: job.to_string(), consumer, expires_ms };
        (self.signer.sign(&capability), expires_ms)
    }
}

/// Unix milliseconds now.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Checks on one authenticated principal (`None`: authentication is off, anything goes).
pub(crate) struct Caller<'a> {
    pub(crate) access: Option<&'a Access>,
    pub(crate) who: Option<Principal>,
}

impl Caller<'_> {
    /// The owner only.
    pub(crate) fn owner(&self, what: &str) -> Result<(), Status> {
        match &self.who {
            Some(p) if p.role != Role::Owner => {
                Err(denied(format!("{what} needs the owner's credentials; a {} may not", p.role)))
            }
            _ => Ok(()),
        }
    }

    /// A principal with one of `roles` (the owner always) whose scope covers `pipeline`.
    pub(crate) fn covers(&self, pipeline: &str, roles: &[Role], what: &str) -> Result<(), Status> {
        let Some(p) = &self.who else { return Ok(()) };
        if p.role == Role::Owner {
            return Ok(());
        }
        if !roles.contains(&p.role) {
            return Err(denied(format!("{what} is not for a {}", p.role)));
        }
        if !p.covers(pipeline) {
            return Err(denied(format!(
                "{what}: these credentials are for pipeline `{}`, not this one",
                p.scope
            )));
        }
        Ok(())
    }

    /// A worker's registration for `pipeline` (empty: any): a worker principal must name the
    /// pipeline its scope covers, and a re-registration keeps its id's principal.
    pub(crate) fn register_worker(&self, worker_id: &str, pipeline: &str) -> Result<(), Status> {
        let (Some(access), Some(p)) = (self.access, &self.who) else { return Ok(()) };
        match p.role {
            Role::Owner => {}
            Role::Worker if p.scope == granary_security::token::ANY || p.scope == pipeline => {}
            Role::Worker => {
                return Err(denied(format!(
                    "this worker's credentials are for pipeline `{}`: register with `--pipeline {}`",
                    p.scope, p.scope
                )));
            }
            Role::Trainer => return Err(denied("a trainer may not register as a worker".into())),
        }
        if !worker_id.is_empty()
            && let Some(holder) = access.bound().workers.get(worker_id)
            && holder != p
        {
            return Err(denied(format!("worker id `{worker_id}` belongs to other credentials")));
        }
        Ok(())
    }

    /// Records that `worker_id` belongs to the caller.
    pub(crate) fn bind_worker(&self, worker_id: &str) -> Result<(), Status> {
        bind(self, |b| &mut b.workers, worker_id.to_string())
    }

    /// A request made as worker `worker_id`: only by the principal it was issued to.
    pub(crate) fn as_worker(&self, worker_id: &str) -> Result<(), Status> {
        let (Some(access), Some(p)) = (self.access, &self.who) else { return Ok(()) };
        match access.bound().workers.get(worker_id) {
            Some(holder) if holder == p => Ok(()),
            Some(_) => Err(denied(format!("worker id `{worker_id}` belongs to other credentials"))),
            None => Err(Status::unauthenticated(format!(
                "worker `{worker_id}` is not registered with these credentials; register again"
            ))),
        }
    }

    /// A client registration for `job` of `pipeline`: the job, once made, belongs to its maker.
    pub(crate) fn join_job(&self, pipeline: &str, job: &str) -> Result<(), Status> {
        self.covers(pipeline, &[Role::Trainer], "consuming this pipeline")?;
        let (Some(access), Some(p)) = (self.access, &self.who) else { return Ok(()) };
        let mut bound = access.bound();
        let key = (pipeline.to_string(), job.to_string());
        match bound.jobs.get(&key) {
            Some(holder) if holder != p && p.role != Role::Owner => {
                Err(denied(format!("job `{job}` belongs to other credentials; use another job name")))
            }
            Some(_) => Ok(()),
            None => {
                if bound.jobs.len() >= MAX_BINDINGS {
                    return Err(Status::resource_exhausted("too many jobs"));
                }
                bound.jobs.insert(key, p.clone());
                Ok(())
            }
        }
    }

    /// Records that client session `client_id` belongs to the caller.
    pub(crate) fn bind_client(&self, client_id: &str) -> Result<(), Status> {
        bind(self, |b| &mut b.clients, client_id.to_string())
    }

    /// A request made in client session `client_id`: only by its principal.
    pub(crate) fn as_client(&self, client_id: &str) -> Result<(), Status> {
        let (Some(access), Some(p)) = (self.access, &self.who) else { return Ok(()) };
        match access.bound().clients.get(client_id) {
            Some(holder) if holder == p || p.role == Role::Owner => Ok(()),
            Some(_) => Err(denied(format!("client session `{client_id}` belongs to other credentials"))),
            None => Err(Status::unauthenticated(format!(
                "client session `{client_id}` is not open with these credentials; register again"
            ))),
        }
    }
}

fn bind(
    caller: &Caller<'_>,
    map: impl Fn(&mut Bound) -> &mut HashMap<String, Principal>,
    id: String,
) -> Result<(), Status> {
    let (Some(access), Some(p)) = (caller.access, &caller.who) else { return Ok(()) };
    let mut bound = access.bound();
    let map = map(&mut bound);
    if map.len() >= MAX_BINDINGS && !map.contains_key(&id) {
        return Err(Status::resource_exhausted("too many registrations"));
    }
    map.insert(id, p.clone());
    Ok(())
}
