//! The runners of one pipeline: one per compute thread, started together when the engine opens,
//! each with every Python stage of the pipeline imported once. A runner that dies is replaced
//! when the next call needs one. When the executor's tuner changes the compute threads, the pool
//! follows ([`Runners::resize`]): a call starts a new runner while fewer than the size live, and a
//! runner coming back to a pool over its size ends.

use super::interpreter::Interpreter;
use super::runner::{Hello, Runner, Setup, StageFacts, StartError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

struct Idle {
    runners: Vec<Runner>,
    /// Runners started and not discarded (idle or lent).
    live: usize,
}

/// A pool of Python runners.
pub struct Runners {
    interpreter: Interpreter,
    setup: Setup,
    /// Runners wanted: one per compute thread.
    size: AtomicUsize,
    idle: Mutex<Idle>,
    returned: Condvar,
    facts: Vec<StageFacts>,
    versions: (String, String),
}

impl Runners {
    /// Starts `size` runners at once (importing takes most of the time, so they import in
    /// parallel).
    pub fn start(interpreter: Interpreter, setup: Setup, size: usize) -> Result<Runners, StartError> {
        let size = size.max(1);
        let started: Vec<Result<(Runner, Hello), StartError>> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                (0..size).map(|_| scope.spawn(|| Runner::start(&interpreter, &setup))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(StartError::Interpreter {
                            interpreter: interpreter.to_string(),
                            message: "the thread starting it panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut runners = Vec::with_capacity(size);
        let mut hello = None;
        for result in started {
            let (runner, h) = result?;
            runners.push(runner);
            hello.get_or_insert(h);
        }
        let hello = hello.ok_or_else(|| StartError::Interpreter {
            interpreter: interpreter.to_string(),
            message: "no runner started".into(),
        })?;
        tracing::info!(
            runners = size,
            python = %hello.python,
            numpy = %hello.numpy,
            interpreter = %interpreter,
            "Python stages ready"
        );
        Ok(Runners {
            interpreter,
            setup,
            size: AtomicUsize::new(size),
            idle: Mutex::new(Idle { live: runners.len(), runners }),
            returned: Condvar::new(),
            facts: hello.stages,
            versions: (hello.python, hello.numpy),
        })
    }

    /// What each stage's import found.
    pub fn facts(&self) -> &[StageFacts] {
        &self.facts
    }

    /// Python's and NumPy's versions.
    pub fn versions(&self) -> (&str, &str) {
        (&self.versions.0, &self.versions.1)
    }

    /// Runners wanted from now on (at least 1): more start as calls need them, and those over the
    /// size end as they come back.
    pub fn resize(&self, size: usize) {
        self.size.store(size.max(1), Ordering::Release);
        let mut idle = self.lock();
        let mut ending = Vec::new();
        while idle.live > size.max(1)
            && let Some(runner) = idle.runners.pop()
        {
            idle.live -= 1;
            ending.push(runner);
        }
        drop(idle);
        self.returned.notify_all();
        // Outside the lock: each waits for its process to end.
        drop(ending);
    }

    fn lock(&self) -> MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A runner for one call: an idle one, a new one when fewer than `size` live, else the next
    /// one returned.
    pub fn checkout(&self) -> Result<Lent<'_>, StartError> {
        let mut idle = self.lock();
        loop {
            if let Some(runner) = idle.runners.pop() {
                return Ok(Lent { pool: self, runner: Some(runner) });
            }
            if idle.live < self.size.load(Ordering::Acquire) {
                idle.live += 1;
                drop(idle);
                return match Runner::start(&self.interpreter, &self.setup) {
                    Ok((runner, _)) => Ok(Lent { pool: self, runner: Some(runner) }),
                    Err(e) => {
                        self.lock().live -= 1;
                        self.returned.notify_one();
                        Err(e)
                    }
                };
            }
            idle = self.returned.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A runner lent for one call; it goes back to the pool when dropped, unless discarded.
pub struct Lent<'a> {
    pool: &'a Runners,
    runner: Option<Runner>,
}

impl Lent<'_> {
    /// The runner.
    pub fn runner(&mut self) -> Option<&mut Runner> {
        self.runner.as_mut()
    }

    /// Drops the runner (it died); a new one starts when a call needs it.
    pub fn discard(mut self) {
        if self.runner.take().is_some() {
            self.pool.lock().live -= 1;
            self.pool.returned.notify_one();
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(runner) = self.runner.take() {
            let mut idle = self.pool.lock();
            if idle.live > self.pool.size.load(Ordering::Acquire) {
                // The pool shrank: this runner ends (outside the lock: it waits for the process).
                idle.live -= 1;
                drop(idle);
                drop(runner);
            } else {
                idle.runners.push(runner);
                drop(idle);
            }
            self.pool.returned.notify_one();
        }
    }
}
