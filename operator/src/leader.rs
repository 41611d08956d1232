//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the leader hosts
//! the dispatcher and reconciles; the others wait, and report not ready so that the
//! `granary-dispatcher` Service reaches the leader alone.

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Seconds a Lease is valid without renewal: how long a crashed leader's successor waits.
const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry the leader renews.
const GRACE_SECONDS: u64 = 5;

/// A candidacy for the Lease.
pub struct Candidacy {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
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
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        Ok(Candidacy { leading, task })
    }

    /// Completes once this candidate leads.
    pub async fn elected(&mut self) -> Result<(), LeaseManagerError> {
        self.leading
            .wait_for(|leading| *leading)
            .await
            .map(drop)
            .map_err(|_| LeaseManagerError::InconsistentState("the election stopped".into()))
    }

    /// Completes if leadership is lost.
    pub async fn deposed(&mut self) {
        let _ = self.leading.wait_for(|leading| !*leading).await;
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
