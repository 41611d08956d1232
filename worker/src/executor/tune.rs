//! Tuning the compute parallelism while the pipeline runs, as tf.data's autotune does for a map's
//! parallelism: a hill climb on the measured element rate.
//!
//! A compute thread runs every stage of an element, so no stage starves another of threads; but a
//! thread that waits inside a stage leaves its core idle. A Python stage's thread waits on its
//! runner process, and a function that waits itself (a lookup over the network, a sleep, a lock)
//! leaves both idle: with one thread per core the pipeline then runs far below the machine. The
//! tuner adds one compute thread (with one more Python runner) at a time while the threads are the
//! bottleneck (elements wait for a thread), keeps it only when the element rate rose by
//! [`GAIN`], and otherwise retires it and holds for [`HOLD`] periods before trying again. It never
//! goes below the threads the execution started with, nor above its `most_threads`.
//!
//! The output is the same for any thread count (see the executor), so tuning changes only speed.

use super::feed::Taker;
use super::{Done, Plan, StageTimes, Work, compute, spawn};
use crossbeam_channel::Sender;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long each measurement lasts.
const PERIOD: Duration = Duration::from_millis(500);
/// The rise in element rate an added thread must bring to stay.
const GAIN: f64 = 1.05;
/// Periods to wait after a thread did not pay, before trying again.
const HOLD: u32 = 10;

/// What the climb does next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Step {
    /// Nothing: keep the threads as they are.
    Keep,
    /// Add a thread.
    Add,
    /// Retire the thread added last.
    Retire,
}

/// The hill climb, apart from the threads it moves: fed one element rate per period.
#[derive(Debug)]
pub(super) struct Climb {
    /// Threads now.
    threads: usize,
    least: usize,
    most: usize,
    phase: Phase,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Measuring the rate with the threads as they are.
    Steady,
    /// A thread was just added: this period's rate is not yet its (a new Python runner imports
    /// its modules first). Holds the rate before it.
    Warming(f64),
    /// Measuring the added thread, against the rate before it.
    Probing(f64),
    /// Waiting this many more periods after a thread that did not pay.
    Holding(u32),
}

impl Climb {
    /// A climb from `threads` up to `most`.
    pub(super) fn new(threads: usize, most: usize) -> Climb {
        Climb { threads, least: threads, most: most.max(threads), phase: Phase::Steady }
    }

    /// Threads now.
    pub(super) fn threads(&self) -> usize {
        self.threads
    }

    /// The next step after a period that computed at `rate` elements a second; `starved` says
    /// whether elements waited for a thread throughout it (the threads are the bottleneck).
    pub(super) fn step(&mut self, rate: f64, starved: bool) -> Step {
        match self.phase {
            Phase::Warming(before) => {
                self.phase = Phase::Probing(before);
                Step::Keep
            }
            Phase::Probing(before) => {
                if rate >= before * GAIN {
                    self.phase = Phase::Steady;
                    Step::Keep
                } else {
                    self.threads -= 1;
                    self.phase = Phase::Holding(HOLD);
                    Step::Retire
                }
            }
            Phase::Holding(left) => {
                self.phase = if left <= 1 { Phase::Steady } else { Phase::Holding(left - 1) };
                Step::Keep
            }
            Phase::Steady if starved && self.threads < self.most && rate > 0.0 => {
                self.threads += 1;
                self.phase = Phase::Warming(rate);
                Step::Add
            }
            Phase::Steady => Step::Keep,
        }
    }

    /// The least threads: those the execution started with.
    pub(super) fn least(&self) -> usize {
        self.least
    }
}

/// Sets its flag when dropped: the reader holds one, so that the tuner knows when it ended, even
/// by a panic (the tuner would otherwise hold the channels open and hide it).
pub(super) struct SetOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What the tuner needs of the execution.
pub(super) struct Tuned {
    pub(super) plan: Arc<Plan>,
    pub(super) work: Taker<Work>,
    pub(super) done: Sender<Done>,
    pub(super) times: Arc<StageTimes>,
    /// Set once the reader has queued its last element: no thread is needed any more.
    pub(super) read_all: Arc<AtomicBool>,
    /// Most compute threads wanted at once so far.
    pub(super) peak: Arc<AtomicUsize>,
}

/// Runs the climb from `threads` up to `most` until the reader is done, then waits for the threads
/// it started. A panic of one of them is passed on.
pub(super) fn run(tuned: Tuned, threads: usize, most: usize) {
    let mut climb = Climb::new(threads, most);
    let mut added: Vec<JoinHandle<()>> = Vec::new();
    let mut last = tuned.times.totals().1;
    'periods: loop {
        // Bounded: each period is 10 naps, and the reader's end ends the loop.
        let mut starved = true;
        for _ in 0..10 {
            std::thread::sleep(PERIOD / 10);
            if tuned.read_all.load(Ordering::Acquire) {
                break 'periods;
            }
            starved &= tuned.work.len() >= climb.threads();
        }
        join_finished(&mut added);
        let now = tuned.times.totals().1;
        let rate = now.saturating_sub(last) as f64 / PERIOD.as_secs_f64();
        last = now;
        match climb.step(rate, starved) {
            Step::Keep => {}
            Step::Add => {
                let n = climb.threads();
                widen(&tuned.plan, n);
                tuned.peak.fetch_max(n, Ordering::AcqRel);
                tuned.times.threads.store(n, Ordering::Release);
                // The thread numbered `index` runs while the threads wanted (the count in
                // `times`) are more than its number: a retirement stops it before its next item.
                let index = n - 1;
                let (plan, work, done, times) = (
                    Arc::clone(&tuned.plan),
                    tuned.work.clone(),
                    tuned.done.clone(),
                    Arc::clone(&tuned.times),
                );
                added.push(spawn(&format!("granary-compute-{index}"), move || {
                    compute(&plan, &work, &done, &times, &|| index < times.threads())
                }));
                tracing::debug!(threads = n, rate, "tuning: added a compute thread");
            }
            Step::Retire => {
                let n = climb.threads();
                tuned.times.threads.store(n, Ordering::Release);
                widen(&tuned.plan, n);
                tracing::debug!(threads = n, rate, "tuning: the added thread did not pay; retired it");
            }
        }
    }
    if climb.threads() > climb.least() {
        tracing::info!(threads = climb.threads(), from = climb.least(), "tuning: compute threads");
    }
    // The threads end once the work queue is empty and closed; this thread's ends go first.
    drop(tuned);
    for handle in added {
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Joins the added threads that ended (retired ones), passing a panic on, so that a long run's
/// retirements do not pile up.
fn join_finished(added: &mut Vec<JoinHandle<()>>) {
    let (ended, running): (Vec<_>, Vec<_>) = added.drain(..).partition(JoinHandle::is_finished);
    *added = running;
    for handle in ended {
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Lets each stage use `threads` at once (a Python stage's runner pool).
fn widen(plan: &Plan, threads: usize) {
    for stage in &plan.stages {
        stage.op.set_threads(threads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_pays_stays_and_the_climb_goes_on_while_elements_wait() {
        let mut c = Climb::new(2, 4);
        assert_eq!(c.step(100.0, true), Step::Add);
        assert_eq!(c.threads(), 3);
        assert_eq!(c.step(110.0, true), Step::Keep, "warming: the new runner imports first");
        assert_eq!(c.step(140.0, true), Step::Keep, "40% more: it stays");
        assert_eq!(c.step(140.0, true), Step::Add);
        assert_eq!(c.step(150.0, true), Step::Keep);
        assert_eq!(c.step(180.0, true), Step::Keep);
        assert_eq!(c.threads(), 4);
        assert_eq!(c.step(180.0, true), Step::Keep, "at the most");
    }

    #[test]
    fn a_thread_that_does_not_pay_is_retired_and_the_climb_holds() {
        let mut c = Climb::new(2, 8);
        assert_eq!(c.step(100.0, true), Step::Add);
        assert_eq!(c.step(100.0, true), Step::Keep);
        assert_eq!(c.step(103.0, true), Step::Retire, "3% is noise");
        assert_eq!(c.threads(), 2);
        for _ in 0..HOLD {
            assert_eq!(c.step(100.0, true), Step::Keep, "holding");
        }
        assert_eq!(c.step(100.0, true), Step::Add, "then tries again");
    }

    #[test]
    fn no_thread_is_added_while_the_threads_keep_up_or_nothing_is_computed() {
        let mut c = Climb::new(2, 8);
        assert_eq!(c.step(100.0, false), Step::Keep, "elements do not wait for a thread");
        assert_eq!(c.step(0.0, true), Step::Keep, "nothing computed: nothing to compare with");
        assert_eq!(c.threads(), 2);
        assert_eq!(c.least(), 2);
    }
}
