//! The executor: runs split tasks through the operators on every core, in a deterministic order,
//! with a byte budget on the data in flight.
//!
//! Three kinds of threads form a pipeline:
//! - the reader streams each split's elements from the store, in task order, waiting on the
//!   budget before each element (prefetch and backpressure);
//! - `threads` compute threads apply the operators to elements in any order, each element with
//!   its own seeded random stream;
//! - the assembler restores task order, shuffles within each split, and stacks batches.
//!
//! Because randomness is per element and order is restored before shuffling, the output is the
//! same for any thread count, and a split re-run yields the same batches.

mod assemble;

use crate::batch::{Batch, BatchError};
use crate::budget::{Budget, Permit};
use crate::element::Element;
use crate::ops::Operator;
use crate::seed::SeededRng;
use crate::source::{Source, SourceError};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::runtime::Handle;

/// One stage ready to run.
pub struct Stage {
    /// Stage name for messages (`name` or `op`).
    pub name: String,
    /// Field path of the stage in the spec (`spec.stages[2]`).
    pub path: String,
    /// The implementation.
    pub op: Box<dyn Operator>,
}

/// Everything the executor needs to know about the pipeline.
pub struct Plan {
    /// Stages, in order.
    pub stages: Vec<Stage>,
    /// Pipeline seed.
    pub seed: u64,
    /// Elements per batch.
    pub batch_size: usize,
    /// Shuffle buffer size within a split; 0 keeps the order.
    pub shuffle_buffer: usize,
}

/// One split of one epoch to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Epoch, counted from 0.
    pub epoch: u32,
    /// Index of the split in the source's listing.
    pub split: usize,
}

/// Executor settings.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    /// Compute threads.
    pub threads: usize,
    /// Bytes of data in flight (read ahead, being computed, and finished batches) before the
    /// reader waits.
    pub prefetch_bytes: usize,
}

/// What the executor produces, in task order.
#[derive(Debug)]
pub enum Output {
    /// A batch of one split. Each split yields full batches and then, if its element count is
    /// not a multiple of the batch size, one smaller `tail` batch.
    Batch {
        /// The batch; its `origin` names (epoch, split, sequence).
        batch: Batch,
        /// True for the split's last, partial batch.
        tail: bool,
    },
    /// A split is complete.
    SplitDone {
        /// The task.
        task: Task,
        /// Elements the split produced.
        elements: u64,
    },
}

/// A failure while running.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Reading the source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// An operator failed on an element.
    #[error("{path} (`{stage}`) failed on element `{key}`: {message}")]
    Op {
        /// Stage field path.
        path: String,
        /// Stage name.
        stage: String,
        /// Element key.
        key: String,
        /// The operator's message.
        message: String,
    },
    /// Elements could not be stacked.
    #[error("spec.batch: {0}")]
    Batch(#[from] BatchError),
    /// A thread of the executor stopped unexpectedly.
    #[error("executor thread failed: {0}")]
    Internal(String),
}

enum Work {
    Element { seq: u64, task: Task, split_id: u64, index: u64, element: Element, permit: Permit },
    SplitEnd { seq: u64, task: Task, split_id: u64 },
}

enum Done {
    Element { seq: u64, task: Task, split_id: u64, element: Element, permit: Permit },
    SplitEnd { seq: u64, task: Task, split_id: u64 },
    Failed { seq: u64, error: ExecError },
}

impl Done {
    fn seq(&self) -> u64 {
        match self {
            Done::Element { seq, .. } | Done::SplitEnd { seq, .. } | Done::Failed { seq, .. } => *seq,
        }
    }
}

/// Compute time per stage, summed over elements since the execution started.
#[derive(Debug, Default)]
pub struct StageTimes {
    nanos: Vec<AtomicU64>,
    elements: AtomicU64,
}

impl StageTimes {
    fn new(stages: usize) -> StageTimes {
        StageTimes { nanos: (0..stages).map(|_| AtomicU64::new(0)).collect(), elements: AtomicU64::new(0) }
    }

    /// Nanoseconds spent in each stage (in plan order) and the elements computed, so far.
    pub fn totals(&self) -> (Vec<u64>, u64) {
        let nanos = self.nanos.iter().map(|n| n.load(Ordering::Relaxed)).collect();
        (nanos, self.elements.load(Ordering::Relaxed))
    }
}

/// Where tasks come from: a list known up front, or a feed that ends when its sender is dropped.
pub type Tasks = Box<dyn Iterator<Item = Task> + Send>;

/// A running execution: iterate it for outputs. Dropping it stops every thread.
pub struct Execution {
    outputs: Receiver<Result<Output, ExecError>>,
    budget: Arc<Budget>,
    times: Arc<StageTimes>,
    threads: Vec<JoinHandle<()>>,
    failed: bool,
}

impl Execution {
    /// Most bytes held against the budget at once so far.
    pub fn peak_in_flight(&self) -> usize {
        self.budget.peak()
    }

    /// Compute time per stage so far.
    pub fn stage_times(&self) -> Arc<StageTimes> {
        Arc::clone(&self.times)
    }
}

impl Iterator for Execution {
    type Item = Result<Output, ExecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.outputs.recv() {
            Ok(Ok(Output::Batch { mut batch, tail })) => {
                // Handed over: what the consumer keeps is its own memory, not prefetch. Holding
                // it against the budget would stall the reader behind a consumer that keeps
                // batches (or behind merged split tails) forever.
                batch.permit = None;
                Some(Ok(Output::Batch { batch, tail }))
            }
            Ok(Ok(output)) => Some(Ok(output)),
            Ok(Err(e)) => {
                self.failed = true;
                self.budget.close();
                Some(Err(e))
            }
            Err(_) => {
                // The assembler hung up: finished, or a thread died. Join to tell which.
                self.budget.close();
                let mut panicked = None;
                for t in self.threads.drain(..) {
                    if let Err(p) = t.join() {
                        panicked = Some(panic_message(&p));
                    }
                }
                panicked.map(|m| {
                    self.failed = true;
                    Err(ExecError::Internal(m))
                })
            }
        }
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        // Wake a reader waiting for room; the channels closing stops the rest.
        self.budget.close();
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a thread panicked".to_string())
}

/// Starts running `tasks` in order. The execution ends after the last task; a feed (e.g. a
/// channel's iterator) keeps it running until the feed ends.
pub fn execute(
    source: Arc<Source>,
    plan: Arc<Plan>,
    tasks: Tasks,
    opts: ExecOptions,
    rt: Handle,
) -> Execution {
    let threads = opts.threads.max(1);
    let budget = Budget::new(opts.prefetch_bytes);
    let (work_tx, work_rx) = bounded::<Work>(threads * 4);
    let (done_tx, done_rx) = unbounded::<Done>();
    let (out_tx, out_rx) = bounded::<Result<Output, ExecError>>(1);
    let mut handles = Vec::with_capacity(threads + 2);

    handles.push(spawn("granary-reader", {
        let budget = Arc::clone(&budget);
        let done_tx = done_tx.clone();
        move || read(&source, tasks, &budget, &work_tx, &done_tx, &rt)
    }));
    let times = Arc::new(StageTimes::new(plan.stages.len()));
    for i in 0..threads {
        let work_rx = work_rx.clone();
        let done_tx = done_tx.clone();
        let plan = Arc::clone(&plan);
        let times = Arc::clone(&times);
        handles
            .push(spawn(&format!("granary-compute-{i}"), move || compute(&plan, &work_rx, &done_tx, &times)));
    }
    drop(done_tx);
    handles.push(spawn("granary-assembler", {
        let budget = Arc::clone(&budget);
        move || assemble::run(&plan, &done_rx, &out_tx, &budget)
    }));
    Execution { outputs: out_rx, budget, times, threads: handles, failed: false }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    // Spawning only fails when the OS is out of threads; there is nothing better to do then.
    #[allow(clippy::expect_used)]
    std::thread::Builder::new().name(name.to_string()).spawn(f).expect("cannot spawn an executor thread")
}

fn read(
    source: &Source,
    tasks: Tasks,
    budget: &Arc<Budget>,
    work: &Sender<Work>,
    done: &Sender<Done>,
    rt: &Handle,
) {
    let mut seq = 0u64;
    for task in tasks {
        let Some(split) = source.splits().get(task.split) else {
            let error = ExecError::Internal(format!("no split {} in the source", task.split));
            let _ = done.send(Done::Failed { seq, error });
            return;
        };
        let mut index = 0u64;
        let mut stopped = false;
        let result = source.read_split(split, rt, &mut |element| {
            let Some(permit) = budget.acquire(element.nbytes()) else {
                stopped = true;
                return false;
            };
            let item = Work::Element { seq, task, split_id: split.id, index, element, permit };
            if work.send(item).is_err() {
                stopped = true;
                return false;
            }
            seq += 1;
            index += 1;
            true
        });
        if stopped {
            return;
        }
        if let Err(e) = result {
            let _ = done.send(Done::Failed { seq, error: e.into() });
            return;
        }
        let end = seq;
        seq = end + 1;
        if work.send(Work::SplitEnd { seq: end, task, split_id: split.id }).is_err() {
            return;
        }
    }
}

fn compute(plan: &Plan, work: &Receiver<Work>, done: &Sender<Done>, times: &StageTimes) {
    for item in work.iter() {
        let out = match item {
            Work::SplitEnd { seq, task, split_id } => Done::SplitEnd { seq, task, split_id },
            Work::Element { seq, task, split_id, index, mut element, mut permit } => {
                let mut rng = SeededRng::for_element(plan.seed, u64::from(task.epoch), split_id, index);
                match apply(plan, &mut element, &mut rng, times) {
                    Ok(()) => {
                        permit.resize(element.nbytes());
                        Done::Element { seq, task, split_id, element, permit }
                    }
                    Err(error) => Done::Failed { seq, error },
                }
            }
        };
        if done.send(out).is_err() {
            return;
        }
    }
}

fn apply(
    plan: &Plan,
    element: &mut Element,
    rng: &mut SeededRng,
    times: &StageTimes,
) -> Result<(), ExecError> {
    let mut start = Instant::now();
    for (stage, nanos) in plan.stages.iter().zip(&times.nanos) {
        stage.op.apply(element, rng).map_err(|e| ExecError::Op {
            path: stage.path.clone(),
            stage: stage.name.clone(),
            key: element.key.clone(),
            message: e.0,
        })?;
        let now = Instant::now();
        nanos.fetch_add((now - start).as_nanos() as u64, Ordering::Relaxed);
        start = now;
    }
    times.elements.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
