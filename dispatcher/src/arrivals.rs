//! Trainer arrivals by pipeline: the dispatcher signals one when a client registers, and the
//! pipeline's autoscaler, waiting on it, evaluates at once when its pool is at zero, so a trainer
//! that connects to an idle pipeline starts workers without waiting a whole policy period.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Notify;

/// One signal per pipeline name, kept for the dispatcher's life (a pipeline registered again
/// keeps its autoscaler's signal).
#[derive(Default)]
pub(crate) struct Arrivals {
    by_pipeline: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Arrivals {
    /// The signal of `pipeline`, made on first use.
    pub(crate) fn of(&self, pipeline: &str) -> Arc<Notify> {
        let mut map = self.by_pipeline.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(pipeline.to_string()).or_default())
    }

    /// A trainer registered for `pipeline`: wakes its waiter, or the next one to wait (an
    /// arrival during an evaluation is not lost). Nothing when nobody ever waited.
    pub(crate) fn arrived(&self, pipeline: &str) {
        let map = self.by_pipeline.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = map.get(pipeline) {
            signal.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn an_arrival_wakes_the_waiter_of_its_pipeline_only() {
        let arrivals = Arrivals::default();
        let (p, q) = (arrivals.of("p"), arrivals.of("q"));
        arrivals.arrived("p");
        arrivals.arrived("nobody-waits");
        // The permit is kept for the next wait: it completes at once, and only once.
        assert!(p.notified().now_or_never().is_some());
        assert!(p.notified().now_or_never().is_none());
        assert!(q.notified().now_or_never().is_none(), "q heard nothing");
        assert!(Arc::ptr_eq(&p, &arrivals.of("p")), "one signal per pipeline");
    }
}
