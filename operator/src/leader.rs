//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the leader hosts
//! the dispatcher and reconciles; the others wait, and report not ready so that the
//! `granary-dispatcher` Service reaches the leader alone.
//!
//! kube-lease-manager reports only changes of holder, and retries failed renewals without
//! reporting them: a leader cut off from the API server would go on serving after its Lease
//! expired and a successor took it. So the leader also reads the Lease itself and steps down
//! (see [`Watch::serve_until`]):
//! - at once when another replica holds it;
//! - while the API server answers, once its last renewal is [`MARGIN`] short of expiring, so
//!   that it stops before a successor can take the Lease;
//! - while the API server answers nobody, only [`OUTAGE`] after its last renewal: a successor
//!   cannot take the Lease without the API server either, and trainers keep being served
//!   through a control-plane outage. Should only this replica be cut off, a successor starts
//!   after the Lease expires, and the journal's create-only records fence this one at its next
//!   write (the successor claims a term before it serves), so the state never forks; clients
//!   drop the parts they already have, so delivery stays exactly-once.

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Seconds a Lease is valid without renewal: how long a crashed leader's successor waits.
const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry the leader renews.
const GRACE_SECONDS: u64 = 8;
/// How long before its Lease would expire a leader with no newer renewal stops serving.
const MARGIN: Duration = Duration::from_secs(4);
/// How often the leader reads its Lease, and the longest one read may take.
const POLL: Duration = Duration::from_secs(1);
/// How long after its last renewal a leader that cannot reach the API server serves on.
pub const OUTAGE: Duration = Duration::from_secs(120);

/// The last moment a leader whose Lease was last renewed at `renewed` may serve: `margin`
/// before a Lease of `lease` expires, when a successor may take it.
pub fn serve_until(renewed: SystemTime, lease: Duration, margin: Duration) -> SystemTime {
    renewed + lease.saturating_sub(margin)
}

/// What the leader saw of its Lease and of the API server.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    /// Its last renewal seen.
    pub renewed: SystemTime,
    /// Since when no read of the Lease succeeded; `None` while reads succeed.
    pub unreachable_since: Option<SystemTime>,
    /// When reads succeeded again after an outage, until a renewal newer than that is seen.
    pub answering_since: Option<SystemTime>,
}

impl Watch {
    /// The last moment the leader may serve. Normally [`serve_until`] its last renewal; while
    /// the API server has answered nobody since before that deadline, [`OUTAGE`] after the
    /// renewal; once it answers again, one renewal period (and a read) for the Lease manager
    /// to renew before the normal rule applies again.
    pub fn serve_until(&self) -> SystemTime {
        let lease = Duration::from_secs(LEASE_SECONDS);
        let normal = serve_until(self.renewed, lease, MARGIN);
        let outage = match self.unreachable_since {
            Some(since) if since <= normal => self.renewed + OUTAGE,
            _ => normal,
        };
        let renewal_period = Duration::from_secs(LEASE_SECONDS - GRACE_SECONDS) + 2 * POLL;
        let recovering = self.answering_since.map_or(normal, |back| back + renewal_period);
        normal.max(outage).max(recovering)
    }
}

/// When `lease` was last renewed by `identity`; `None` when another holds it, or nobody.
fn renewed_by(lease: &Lease, identity: &str) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    spec.renew_time.as_ref().map(|t| SystemTime::from(t.0))
}

/// A candidacy for the Lease.
pub struct Candidacy {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    leases: Api<Lease>,
    name: String,
    identity: String,
    /// When this candidate last saw itself elected.
    elected_at: SystemTime,
}

impl Candidacy {
    /// Enters the election for Lease `name` in `namespace` as `identity` (creating the Lease
    /// when missing).
    pub async fn enter(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Result<Candidacy, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client.clone(), name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        Ok(Candidacy {
            leading,
            task,
            leases: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            elected_at: SystemTime::now(),
        })
    }

    /// Completes once this candidate leads.
    pub async fn elected(&mut self) -> Result<(), LeaseManagerError> {
        self.leading
            .wait_for(|leading| *leading)
            .await
            .map(drop)
            .map_err(|_| LeaseManagerError::InconsistentState("the election stopped".into()))?;
        // The Lease was acquired a moment ago; its own renewal time replaces this at the first
        // read.
        self.elected_at = SystemTime::now();
        Ok(())
    }

    /// Completes if leadership is lost: another holds the Lease, or no renewal was seen for
    /// long enough that the Lease may expire soon (see [`serve_until`]).
    pub async fn deposed(&mut self) {
        let lapsed = lapsed(&self.leases, &self.name, &self.identity, self.elected_at);
        tokio::select! {
            _ = self.leading.wait_for(|leading| !*leading) => {}
            () = lapsed => {}
        }
    }

    /// Leaves the election, releasing the Lease if held so a successor takes over at once.
    pub async fn resign(self) {
        drop(self.leading);
        match self.task.await {
            Ok(Ok(_)) => tracing::info!("released the leader Lease"),
            Ok(Err(e)) => tracing::warn!("releasing the leader Lease: {e}"),
            Err(e) => tracing::warn!("the election task failed: {e}"),
        }
    }
}

/// Reads Lease `name` every [`POLL`] and completes once `identity` no longer holds it, or once
/// [`Watch::serve_until`] passed (at first from `since`): each renewal pushes the deadline on,
/// and the loop ends by the deadline at the latest.
async fn lapsed(leases: &Api<Lease>, name: &str, identity: &str, since: SystemTime) {
    let mut watch = Watch { renewed: since, unreachable_since: None, answering_since: None };
    loop {
        let until = watch.serve_until();
        let Ok(left) = until.duration_since(SystemTime::now()) else {
            tracing::error!(
                renewed = ?watch.renewed,
                api_unreachable_since = ?watch.unreachable_since,
                "no renewal of the leader Lease seen in time: stepping down before it can expire"
            );
            return;
        };
        tokio::time::sleep(left.min(POLL)).await;
        let read = tokio::time::timeout(POLL, leases.get(name)).await;
        let now = SystemTime::now();
        match read {
            Ok(Ok(found)) => {
                if watch.unreachable_since.take().is_some() {
                    tracing::info!("the API server answers again");
                    watch.answering_since = Some(now);
                }
                match renewed_by(&found, identity) {
                    Some(at) => {
                        watch.renewed = watch.renewed.max(at);
                        if watch.answering_since.is_some_and(|back| at >= back) {
                            watch.answering_since = None;
                        }
                    }
                    None => {
                        tracing::error!("the leader Lease is no longer this replica's: stepping down");
                        return;
                    }
                }
            }
            Ok(Err(e)) => {
                if watch.unreachable_since.is_none() {
                    tracing::warn!(
                        "cannot read the leader Lease: {e}; serving on (the journal fences a successor)"
                    );
                    watch.unreachable_since = Some(now);
                }
            }
            Err(_) => {
                if watch.unreachable_since.is_none() {
                    tracing::warn!(
                        "reading the leader Lease took over {POLL:?}; serving on (the journal fences a successor)"
                    );
                    watch.unreachable_since = Some(now);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(LEASE_SECONDS);

    #[test]
    fn a_leader_stops_serving_a_margin_before_its_lease_can_expire() {
        let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let until = serve_until(renewed, LEASE, MARGIN);
        assert_eq!(until, renewed + Duration::from_secs(11));
        assert!(until < renewed + LEASE);
        // A margin longer than the Lease leaves no time to serve at all.
        assert_eq!(serve_until(renewed, LEASE, Duration::from_secs(60)), renewed);
    }

    #[test]
    fn a_leader_renewing_on_time_is_not_deposed_between_renewals() {
        // Renewals come every LEASE - GRACE; one read later the leader has seen it, still
        // before its deadline.
        let renewed = SystemTime::UNIX_EPOCH;
        let next_renewal = renewed + Duration::from_secs(LEASE_SECONDS - GRACE_SECONDS);
        assert!(next_renewal + POLL < serve_until(renewed, LEASE, MARGIN));
    }

    #[test]
    fn an_unreachable_api_server_lets_the_leader_serve_through_an_outage_but_not_forever() {
        let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let normal = serve_until(renewed, LEASE, MARGIN);
        let quiet = Watch { renewed, unreachable_since: None, answering_since: None };
        assert_eq!(quiet.serve_until(), normal);
        // Unreachable since before the deadline: serve on, up to OUTAGE after the renewal.
        let out = Watch { unreachable_since: Some(renewed + Duration::from_secs(3)), ..quiet };
        assert_eq!(out.serve_until(), renewed + OUTAGE);
        // Unreachable only after the deadline passed: too late, the normal rule stands.
        let late = Watch { unreachable_since: Some(normal + Duration::from_secs(1)), ..quiet };
        assert_eq!(late.serve_until(), normal);
        // Answering again: one renewal period to see a renewal, then the normal rule.
        let back = renewed + Duration::from_secs(40);
        let recovering = Watch { answering_since: Some(back), ..quiet };
        assert_eq!(
            recovering.serve_until(),
            back + Duration::from_secs(LEASE_SECONDS - GRACE_SECONDS) + 2 * POLL
        );
        assert!(recovering.serve_until() < renewed + OUTAGE);
    }

    #[test]
    fn only_the_holders_own_renewals_count() {
        let lease = |holder: &str| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder, "renewTime": "2026-01-02T03:04:05.000000Z"},
            }))
            .unwrap()
        };
        let at = renewed_by(&lease("me"), "me").unwrap();
        assert_eq!(at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_767_323_045);
        assert_eq!(renewed_by(&lease("other"), "me"), None);
        assert_eq!(renewed_by(&Lease::default(), "me"), None);
    }
}
