//! The executor: runs split tasks through the operators on every core, in a deterministic order,
//! with a byte budget on the data in flight.
//!
//! Three kinds of threads form a pipeline:
//! - the reader streams each split's elements from the store, in task order, waiting on the
//!   budget before each element (prefetch and backpressure);
//! - `threads` compute threads apply the operators to elements in any order, each element with
//!   its own seeded random stream (a tuner may add more while they raise the rate: [`tune`]);
//! - the assembler restores task order, shuffles within each split, and stacks batches.
//!
//! When the plan shuffles first ([`Plan::shuffles_first`]), the reader shuffles a split as it
//! reads it, with the same buffer and draws, and the assembler keeps the order it restores: the
//! batches are the same, but each element is computed just before its batch takes it.
//!
//! Because randomness is per element and order is restored before shuffling, the output is the
//! same for any thread count, and a split re-run yields the same batches.
//!
//! Filters drop elements ([`Fate::Drop`]): the compute thread stops running stages on a dropped
//! element, releases its budget at once, and hands the assembler only its place in the order
//! (and its cache record, when the task writes one), so a dropped element never enters the
//! shuffle buffer or a batch, and `Output::SplitDone` counts the elements the split produced.
//! Whether an element is dropped depends only on the element and its own seeded stream, so this
//! too is the same for any thread count and on a re-run.
//!
//! With `spec.errors.policy: skip` ([`Plan::skip_errors`]), an element a stage fails on is
//! dropped the same way and counted ([`Skips`]): the split completes with the elements that
//! remain, and its count is learnt like a filter's. Only stage failures on one element are
//! skipped; a failure reading the source, or of a stage on a whole group, still fails the split.
//!
//! `text.pack` regroups a split's documents into rows: compute threads run the stages before it,
//! and the assembler packs the split's elements in their restored order and runs the stages
//! after it on the rows, before the shuffle ([`pack`]).

mod assemble;
mod cached;
mod client_share;
mod feed;
mod group;
mod pack;
mod shuffle;
mod times;
mod tune;

use crate::batch::{Batch, BatchError, Finish};
use crate::budget::{Budget, Permit};
use crate::cache::{CacheOutcome, EngineCache, ReadReport, record};
use crate::contained::contained;
use crate::element::Element;
use crate::ops::{Fate, OpError, Operator};
use crate::seed::SeededRng;
use crate::source::{Source, SourceError};
pub use client_share::ClientShare;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use feed::{Feeder, Taker};
use shuffle::ShuffleBuffer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;
pub use times::StageTimes;
use tokio::runtime::Handle;

/// One stage ready to run.
pub struct Stage {
    /// Stage name for messages (`name` or `op`).
    pub name: String,
    /// Field path of the stage in the spec (`spec.stages[2]`).
    pub path: String,
    /// The implementation.
    pub op: Box<dyn Operator>,
    /// Index in `spec.stages` of the first stage it implements (a fused stage covers several).
    pub first: usize,
}

/// Everything the executor needs to know about the pipeline.
pub struct Plan {
    /// Stages, in order.
    pub stages: Vec<Stage>,
    /// Pipeline seed.
    pub seed: u64,
    /// Elements per batch.
    pub batch_size: usize,
    /// `spec.batch.pad`: the fields padded to the longest element of each batch.
    pub padding: Option<Arc<crate::batch::Padding>>,
    /// `spec.batch.bucket`: batches filled from elements of one length bucket.
    pub bucketing: Option<Arc<crate::batch::Bucketing>>,
    /// Shuffle buffer size within a split; 0 keeps the order.
    pub shuffle_buffer: usize,
    /// The optimizer's [`granary_optimizer::Rewrite::ShuffleFirst`]: the reader shuffles each
    /// split it computes from the source as it reads it, and the assembler keeps that order.
    pub shuffle_first: bool,
    /// Stages of `spec.stages` that `stages` implement (a final normalization left to the
    /// consumer is not among them).
    pub spec_stages: usize,
    /// The cache store and the cuts whose entries tasks may write or read.
    pub cache: Option<Arc<EngineCache>>,
    /// `spec.errors.policy: skip`: an element a stage fails on is dropped and counted instead of
    /// failing its split.
    pub skip_errors: bool,
    /// The planning form of the pipeline's final fused image run, for tasks whose images the
    /// consumer makes ([`Task::images_on_client`]); `None` when the pipeline has none.
    pub client_images: Option<ClientImages>,
}

/// A final fused image run in the form that plans its images rather than making them
/// (`crate::ops::image::planning`).
pub struct ClientImages {
    /// Index in [`Plan::stages`] of the fused run (the last stage).
    pub stage: usize,
    /// The planning operator, run in its place on the images the consumer makes.
    pub op: Box<dyn Operator>,
    /// The operator that makes an image as the fused run does and puts its pixels in a row,
    /// run in its place on the rest of such a task's images.
    pub maker: Box<dyn Operator>,
    /// The field's rows differ in length: batches keep them ragged, as `spec.batch.pad` does.
    pub padding: Arc<crate::batch::Padding>,
    /// The images the consumer makes from the rows.
    pub output: PlannedOutput,
}

/// The images a consumer makes from planned rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedOutput {
    /// The image field.
    pub field: String,
    /// Rows of each image.
    pub height: usize,
    /// Columns of each image.
    pub width: usize,
}

impl Plan {
    /// Elements per group when a stage takes groups: `batch.size` for a batched `python.map`,
    /// else [`GATHER`] when an element-wise stage gathers its calls (any other `python.map`).
    fn group_size(&self) -> Option<usize> {
        let stages = &self.stages[..self.element_stages()];
        if stages.iter().any(|s| s.op.batched()) {
            return Some(self.batch_size.max(1));
        }
        stages.iter().any(|s| s.op.gathers()).then_some(GATHER)
    }

    /// Whether the reader shuffles `task`'s split as it reads it (see [`Plan::shuffle_first`]):
    /// for a task that computes every stage from the source, one element at a time. A task that
    /// writes or reads the cache keeps the elements in the entry's order, and groups are blocks
    /// of consecutive elements, so those shuffle after the stages, as every plan did before.
    pub fn shuffles_first(&self, task: Task) -> bool {
        self.shuffle_first
            && self.shuffle_buffer > 0
            && task.cache == CacheUse::Compute
            && self.group_size().is_none()
            && self.element_stages() == self.stages.len()
    }

    /// The stages compute threads run on each element: those before `text.pack`, which the
    /// assembler runs over whole splits (with the stages after it); all when nothing packs.
    pub fn element_stages(&self) -> usize {
        self.stages.iter().position(|s| s.op.packing().is_some()).unwrap_or(self.stages.len())
    }

    /// Whether `task`'s images are planned for the consumer: it asks for that, the pipeline ends
    /// in a fused image run, and the task computes that run (from the source, or from a cache
    /// entry cut before it). A task that writes an entry makes its images: an entry holds
    /// computed elements. Nor does a pipeline whose stages take groups or pack (its elements do
    /// not go through the stages one at a time), or that skips the elements a stage fails on.
    pub fn plans_images(&self, task: Task) -> bool {
        let Some(images) = self.client_images.as_ref().filter(|_| !task.images_on_client.is_none()) else {
            return false;
        };
        // Under `spec.errors.policy: skip`, an image whose decode fails is dropped, which only
        // the worker can do: the consumer's batch is planned by then.
        if self.skip_errors || self.group_size().is_some() || self.element_stages() != self.stages.len() {
            return false;
        }
        match task.cache {
            CacheUse::Compute => true,
            CacheUse::Write { .. } => false,
            CacheUse::Read { cut, .. } => self.stages.get(images.stage).is_some_and(|s| cut <= s.first),
        }
    }

    /// How element `index` of `task` goes through the image run: planned or made into a row
    /// for a task whose images the consumer makes ([`Plan::plans_images`]), as its share
    /// marks it; else made.
    fn image_form(&self, task: Task, index: u64) -> ImageForm {
        if !self.plans_images(task) {
            ImageForm::Made
        } else if task.images_on_client.marks(index) {
            ImageForm::Planned
        } else {
            ImageForm::Row
        }
    }

    /// The operator of `stages[i]` for an element whose image run takes `form`.
    fn op(&self, i: usize, form: ImageForm) -> &dyn Operator {
        match (&self.client_images, form) {
            (Some(images), ImageForm::Planned) if images.stage == i => images.op.as_ref(),
            (Some(images), ImageForm::Row) if images.stage == i => images.maker.as_ref(),
            _ => self.stages[i].op.as_ref(),
        }
    }

    /// The index in `stages` where cut `cut` of `spec.stages` falls (the entry holds the output
    /// of `spec.stages[cut - 1]`), when the stages as they run have a boundary there.
    pub fn stage_at_cut(&self, cut: usize) -> Option<usize> {
        if cut == self.spec_stages {
            return Some(self.stages.len());
        }
        self.stages.iter().position(|s| s.first == cut)
    }
}

/// How one element goes through the pipeline's final fused image run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageForm {
    /// Made, its pixels in the field (every element of a task the worker makes all of).
    Made,
    /// Planned for the consumer: the plan and the JPEG in a row.
    Planned,
    /// Made here, its pixels in a row beside the planned ones of its task.
    Row,
}

/// Elements per group for stages that gather element-wise calls ([`Operator::gathers`]): one
/// round trip to a Python runner per 8 elements costs a few percent of what one per element
/// does, and a group this small keeps every compute thread busy on small splits.
///
/// [`Operator::gathers`]: crate::ops::Operator::gathers
pub const GATHER: usize = 8;

/// What a task does with the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheUse {
    /// Run every stage from the source.
    #[default]
    Compute,
    /// Run every stage and write the elements at cut `cut` into the entry of that cut.
    Write {
        /// Stages of `spec.stages` before the cut.
        cut: usize,
    },
    /// Read the entry of cut `cut` and run only the stages after it; on a bad or unreadable
    /// entry, compute the rest of the split from the source.
    Read {
        /// Stages of `spec.stages` before the cut.
        cut: usize,
        /// Elements the split has; an entry that says otherwise is bad.
        elements: u64,
    },
}

/// One split of one epoch to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Epoch, counted from 0.
    pub epoch: u32,
    /// Index of the split in the source's listing.
    pub split: usize,
    /// Whether it writes or reads the cache.
    pub cache: CacheUse,
    /// The share of the images of the pipeline's final fused image run the consumer makes:
    /// those are planned and sent with their JPEG, the rest made and sent as rows of pixels
    /// beside them (see [`Plan::plans_images`]).
    pub images_on_client: ClientShare,
}

impl Task {
    /// A task that computes split `split` of epoch `epoch`.
    pub fn compute(epoch: u32, split: usize) -> Task {
        Task { epoch, split, cache: CacheUse::Compute, images_on_client: ClientShare::NONE }
    }
}

/// Executor settings.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Compute threads to start with.
    pub threads: usize,
    /// Most compute threads the tuner may run ([`tune`]); no more than `threads` turns it off.
    pub most_threads: usize,
    /// Bytes of data in flight (read ahead, being computed, and finished batches) before the
    /// reader waits.
    pub prefetch_bytes: usize,
    /// A final normalization applied to whole batches on their way out, by a thread of its own
    /// between the assembler and the consumer ([`Finish`]).
    pub finish: Option<Arc<Finish>>,
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
        /// Elements the split produced: its listed elements less those a filter dropped.
        elements: u64,
        /// What the cache did for it.
        cache: CacheOutcome,
        /// Elements a stage failed on that were dropped (`spec.errors.policy: skip`).
        skipped: Skips,
    },
}

/// The elements of one split that a stage failed on and that were dropped
/// (`spec.errors.policy: skip`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skips {
    /// How many.
    pub elements: u64,
    /// The first one's error, naming the element's key and the stage.
    pub first: Option<String>,
}

impl Skips {
    fn add(&mut self, error: String) {
        self.elements += 1;
        if self.first.is_none() {
            self.first = Some(error);
        }
    }
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

/// One element of a group for batched stages.
struct Member {
    seq: u64,
    /// Index of the element in its split.
    index: u64,
    /// First stage to apply (after a cache cut, for elements read from the cache).
    start: usize,
    element: Element,
    permit: Permit,
}

enum Work {
    /// Consecutive elements of one split that run together, for a batched stage.
    Group {
        task: Task,
        split_id: u64,
        members: Vec<Member>,
    },
    /// An element to run through `stages[start..]`.
    Element {
        seq: u64,
        task: Task,
        split_id: u64,
        index: u64,
        start: usize,
        element: Element,
        permit: Permit,
    },
    SplitEnd {
        seq: u64,
        task: Task,
        split_id: u64,
        read: ReadReport,
    },
}

enum Done {
    /// A finished element, with its cache record when the task writes one.
    Element {
        seq: u64,
        task: Task,
        split_id: u64,
        element: Element,
        record: Option<Vec<u8>>,
        permit: Permit,
    },
    /// An element a filter dropped: only its place in the order, and its cache record when the
    /// task writes one (the cut lies before any filter, so the entry holds every element). An
    /// element a stage failed on under `policy: skip` is dropped too, with its error, and has no
    /// record when it failed before the cut.
    Dropped {
        seq: u64,
        task: Task,
        split_id: u64,
        record: Option<Vec<u8>>,
        skipped: Option<String>,
    },
    SplitEnd {
        seq: u64,
        task: Task,
        split_id: u64,
        read: ReadReport,
    },
    Failed {
        seq: u64,
        error: ExecError,
    },
}

impl Done {
    fn seq(&self) -> u64 {
        match self {
            Done::Element { seq, .. }
            | Done::Dropped { seq, .. }
            | Done::SplitEnd { seq, .. }
            | Done::Failed { seq, .. } => *seq,
        }
    }

    /// What the compute thread hands on for an element that ran: the element itself when it was
    /// kept (its permit resized to what it holds now); when it was dropped, its place in the
    /// order only, its permit released here.
    fn of(seq: u64, task: Task, split_id: u64, element: Element, ran: Ran, mut permit: Permit) -> Done {
        let Ran { fate, record, skipped } = ran;
        match fate {
            Fate::Keep if skipped.is_none() => {
                permit.resize(element.nbytes());
                Done::Element { seq, task, split_id, element, record, permit }
            }
            _ => {
                // The budget gets the element's bytes back now, not when the assembler reaches it.
                drop(permit);
                drop(element);
                Done::Dropped { seq, task, split_id, record, skipped }
            }
        }
    }
}

/// What running the stages made of one element.
struct Ran {
    /// Whether it goes on to the batch.
    fate: Fate,
    /// Its record at the cache cut, when the task writes the cache.
    record: Option<Vec<u8>>,
    /// The error of a stage that failed on it, when it is skipped (`spec.errors.policy: skip`).
    skipped: Option<String>,
}

impl Ran {
    /// A stage failed on the element: skipped under `policy: skip`, else the split fails.
    fn failed(plan: &Plan, error: ExecError, record: Option<Vec<u8>>) -> Result<Ran, ExecError> {
        if !plan.skip_errors || !matches!(error, ExecError::Op { .. }) {
            return Err(error);
        }
        Ok(Ran { fate: Fate::Drop, record, skipped: Some(error.to_string()) })
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
    /// Most compute threads run at once so far (the tuner may add some).
    peak_threads: Arc<AtomicUsize>,
    failed: bool,
}

impl Execution {
    /// Most bytes held against the budget at once so far.
    pub fn peak_in_flight(&self) -> usize {
        self.budget.peak()
    }

    /// Most compute threads run at once so far: the threads it started with, or more once its
    /// tuner added some.
    pub fn peak_compute_threads(&self) -> usize {
        self.peak_threads.load(Ordering::Acquire)
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
                        panicked = Some(crate::contained::message(p.as_ref()).to_string());
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
    // Elements read ahead of the compute threads (their bytes count against the budget too).
    // Deep enough that the reader, a thread that mostly waits on reads, can fall a few splits
    // behind on a loaded CPU (its turn for a core comes late) without the compute threads
    // running dry: with 4 per thread they idled about a tenth of the time on 2 busy cores.
    let (work_tx, work_rx) = feed::queue::<Work>(threads * 32);
    let (done_tx, done_rx) = unbounded::<Done>();
    let (out_tx, out_rx) = bounded::<Result<Output, ExecError>>(1);
    let mut handles = Vec::with_capacity(threads + 2);

    let read_all = Arc::new(AtomicBool::new(false));
    let peak_threads = Arc::new(AtomicUsize::new(threads));
    handles.push(spawn("granary-reader", {
        let budget = Arc::clone(&budget);
        let done_tx = done_tx.clone();
        let plan = Arc::clone(&plan);
        let rt = rt.clone();
        // Set when the reader ends, a panic included: the tuner then lets go of the channels.
        let read_all = tune::SetOnDrop(Arc::clone(&read_all));
        move || {
            let _read_all = read_all;
            read(&source, &plan, tasks, &budget, &work_tx, &done_tx, &rt);
        }
    }));
    let times = Arc::new(StageTimes::new(plan.stages.len(), threads));
    for i in 0..threads {
        let work_rx = work_rx.clone();
        let done_tx = done_tx.clone();
        let plan = Arc::clone(&plan);
        let times = Arc::clone(&times);
        handles.push(spawn(&format!("granary-compute-{i}"), move || {
            compute(&plan, &work_rx, &done_tx, &times, &|| true)
        }));
    }
    if opts.most_threads > threads {
        let tuned = tune::Tuned {
            plan: Arc::clone(&plan),
            work: work_rx.clone(),
            done: done_tx.clone(),
            times: Arc::clone(&times),
            read_all,
            peak: Arc::clone(&peak_threads),
        };
        let most = opts.most_threads;
        handles.push(spawn("granary-tuner", move || tune::run(tuned, threads, most)));
    }
    drop(done_tx);
    // The finisher reads its field's images from the elements' buffers: the assembler leaves
    // them unstacked.
    let unstacked = opts.finish.as_ref().map(|f| f.field().to_string());
    let (assembled_tx, out_rx) = match opts.finish {
        None => (out_tx, out_rx),
        Some(finish) => {
            let (assembled_tx, assembled_rx) = bounded::<Result<Output, ExecError>>(1);
            handles.push(spawn("granary-finisher", move || finish_batches(&finish, &assembled_rx, &out_tx)));
            (assembled_tx, out_rx)
        }
    };
    handles.push(spawn("granary-assembler", {
        let budget = Arc::clone(&budget);
        let times = Arc::clone(&times);
        move || assemble::run(&plan, unstacked.as_deref(), &done_rx, &assembled_tx, &budget, &times, &rt)
    }));
    Execution { outputs: out_rx, budget, times, threads: handles, peak_threads, failed: false }
}

/// Passes the assembler's outputs on in order, each batch finished ([`Finish`]); a batch it
/// cannot finish ends the execution with the reason.
fn finish_batches(
    finish: &Finish,
    assembled: &Receiver<Result<Output, ExecError>>,
    out: &Sender<Result<Output, ExecError>>,
) {
    for mut output in assembled {
        if let Ok(Output::Batch { batch, .. }) = &mut output
            && let Err(why) = finish.apply(batch)
        {
            let _ = out.send(Err(ExecError::Batch(BatchError::Finish(why))));
            return;
        }
        if out.send(output).is_err() {
            return;
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    // Spawning only fails when the OS is out of threads; there is nothing better to do then.
    #[allow(clippy::expect_used)]
    std::thread::Builder::new().name(name.to_string()).spawn(f).expect("cannot spawn an executor thread")
}

fn read(
    source: &Source,
    plan: &Plan,
    tasks: Tasks,
    budget: &Arc<Budget>,
    work: &Feeder<Work>,
    done: &Sender<Done>,
    rt: &Handle,
) {
    let mut seq = 0u64;
    for task in tasks {
        // Split ids past the listing are further passes over it (a mixed source upsampled by
        // `stop: elements`): they read the listed split and seed by their own id.
        let listed = source.splits().len();
        let Some(split) = source.splits().get(task.split.checked_rem(listed).unwrap_or(usize::MAX)) else {
            let error = ExecError::Internal(format!("no split {} in the source", task.split));
            let _ = done.send(Done::Failed { seq, error });
            return;
        };
        let split_id = task.split as u64;
        let mut stopped = false;
        let group = plan.group_size();
        let mut members: Vec<Member> = Vec::new();
        let mut send = |index: u64, start: usize, element: Element| {
            let Some(permit) = budget.acquire(element.nbytes()) else {
                stopped = true;
                return false;
            };
            let Some(g) = group else {
                let item = Work::Element { seq, task, split_id, index, start, element, permit };
                if work.send(item).is_err() {
                    stopped = true;
                    return false;
                }
                seq += 1;
                return true;
            };
            // Groups are blocks of `g` indices; a block may arrive partly from the cache.
            if members.last().is_some_and(|m| m.index / g as u64 != index / g as u64) {
                let members = std::mem::take(&mut members);
                if work.send(Work::Group { task, split_id, members }).is_err() {
                    stopped = true;
                    return false;
                }
            }
            members.push(Member { seq, index, start, element, permit });
            seq += 1;
            true
        };
        // Elements before `from` came from the cache; the source supplies the rest.
        let (from, mut read) = cached::read(plan, task, split_id, rt, &mut send);
        let mut index = 0u64;
        // Shuffled as read, so the compute threads take the elements in the order the batches
        // do: files are read in that order (their count is known), other splits pass through
        // the buffer before any stage. Such a task computes from the source: `from` is 0.
        let first = plan.shuffles_first(task);
        let reordered =
            first.then(|| shuffle::files_in_shuffled_order(plan, task, split_id, split)).flatten();
        let mut shuffle: Option<ShuffleBuffer<(u64, Element)>> =
            if first && reordered.is_none() { ShuffleBuffer::new(plan, task, split_id) } else { None };
        // A files split gives one element per file; a reader that gave more would have no
        // position to put them in.
        let mut overflow = false;
        let result = match (from, &reordered) {
            (Some(_), Some((order, files))) => source.read_split(files, rt, &mut |element| {
                let read = index as usize;
                index += 1;
                let Some(&i) = order.get(read) else {
                    overflow = true;
                    return false;
                };
                send(i, 0, element)
            }),
            (Some(from), None) => source.read_split(split, rt, &mut |element| {
                let i = index;
                index += 1;
                if i < from {
                    return true;
                }
                match shuffle.as_mut() {
                    Some(shuffle) => {
                        shuffle.push((i, element)).is_none_or(|(i, element)| send(i, 0, element))
                    }
                    None => send(i, 0, element),
                }
            }),
            (None, _) => Ok(()),
        };
        if result.is_ok()
            && let Some(shuffle) = shuffle.as_mut()
        {
            while let Some((i, element)) = shuffle.drain() {
                if !send(i, 0, element) {
                    break;
                }
            }
        }
        if stopped {
            return;
        }
        if overflow {
            let error = ExecError::Internal(format!(
                "split {split_id} gave more elements than the {} files it lists",
                reordered.as_ref().map_or(0, |(order, _)| order.len())
            ));
            let _ = done.send(Done::Failed { seq, error });
            return;
        }
        if !members.is_empty() && work.send(Work::Group { task, split_id, members }).is_err() {
            return;
        }
        if let Err(e) = result {
            let _ = done.send(Done::Failed { seq, error: e.into() });
            return;
        }
        if let (CacheUse::Read { .. }, Some(from)) = (task.cache, from) {
            read.recomputed = index.saturating_sub(from);
        }
        let end = seq;
        seq = end + 1;
        if work.send(Work::SplitEnd { seq: end, task, split_id, read }).is_err() {
            return;
        }
    }
}

/// Computes elements from `work` until it ends, or until `keep` says this thread is no longer
/// wanted (checked before each item).
fn compute(
    plan: &Plan,
    work: &Taker<Work>,
    done: &Sender<Done>,
    times: &StageTimes,
    keep: &dyn Fn() -> bool,
) {
    // The thread that started this one may run under `SCHED_BATCH`; under the normal policy,
    // the serving threads' wakeups wait for it rather than preempt it (see `crate::scheduling`).
    if let Err(e) = crate::scheduling::compute_first() {
        tracing::debug!("a compute thread keeps its inherited scheduling policy: {e}");
    }
    while keep() {
        let Ok(item) = work.recv() else { return };
        let out = match item {
            Work::Group { task, split_id, mut members } => {
                match group::run(plan, task, split_id, &mut members, times) {
                    Ok(ran) => {
                        for (m, ran) in members.into_iter().zip(ran) {
                            if done.send(Done::of(m.seq, task, split_id, m.element, ran, m.permit)).is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                    Err(error) => Done::Failed { seq: members.first().map_or(0, |m| m.seq), error },
                }
            }
            Work::SplitEnd { seq, task, split_id, read } => Done::SplitEnd { seq, task, split_id, read },
            Work::Element { seq, task, split_id, index, start, mut element, permit } => {
                let mut rng = SeededRng::for_element(plan.seed, u64::from(task.epoch), split_id, index);
                let form = plan.image_form(task, index);
                match run_element(plan, task, start, &mut element, &mut rng, times, form) {
                    Ok(ran) => Done::of(seq, task, split_id, element, ran, permit),
                    Err(error) => Done::Failed { seq, error },
                }
            }
        };
        if done.send(out).is_err() {
            return;
        }
    }
}

/// Runs `stages[start..]` on an element, up to a filter that drops it; a task that writes the
/// cache also gets the element's record as it is at its cut.
fn run_element(
    plan: &Plan,
    task: Task,
    start: usize,
    element: &mut Element,
    rng: &mut SeededRng,
    times: &StageTimes,
    images: ImageForm,
) -> Result<Ran, ExecError> {
    let n = plan.element_stages();
    let ran = match write_cut(plan, task, start) {
        None => match apply(plan, start.min(n)..n, element, rng, times, images) {
            Ok(fate) => Ran { fate, record: None, skipped: None },
            Err(error) => Ran::failed(plan, error, None)?,
        },
        Some(j) => {
            // Cuts lie in the deterministic prefix, which ends before the first filter: every
            // element reaches its cut. (One dropped before it would leave the entry short, and a
            // short entry is recomputed rather than read.) One skipped before it stops the
            // split's entry from being written (see the assembler).
            let mut fate = match apply(plan, 0..j, element, rng, times, images) {
                Ok(fate) => fate,
                Err(error) => return Ran::failed(plan, error, None),
            };
            let record = (fate == Fate::Keep).then(|| record::to_bytes(element));
            if fate == Fate::Keep {
                fate = match apply(plan, j..n, element, rng, times, images) {
                    Ok(fate) => fate,
                    Err(error) => return Ran::failed(plan, error, record),
                };
            }
            Ran { fate, record, skipped: None }
        }
    };
    times.add_element();
    Ok(ran)
}

/// The stage index at which a task that writes the cache takes an element's record: elements
/// computed from the source (`start` 0) only.
fn write_cut(plan: &Plan, task: Task, start: usize) -> Option<usize> {
    match task.cache {
        CacheUse::Write { cut } if start == 0 => plan.stage_at_cut(cut),
        _ => None,
    }
}

/// A stage's error for a call of it that panicked (caught by [`contained`]): the panic is the
/// stage's error on the element, so the message names both and `spec.errors` applies to it as
/// to any other, rather than the compute thread dying and its element never coming out.
pub(super) fn panicked(why: String) -> OpError {
    OpError::new(format!(
        "the stage panicked ({why}); this is a bug in Granary or in a library it uses: please \
         report it, with the element"
    ))
}

/// Runs `stages` on an element in order; stops at the first that drops it. The image run
/// takes `images` ([`Plan::image_form`] of the element).
fn apply(
    plan: &Plan,
    stages: std::ops::Range<usize>,
    element: &mut Element,
    rng: &mut SeededRng,
    times: &StageTimes,
    images: ImageForm,
) -> Result<Fate, ExecError> {
    let mut start = Instant::now();
    for (i, stage) in plan.stages.iter().enumerate().skip(stages.start).take(stages.len()) {
        let op = plan.op(i, images);
        let fate =
            contained(|| op.run(element, rng)).unwrap_or_else(|why| Err(panicked(why))).map_err(|e| {
                ExecError::Op {
                    path: stage.path.clone(),
                    stage: stage.name.clone(),
                    key: element.key.clone(),
                    message: e.0,
                }
            })?;
        let now = Instant::now();
        times.add(i, (now - start).as_nanos() as u64);
        start = now;
        if fate == Fate::Drop {
            return Ok(Fate::Drop);
        }
    }
    Ok(Fate::Keep)
}
