//! The worker pool the dispatcher (and the autoscaler through it) sizes: `scale_to(n)` and
//! `current()`. Locally the pool is child processes of `granary worker`; under Kubernetes it is
//! a Deployment's scale.

use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command};
use std::time::Duration;

/// A failure changing the pool.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PoolError(pub String);

/// A boxed future, so pools are usable as trait objects.
pub type PoolFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, PoolError>> + Send + 'a>>;

/// A set of workers that can be resized.
pub trait WorkerPool: Send {
    /// Starts or stops workers until `n` run. Stopped workers drain (finish or give back their
    /// leases) before they exit.
    fn scale_to(&mut self, n: u32) -> PoolFuture<'_, ()>;
    /// Workers running now (started and not exited).
    fn current(&mut self) -> PoolFuture<'_, u32>;
}

/// Workers as local child processes: `program args…`, one process each.
pub struct ProcessPool {
    program: std::path::PathBuf,
    args: Vec<String>,
    unset: Vec<String>,
    children: Vec<Child>,
    /// Set by `shutdown` and `stop_within`: the pool starts nothing more (an autoscaler still
    /// finishing an evaluation would otherwise start workers nobody stops).
    stopped: bool,
}

impl ProcessPool {
    /// A pool that starts workers with `program args…` (e.g. the `granary` binary with
    /// `worker --dispatcher 127.0.0.1:PORT`).
    pub fn new(program: impl Into<std::path::PathBuf>, args: Vec<String>) -> ProcessPool {
        ProcessPool { program: program.into(), args, unset: Vec::new(), children: Vec::new(), stopped: false }
    }

    /// Starts workers without these environment variables (settings of this process that must
    /// not carry over, such as an address only one process can bind).
    pub fn without_env(mut self, names: &[&str]) -> ProcessPool {
        self.unset = names.iter().map(|n| n.to_string()).collect();
        self
    }

    fn reap(&mut self) {
        self.children.retain_mut(|c| match c.try_wait() {
            Ok(Some(status)) => {
                tracing::warn!(pid = c.id(), %status, "worker process exited");
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
    }

    fn resize(&mut self, n: u32) -> Result<(), PoolError> {
        self.reap();
        if self.stopped && n > 0 {
            return Err(PoolError("the worker pool is stopped; it starts no more workers".into()));
        }
        while self.children.len() < n as usize {
            let mut command = Command::new(&self.program);
            command.args(&self.args);
            for name in &self.unset {
                command.env_remove(name);
            }
            let child = command
                .spawn()
                .map_err(|e| PoolError(format!("cannot start worker `{}`: {e}", self.program.display())))?;
            tracing::info!(pid = child.id(), "worker process started");
            self.children.push(child);
        }
        while self.children.len() > n as usize {
            if let Some(child) = self.children.pop() {
                terminate(child);
            }
        }
        Ok(())
    }

    /// Stops every worker (SIGTERM, so they drain) and reaps them in the background.
    pub fn shutdown(&mut self) {
        self.stopped = true;
        for child in self.children.drain(..) {
            terminate(child);
        }
    }

    /// Stops every worker and waits for them: SIGTERM so they drain, then SIGKILL for any still
    /// running after `grace` (a drain can wait on consumers that are gone).
    pub async fn stop_within(&mut self, grace: Duration) {
        self.stopped = true;
        let mut running: Vec<Child> = self.children.drain(..).collect();
        for child in &running {
            signal(child.id(), libc::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            running.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            if running.is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for mut child in running {
            tracing::info!(
                pid = child.id(),
                grace_s = grace.as_secs_f64(),
                "worker still draining; killing it"
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid we own and a valid signal number has no memory effects.
    let _ = unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// Asks a worker to drain and exit (SIGTERM), and reaps it on a background thread.
fn terminate(mut child: Child) {
    let pid = child.id();
    signal(pid, libc::SIGTERM);
    std::thread::spawn(move || {
        let _ = child.wait();
        tracing::info!(pid, "worker process stopped");
    });
}

impl Drop for ProcessPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl WorkerPool for ProcessPool {
    fn scale_to(&mut self, n: u32) -> PoolFuture<'_, ()> {
        let result = self.resize(n);
        Box::pin(async move { result })
    }

    fn current(&mut self) -> PoolFuture<'_, u32> {
        self.reap();
        let n = self.children.len() as u32;
        Box::pin(async move { Ok(n) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stopped_pool_starts_nothing_more() {
        let mut pool = ProcessPool::new("sleep", vec!["30".into()]);
        pool.scale_to(1).await.unwrap();
        assert_eq!(pool.current().await.unwrap(), 1);
        pool.stop_within(Duration::from_secs(5)).await;
        let e = pool.scale_to(2).await.unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
        assert_eq!(pool.current().await.unwrap(), 0);
        pool.scale_to(0).await.unwrap();
    }
}
