//! The autoscalers a control-plane host runs: one per pipeline, started and stopped by name, each
//! reported through the host's metrics when it serves them.

use crate::autoscaler::{Autoscaler, Scaling, SharedPool};
use crate::exposition::Exposition;
use crate::service::Dispatcher;
use granary_policies::{GranaryConfig, GranaryPolicy, PoolConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How one pipeline's pool is autoscaled.
pub struct Autoscaling {
    /// The pool the autoscaler sizes.
    pub pool: SharedPool,
    /// Its bounds, batch size and prices.
    pub bounds: PoolConfig,
    /// How often the policy evaluates.
    pub period: Duration,
    /// The pool's target when the autoscaler starts.
    pub initial: u32,
    /// How long to wait before the first evaluation (workers that just started measure nothing).
    pub first_after: Duration,
}

/// The running autoscalers by pipeline name: cheap to clone, shared by the host and whoever
/// reconciles its pipelines.
#[derive(Clone)]
pub struct Autoscalers {
    dispatcher: Dispatcher,
    exposition: Option<Arc<Exposition>>,
    running: Arc<Mutex<Running>>,
}

#[derive(Default)]
struct Running {
    by_pipeline: HashMap<String, Handle>,
    /// Set when the host stops: no autoscaler starts after that.
    closed: bool,
}

struct Handle {
    stop: oneshot::Sender<()>,
    scaling: Scaling,
    task: JoinHandle<()>,
}

impl Autoscalers {
    /// None running yet, for pipelines of `dispatcher`; each is reported through `exposition`.
    pub fn new(dispatcher: Dispatcher, exposition: Option<Arc<Exposition>>) -> Autoscalers {
        Autoscalers { dispatcher, exposition, running: Arc::default() }
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The metrics the autoscalers report through, if any.
    pub fn exposition(&self) -> Option<&Arc<Exposition>> {
        self.exposition.as_ref()
    }

    /// Starts Granary's policy for `pipeline` (stopping the one it replaces) and returns its
    /// report; `None` once the host is stopping.
    pub fn start(&self, pipeline: &str, autoscaling: Autoscaling) -> Option<Scaling> {
        let Autoscaling { pool, bounds, period, initial, first_after } = autoscaling;
        let policy = GranaryPolicy::new(GranaryConfig::for_period(period.as_secs_f64()));
        let autoscaler = Autoscaler::new(
            self.dispatcher.clone(),
            pipeline,
            Box::new(policy),
            pool,
            bounds,
            period,
            initial,
        );
        let scaling = autoscaler.scaling();
        let mut running = self.running();
        if running.closed {
            tracing::warn!(pipeline, "the control plane is stopping; no autoscaler starts");
            return None;
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stopped = async move { drop(stopped.await) };
            tokio::pin!(stopped);
            if !first_after.is_zero() {
                tokio::select! {
                    () = &mut stopped => return,
                    () = tokio::time::sleep(first_after) => {}
                }
            }
            autoscaler.run(stopped).await;
        });
        if let Some(exposition) = &self.exposition {
            exposition.track_scaling(pipeline, scaling.clone());
        }
        let handle = Handle { stop, scaling: scaling.clone(), task };
        if let Some(old) = running.by_pipeline.insert(pipeline.to_string(), handle) {
            let _ = old.stop.send(());
        }
        Some(scaling)
    }

    /// Stops the autoscaler of `pipeline`, if one runs, and drops its metrics. Returns whether
    /// one ran.
    pub fn stop(&self, pipeline: &str) -> bool {
        if let Some(exposition) = &self.exposition {
            exposition.untrack_scaling(pipeline);
        }
        let handle = self.running().by_pipeline.remove(pipeline);
        handle.map(|h| h.stop.send(())).is_some()
    }

    /// `pipeline` runs exactly `workers` workers: its autoscaler, if any, stops, and the metrics
    /// report the fixed count.
    pub fn fixed(&self, pipeline: &str, workers: u32) {
        self.stop(pipeline);
        if let Some(exposition) = &self.exposition {
            exposition.track_fixed(pipeline, workers);
        }
    }

    /// Whether an autoscaler runs for `pipeline`.
    pub fn is_running(&self, pipeline: &str) -> bool {
        self.running().by_pipeline.contains_key(pipeline)
    }

    /// The report of `pipeline`'s autoscaler, if one runs.
    pub fn scaling(&self, pipeline: &str) -> Option<Scaling> {
        self.running().by_pipeline.get(pipeline).map(|h| h.scaling.clone())
    }

    /// Stops every autoscaler, starts none from now on, and waits up to `grace` for an
    /// evaluation in progress to finish (it may be scaling the pool).
    pub async fn stop_all(&self, grace: Duration) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut running = self.running();
            running.closed = true;
            running
                .by_pipeline
                .drain()
                .map(|(_, h)| {
                    let _ = h.stop.send(());
                    h.task
                })
                .collect()
        };
        let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
    }
}
