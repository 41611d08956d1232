//! Background tasks that stop when their owner is dropped.

use std::future::Future;

use tokio::task::JoinHandle;

/// A spawned task, aborted when the guard is dropped.
#[derive(Debug)]
pub(crate) struct TaskGuard<T>(JoinHandle<T>);

impl<T: Send + 'static> TaskGuard<T> {
    /// Spawns `future` on the current runtime.
    pub(crate) fn spawn(future: impl Future<Output = T> + Send + 'static) -> TaskGuard<T> {
        TaskGuard(tokio::spawn(future))
    }

    /// Whether the task ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Waits for the task's result; `None` if it panicked or was aborted. Cancel-safe: the task
    /// keeps running if this future is dropped.
    pub(crate) async fn join(&mut self) -> Option<T> {
        (&mut self.0).await.ok()
    }
}

impl<T> Drop for TaskGuard<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
