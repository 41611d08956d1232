//! What every reconcile shares: the API client, the dispatcher this operator hosts, the
//! settings, the autoscalers of the control-plane host, and what the operator remembers about
//! each pipeline between reconciles (the registered generation, which decisions were already
//! published).

use crate::config::OperatorConfig;
use crate::credentials::Shared;
use crate::events::Notifier;
use crate::pool::Sizing;
use crate::python::python_image;
use granary_dispatcher::Dispatcher;
use granary_dispatcher::host::Autoscalers;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// The dispatcher this operator hosts.
    pub dispatcher: Dispatcher,
    /// The pipelines' autoscalers, run by the control-plane host (by dispatcher key).
    pub autoscalers: Autoscalers,
    /// Settings.
    pub config: OperatorConfig,
    /// The image of workers of pipelines with `python.map` stages and no `spec.workers.image`:
    /// the `-python` variant of the worker image unless the settings name one.
    pub python_image: String,
    /// Publishes Events.
    pub notifier: Notifier,
    /// With security on: the CA and master key each pipeline's Secrets come from.
    pub credentials: Option<Shared>,
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
    /// Scaling decisions already published.
    pub scalings_published: u64,
    /// The cache decision already published.
    pub cache_published: Option<String>,
    /// Whether completion was published.
    pub completion_published: bool,
    /// Whether the pipeline's failure was published.
    pub failure_published: bool,
    /// When status was last written.
    pub status_written: Option<Instant>,
    /// The failure of the last reconcile, published as an Event; `None` after a success.
    pub reconcile_failure: Option<String>,
    /// Reconciles failed in a row since the last success: how long the next retry waits.
    pub failures: u32,
}

impl Context {
    /// A context for the given parts.
    pub fn new(
        client: kube::Client,
        dispatcher: Dispatcher,
        autoscalers: Autoscalers,
        config: OperatorConfig,
        notifier: Notifier,
    ) -> Context {
        let python_image = python_image(config.workers.python_image.as_deref(), &config.workers.image);
        Context {
            client,
            dispatcher,
            autoscalers,
            config,
            python_image,
            notifier,
            credentials: None,
            tracked: Mutex::new(HashMap::new()),
        }
    }

    /// This context, writing each pipeline's worker and trainer Secrets from `credentials` and
    /// mounting the workers' into their pods.
    pub fn with_credentials(mut self, credentials: Shared) -> Context {
        self.credentials = Some(credentials);
        self
    }

    /// The remembered pipelines; never held across an await.
    pub fn tracked(&self) -> MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the record of `key` (created empty, or afresh, its autoscaler stopped, when
    /// `uid` differs).
    pub fn with<T>(&self, key: &str, uid: &str, f: impl FnOnce(&mut Tracked) -> T) -> T {
        let mut tracked = self.tracked();
        let entry = tracked.entry(key.to_string()).or_default();
        if entry.uid != uid {
            if !entry.uid.is_empty() {
                self.autoscalers.stop(key);
            }
            *entry = Tracked { uid: uid.to_string(), ..Tracked::default() };
        }
        f(entry)
    }

    /// Forgets `key`, stopping its autoscaler.
    pub fn forget(&self, key: &str) {
        self.autoscalers.stop(key);
        self.tracked().remove(key);
    }
}
