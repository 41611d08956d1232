//! The leases a worker holds: renewed by every heartbeat until completed, returned or revoked.

use granary_proto::v1::Lease;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A held lease and the flag that tells its producer to stop routing it.
struct Held {
    lease: Lease,
    revoked: Arc<AtomicBool>,
}

#[derive(Default)]
struct Table {
    held: BTreeMap<u64, Held>,
    /// Leases whose split is still being computed (held or not), and since when.
    producing: BTreeMap<u64, Instant>,
}

/// The lease table.
#[derive(Default)]
pub struct Leases {
    table: Mutex<Table>,
    /// Signalled whenever a lease stops being produced or held.
    changed: Notify,
}

impl Leases {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `lease` and counts it as being produced; returns its revocation flag.
    pub fn insert(&self, lease: Lease) -> Arc<AtomicBool> {
        let revoked = Arc::new(AtomicBool::new(false));
        let mut table = self.lock();
        table.producing.insert(lease.lease_id, Instant::now());
        table.held.insert(lease.lease_id, Held { lease, revoked: Arc::clone(&revoked) });
        revoked
    }

    /// Ids of the held leases.
    pub fn ids(&self) -> Vec<u64> {
        self.lock().held.keys().copied().collect()
    }

    /// The held leases.
    pub fn held(&self) -> Vec<Lease> {
        self.lock().held.values().map(|h| h.lease.clone()).collect()
    }

    /// Held leases.
    pub fn len(&self) -> usize {
        self.lock().held.len()
    }

    /// True when no lease is held.
    pub fn is_empty(&self) -> bool {
        self.lock().held.is_empty()
    }

    /// Lease `id`, while it is held.
    pub fn get(&self, id: u64) -> Option<Lease> {
        self.lock().held.get(&id).map(|h| h.lease.clone())
    }

    /// Leases whose split is still being computed.
    pub fn producing(&self) -> usize {
        self.lock().producing.len()
    }

    /// The split of `id` was computed (or abandoned); how long that took since it was leased.
    pub fn produced(&self, id: u64) -> Option<Duration> {
        let since = self.lock().producing.remove(&id);
        self.changed.notify_one();
        since.map(|s| s.elapsed())
    }

    /// Stops holding `id` (completed or returned) without revoking it.
    pub fn release(&self, id: u64) -> Option<Lease> {
        let held = self.lock().held.remove(&id);
        self.changed.notify_one();
        held.map(|h| h.lease)
    }

    /// Stops holding `ids` and tells their producers to stop routing them; returns the leases
    /// that were held.
    pub fn revoke(&self, ids: &[u64]) -> Vec<Lease> {
        let mut revoked = Vec::new();
        {
            let mut table = self.lock();
            for id in ids {
                if let Some(held) = table.held.remove(id) {
                    held.revoked.store(true, Ordering::Release);
                    revoked.push(held.lease);
                }
            }
        }
        self.changed.notify_one();
        revoked
    }

    /// Waits until a lease is produced or released (or a spurious wake-up).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}
