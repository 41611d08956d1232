//! What every reconcile shares: the API client, the dispatcher this operator hosts, the
//! settings, and what the operator remembers about each pipeline between reconciles (the
//! registered generation, its autoscaler, which decisions were already published).

use crate::config::OperatorConfig;
use crate::events::Notifier;
use crate::pool::Sizing;
use granary_dispatcher::Dispatcher;
use granary_dispatcher::autoscaler::Scaling;
use granary_dispatcher::exposition::Exposition;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use tokio::sync::oneshot;

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// The dispatcher this operator hosts.
    pub dispatcher: Dispatcher,
    /// Settings.
    pub config: OperatorConfig,
    /// Publishes Events.
    pub notifier: Notifier,
    /// The metrics the autoscalers report through, when served.
    pub exposition: Option<Arc<Exposition>>,
    tracked: Mutex<HashMap<String, Tracked>>,
}

/// What the operator remembers about one pipeline (by its dispatcher key `namespace/name`).
#[derive(Default)]
pub struct Tracked {
    /// The uid of the resource, so a re-created pipeline of the same name starts afresh.
    pub uid: String,
    /// Generation last reconciled.
    pub generation: Option<i64>,
    /// Whether that generation is registered with the dispatcher.
    pub registered: bool,
    /// Whether any generation was ever registered (its workers may still serve).
    pub ever_registered: bool,
    /// The last problem published as an Event, so a repeat is not published again.
    pub problem: Option<String>,
    /// The sizing applied.
    pub sizing: Option<Sizing>,
    /// The autoscaler, for `policy: auto`.
    pub autoscaler: Option<AutoscalerHandle>,
    /// Scaling decisions already published.
    pub scalings_published: u64,
    /// The cache decision already published.
    pub cache_published: Option<String>,
    /// Whether completion was published.
    pub completion_published: bool,
    /// When status was last written.
    pub status_written: Option<Instant>,
    /// The failure of the last reconcile, published as an Event; `None` after a success.
    pub reconcile_failure: Option<String>,
}

/// A running autoscaler.
pub struct AutoscalerHandle {
    /// Stops it.
    pub stop: oneshot::Sender<()>,
    /// Its report.
    pub scaling: Scaling,
}

impl AutoscalerHandle {
    /// Stops the autoscaler (nothing happens when it already ended).
    pub fn stop(self) {
        let _ = self.stop.send(());
    }
}

impl Context {
    /// A context for the given parts.
    pub fn new(
        client: kube::Client,
        dispatcher: Dispatcher,
        config: OperatorConfig,
        notifier: Notifier,
    ) -> Context {
        Context {
            client,
            dispatcher,
            config,
            notifier,
            exposition: None,
            tracked: Mutex::new(HashMap::new()),
        }
    }

    /// Reports each autoscaler's target and decisions through `exposition`.
    pub fn with_exposition(self, exposition: Arc<Exposition>) -> Context {
        Context { exposition: Some(exposition), ..self }
    }

    /// The remembered pipelines; never held across an await.
    pub fn tracked(&self) -> MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the record of `key` (created empty, or afresh when `uid` differs).
    pub fn with<T>(&self, key: &str, uid: &str, f: impl FnOnce(&mut Tracked) -> T) -> T {
        let mut tracked = self.tracked();
        let entry = tracked.entry(key.to_string()).or_default();
        if entry.uid != uid {
            if let Some(old) = entry.autoscaler.take() {
                old.stop();
            }
            *entry = Tracked { uid: uid.to_string(), ..Tracked::default() };
        }
        f(entry)
    }

    /// Forgets `key`, stopping its autoscaler.
    pub fn forget(&self, key: &str) {
        self.stop_autoscaler(key);
        self.tracked().remove(key);
    }

    /// Stops the autoscaler of `key`, if one runs, and drops its metrics.
    pub fn stop_autoscaler(&self, key: &str) {
        if let Some(exposition) = &self.exposition {
            exposition.untrack_scaling(key);
        }
        let running = self.tracked().get_mut(key).and_then(|t| t.autoscaler.take());
        if let Some(a) = running {
            a.stop();
        }
    }

    /// Stops every autoscaler (on shutdown or lost leadership).
    pub fn stop_all(&self) {
        for t in self.tracked().values_mut() {
            if let Some(a) = t.autoscaler.take() {
                a.stop();
            }
        }
    }
}
