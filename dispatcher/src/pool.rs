//! The worker pool the dispatcher (and the autoscaler through it) sizes: `scale_to(n)` and
//! `current()`. Locally the pool is child processes of `granary worker`; under Kubernetes it is
//! a Deployment's scale.
//!
//! Local workers end with the process that started them, however it ends (even SIGKILL): on
//! Linux each child asks for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`). The kernel sends
//! it when the *thread* that forked the child exits, so children are forked on one thread that
//! lives as long as the process, never on a pool thread that may retire when idle. SIGKILL, not
//! SIGTERM: the dispatcher they would drain towards died with the parent.

use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
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
            end_with_this_process(&mut command);
            let child = spawn(command)
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

/// A command to start and where to send the result.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Starts `command` on the spawner thread, which lives as long as the process (it waits on a
/// channel whose sender is never dropped), so that a child's parent-death signal fires when the
/// process ends and not before. Without that thread (it could not be started), starts it here.
fn spawn(mut command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, received) = mpsc::channel::<SpawnRequest>();
        let started = std::thread::Builder::new().name("granary-spawner".into()).spawn(move || {
            for (mut command, reply) in received {
                let _ = reply.send(command.spawn());
            }
        });
        match started {
            Ok(_) => Some(requests),
            Err(e) => {
                tracing::warn!("cannot start the spawner thread ({e}); workers may outlive this process");
                None
            }
        }
    });
    let Some(spawner) = spawner else { return command.spawn() };
    let (reply, result) = mpsc::channel();
    spawner.send((command, reply)).map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    result.recv().map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}

/// Makes the child die (SIGKILL) when this process does: parent-death signal, then a check that
/// the parent did not die before the signal was asked for (the child would then be an orphan
/// that no signal ever reaches).
#[cfg(target_os = "linux")]
fn end_with_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure only makes two system calls and builds errors
    // that do not allocate, as `pre_exec` requires.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: workers stop when they are stopped.
#[cfg(not(target_os = "linux"))]
fn end_with_this_process(_command: &mut Command) {}

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

    /// Children are forked on a thread that outlives the one asking for them: their parent-death
    /// signal must not fire when a short-lived thread (such as a runtime's idle blocking thread)
    /// exits.
    #[tokio::test]
    async fn workers_outlive_the_thread_that_started_them() {
        let mut pool = ProcessPool::new("sleep", vec!["30".into()]);
        let mut pool = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(pool.scale_to(2)).unwrap();
            pool
        })
        .join()
        .unwrap();
        // Had the children been forked on that thread, they would be killed by now or soon:
        // look for a while (bounded in time and count).
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        for _ in 0..50 {
            assert_eq!(pool.current().await.unwrap(), 2, "a worker died with the thread that started it");
            if std::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pool.stop_within(Duration::from_secs(5)).await;
        assert_eq!(pool.current().await.unwrap(), 0);
    }
}
