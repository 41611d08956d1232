//! The in-process engine: a validated manifest in, batches out, one epoch at a time.

use crate::batch::{self, Batch, BatchError, Finish};
use crate::cache::{EngineCache, entries};
use crate::executor::{
    self, ClientImages, ExecError, ExecOptions, Execution, Output, Plan, PlannedOutput, Stage, Task, Tasks,
};
use crate::ops::image::fused::ImagePath;
use crate::ops::image::planning::ImagePlanning;
use crate::ops::python::{Interpreter, PythonStages, StartError};
use crate::ops::{self, BuildContext, BuildError};
use crate::seed::{SeededRng, Stream};
use crate::source::{Source, SourceError, get_bytes};
use crate::store;
use granary_crds::ops::PythonCall;
use granary_crds::ops::image::{ImageDType, Layout};
use granary_crds::{InputPipelineSpec, Manifest, OpConfig};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::runtime::Runtime;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Compute threads (default: every core the process may use); a pipeline with Python stages
    /// runs one more (see [`compute_threads`]).
    pub threads: usize,
    /// Bytes of data in flight before reading waits (default: a quarter of the memory this
    /// process may use, from 32 to 512 MiB; see [`crate::memory`]).
    pub prefetch_bytes: usize,
    /// How image stages run (default: fused where the stages allow).
    pub image_path: ImagePath,
    /// Leave a final `float32` `image.normalize` to the consumer: batches carry the `uint8`
    /// pixels (a quarter of the bytes) and [`Engine::deferred`] says how to finish them, which
    /// gives the same bits (default: off; the worker service turns it on for the wire).
    pub defer_normalize: bool,
    /// Otherwise, normalize whole batches on their way out rather than each element, on a thread
    /// of the executor's (see [`crate::batch::Finish`]; default: on; the worker service turns
    /// it off, so that a worker told to normalize counts the pass in its stage times).
    pub finish_per_batch: bool,
    /// Raw bytes of records per cache chunk (default 4 MiB): the unit a bad entry is recomputed
    /// from.
    pub cache_chunk_bytes: usize,
    /// The Python interpreter of `python.*` stages (`--python`); `None` finds one as
    /// [`Interpreter::find`] says.
    pub python: Option<PathBuf>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            prefetch_bytes: crate::memory::default_prefetch_bytes(),
            image_path: ImagePath::Fused,
            defer_normalize: false,
            finish_per_batch: true,
            cache_chunk_bytes: granary_store::cache::CHUNK_MAX_RAW_BYTES,
            python: None,
        }
    }
}

/// A failure of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The spec did not validate.
    #[error("invalid spec:\n{0}")]
    Spec(#[from] granary_crds::Problems),
    /// A stage could not be built.
    #[error("{path}: {error}")]
    Build {
        /// Stage field path.
        path: String,
        /// What failed.
        error: BuildError,
    },
    /// Listing or reading the source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Running failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The I/O runtime could not start.
    #[error("cannot start the I/O runtime: {0}")]
    Runtime(std::io::Error),
    /// More elements were skipped (`spec.errors.policy: skip`) than `spec.errors.maxSkipped`
    /// allows.
    #[error(
        "{skipped} elements were skipped, more than spec.errors.maxSkipped ({max}) allows; the first: \
         {first}; fix or remove the failing elements, or raise maxSkipped"
    )]
    TooManySkipped {
        /// Elements skipped so far.
        skipped: u64,
        /// `spec.errors.maxSkipped`.
        max: u64,
        /// The first skipped element's error, naming its key and the stage.
        first: String,
    },
}

/// The final `image.normalize` the engine left to the consumer: `field` holds `uint8` HWC
/// pixels, and the tensor the pipeline defines is `(x / 255 − mean) / std` as `float32` in
/// `layout` (computed with `granary_kernels::normalize`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeferredNormalize {
    /// The image field.
    pub field: String,
    /// Per-channel mean.
    pub mean: [f32; 3],
    /// Per-channel standard deviation.
    pub std: [f32; 3],
    /// Output layout.
    pub layout: Layout,
}

impl DeferredNormalize {
    /// The normalization finished per batch in this process, its pass over a batch shared by a
    /// thread per 4 of `cores`: one thread finishes several thousand ImageNet images a second,
    /// the output of about 4 cores decoding them.
    fn per_batch(&self, cores: usize) -> Finish {
        let layout = match self.layout {
            Layout::HWC => granary_kernels::normalize::Layout::Hwc,
            Layout::CHW => granary_kernels::normalize::Layout::Chw,
        };
        Finish::new(&self.field, self.mean, self.std, layout, cores.div_ceil(4))
    }
}

/// A pipeline ready to run in this process.
pub struct Engine {
    /// The spec as the plan runs it: the optimizer's stage order and source fields.
    spec: InputPipelineSpec,
    optimized: granary_optimizer::Plan,
    deferred: Option<DeferredNormalize>,
    /// The final normalization the executor finishes per batch, with its path and name.
    finish: Option<(Arc<Finish>, String, String)>,
    source: Arc<Source>,
    plan: Arc<Plan>,
    options: EngineOptions,
    /// Compute threads the executor runs: see [`compute_threads`].
    compute_threads: usize,
    /// Most compute threads its tuner may run: see [`most_compute_threads`].
    most_threads: usize,
    runtime: Runtime,
    /// Why the spec's cache store could not be opened, if it could not.
    cache_error: Option<String>,
}

impl Engine {
    /// Builds the pipeline of `manifest`: lists the source and builds every stage.
    pub fn open(manifest: &Manifest, options: EngineOptions) -> Result<Engine, EngineError> {
        let written = &manifest.pipeline.spec;
        let problems = granary_crds::validate::validate(written);
        if !problems.is_empty() {
            return Err(granary_crds::Problems(problems).into());
        }
        // Everything below runs the plan: the stages in the optimizer's order (messages name
        // each by its place as written), the source reading only the fields they use.
        let optimized = granary_optimizer::optimize(written);
        let spec = optimized.apply(written);
        let origins = optimized.origins();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("granary-io")
            .enable_all()
            .build()
            .map_err(EngineError::Runtime)?;
        let source = runtime.block_on(Source::open_all(&spec, spec.batch.size as usize))?;
        let source = Arc::new(source.with_projection(projection(&spec)));
        let resources = Resources::default();
        let mut ctx = build_context(&manifest.base_dir, runtime.handle().clone(), resources.clone());
        let mut configs = Vec::with_capacity(spec.stages.len());
        for (stage, origin) in spec.stages.iter().zip(&origins) {
            configs.push(
                OpConfig::parse(stage, &format!("spec.stages[{origin}]")).map_err(granary_crds::Problems)?,
            );
        }
        let compute_threads = compute_threads(options.threads, &configs);
        let most_threads = most_compute_threads(options.threads, &configs, spec.optimize);
        ctx.python =
            start_python(&configs, &origins, &manifest.base_dir, &options, compute_threads, &resources)?
                .map(Arc::new);
        // A final float32 normalization leaves the compute threads: the consumer finishes it
        // (the worker service, for the wire), or the executor does, per batch (not on the
        // reference path, which runs every stage as written).
        let last = configs.len().saturating_sub(1);
        let mut finish = None;
        let deferred = match configs.last() {
            Some(OpConfig::ImageNormalize(n))
                if n.dtype == ImageDType::Float32
                    && (options.defer_normalize
                        || (options.finish_per_batch && options.image_path != ImagePath::Separate)) =>
            {
                let deferred = DeferredNormalize {
                    field: n.field.clone(),
                    mean: n.mean3(),
                    std: n.std3(),
                    layout: n.layout,
                };
                configs.pop();
                if options.defer_normalize {
                    Some(deferred)
                } else {
                    let path = format!("spec.stages[{}]", origins.get(last).copied().unwrap_or(last));
                    let name = format!("{} (per batch)", spec.stages[last].display_name());
                    finish = Some((Arc::new(deferred.per_batch(options.threads)), path, name));
                    None
                }
            }
            _ => None,
        };
        let mut stages = Vec::with_capacity(configs.len());
        // A cut pinned by `policy: at` needs a boundary there: nothing is fused across it.
        let pinned = entries::pinned_cut(&spec).filter(|_| entries::caches(&spec));
        let keep_cuts = keeps_cuts(&spec);
        let mut i = 0;
        while i < configs.len() {
            let end = pinned.filter(|k| *k > i).map_or(configs.len(), |k| k.min(configs.len()));
            // A fused run's resources (a tokenizer file) belong to its first stage.
            resources.stage.store(i, std::sync::atomic::Ordering::Relaxed);
            let fused =
                ops::fuse(&configs[i..end], options.image_path, keep_cuts, &ctx).map_err(|error| {
                    EngineError::Build { path: format!("spec.stages[{}]", origins[i]), error }
                })?;
            if let Some((op, used)) = fused {
                let names: Vec<&str> = spec.stages[i..i + used].iter().map(|s| s.display_name()).collect();
                let path = stages_path(&origins[i..i + used]);
                stages.push(Stage { name: names.join(" → "), path, op, first: i });
                i += used;
                continue;
            }
            let path = format!("spec.stages[{}]", origins[i]);
            resources.stage.store(i, std::sync::atomic::Ordering::Relaxed);
            let op = ops::build(&configs[i], &ctx)
                .map_err(|error| EngineError::Build { path: path.clone(), error })?;
            stages.push(Stage { name: spec.stages[i].display_name().to_string(), path, op, first: i });
            i += 1;
        }
        // The final fused image run's planning form, for leases whose images the consumers make.
        let client_images = match (options.defer_normalize, &spec.batch.pad, stages.last()) {
            (true, None, Some(last)) => {
                ImagePlanning::of(&configs[last.first..], options.image_path).map(|planning| ClientImages {
                    stage: stages.len() - 1,
                    op: planning.op,
                    maker: planning.maker,
                    padding: Arc::new(crate::batch::Padding {
                        fields: vec![planning.field.clone()],
                        multiple_of: 1,
                        value: 0.0,
                        mask: String::new(),
                    }),
                    output: PlannedOutput {
                        field: planning.field,
                        height: planning.height,
                        width: planning.width,
                    },
                })
            }
            _ => None,
        };
        let mut plan = Plan {
            client_images,
            stages,
            seed: spec.seed,
            batch_size: spec.batch.size.max(1) as usize,
            padding: spec.batch.pad.as_ref().map(|p| Arc::new(crate::batch::Padding::from_spec(p))),
            bucketing: spec
                .batch
                .bucket
                .as_ref()
                .zip(spec.batch.pad.as_ref())
                .map(|(b, p)| Arc::new(crate::batch::Bucketing::from_spec(b, p))),
            shuffle_buffer: spec.shuffle.as_ref().map_or(0, |s| s.buffer as usize),
            shuffle_first: optimized.shuffles_first(),
            spec_stages: configs.len(),
            cache: None,
            skip_errors: spec.skips_elements(),
        };
        let name = manifest.pipeline.metadata.name.clone().unwrap_or_default();
        let read = resources.read.lock().map(|r| r.clone()).unwrap_or_default();
        // A cache store that cannot be opened costs the cache, not the pipeline: it computes,
        // and the profile says why.
        let mut cache_error = None;
        match entries::build(&spec, &name, &source, &plan, &read, writer_id(), options.cache_chunk_bytes) {
            Ok(cache) => plan.cache = cache.map(Arc::new),
            Err(e) => {
                let e = format!("spec.cache.store: {e}");
                tracing::warn!(pipeline = %name, "caching is off: {e}");
                cache_error = Some(e);
            }
        }
        let plan = Arc::new(plan);
        Ok(Engine {
            spec,
            optimized,
            deferred,
            finish,
            source,
            plan,
            options,
            compute_threads,
            most_threads,
            runtime,
            cache_error,
        })
    }

    /// The optimizer's plan this engine runs: the stages in their order, the fields the source
    /// reads, and each rewrite (see [`granary_optimizer::Plan::explain`]).
    pub fn optimized(&self) -> &granary_optimizer::Plan {
        &self.optimized
    }

    /// The images a lease's consumers make when it says `images_on_client`: the field and the
    /// images' size; `None` when the pipeline does not end in a fused image run that can be
    /// planned (see `crate::ops::image::planning`).
    pub fn planned_output(&self) -> Option<&PlannedOutput> {
        self.plan.client_images.as_ref().map(|images| &images.output)
    }

    /// The final normalization left to the consumer, with `EngineOptions::defer_normalize`.
    pub fn deferred(&self) -> Option<&DeferredNormalize> {
        self.deferred.as_ref()
    }

    /// The cache store and the entries tasks may write or read, when the spec caches.
    pub fn cache(&self) -> Option<&EngineCache> {
        self.plan.cache.as_deref()
    }

    /// [`Engine::cache`], shared: what a service checks leases' cache tasks against.
    pub fn shared_cache(&self) -> Option<Arc<EngineCache>> {
        self.plan.cache.clone()
    }

    /// Why caching is off although the spec asks for it (the store could not be opened).
    pub fn cache_error(&self) -> Option<&str> {
        self.cache_error.as_deref()
    }

    /// What measures the cache profile, on any thread (see [`crate::cache::profile`]); `None`
    /// when the spec does not cache.
    pub fn cache_profiler(&self) -> Option<crate::cache::profile::Profiler> {
        self.plan.cache.as_ref()?;
        Some(crate::cache::profile::Profiler {
            source: Arc::clone(&self.source),
            plan: Arc::clone(&self.plan),
            threads: self.options.threads,
            rt: self.runtime.handle().clone(),
        })
    }

    /// Measures what caching would cost and save, here; `None` when the spec does not cache.
    pub fn cache_profile(
        &self,
        limits: crate::cache::profile::Limits,
    ) -> Option<granary_proto::v1::CacheProfile> {
        self.cache_profiler()?.measure(limits)
    }

    /// The spec being run: as written, but with the stages in the plan's order and the source
    /// reading the plan's fields.
    pub fn spec(&self) -> &InputPipelineSpec {
        &self.spec
    }

    /// The stages as they run: `(field path, name)`, where a fused run of stages is one entry
    /// (`spec.stages[0..=3]`, `image.decode → image.random_resized_crop → …`).
    pub fn stages(&self) -> Vec<(&str, &str)> {
        let finish = self.finish.iter().map(|(_, path, name)| (path.as_str(), name.as_str()));
        self.plan.stages.iter().map(|s| (s.path.as_str(), s.name.as_str())).chain(finish).collect()
    }

    /// Elements per batch.
    pub fn batch_size(&self) -> usize {
        self.plan.batch_size
    }

    /// The listed source.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Split indices in the order epoch `epoch` visits them: a seeded permutation when the spec
    /// shuffles, the listing order otherwise.
    pub fn split_order(&self, epoch: u32) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.source.splits().len()).collect();
        if self.plan.shuffle_buffer > 0 {
            SeededRng::new(self.plan.seed, Stream::SplitOrder, &[u64::from(epoch)]).shuffle(&mut order);
        }
        order
    }

    /// Runs `tasks` in order and yields each split's batches (full ones, then its tail). A feed
    /// (a channel's iterator) keeps the execution open for tasks that arrive later.
    pub fn run_tasks(&self, tasks: Tasks) -> Execution {
        let opts = ExecOptions {
            threads: self.compute_threads,
            most_threads: self.most_threads,
            prefetch_bytes: self.options.prefetch_bytes,
            finish: self.finish.as_ref().map(|(finish, ..)| Arc::clone(finish)),
        };
        executor::execute(
            Arc::clone(&self.source),
            Arc::clone(&self.plan),
            tasks,
            opts,
            self.runtime.handle().clone(),
        )
    }

    /// Runs epoch `epoch` and yields its batches: every split's full batches, with split tails
    /// merged into full batches, and a last partial batch unless `dropRemainder`.
    pub fn run_epoch(&self, epoch: u32) -> EpochBatches {
        self.run_epochs(epoch..epoch.saturating_add(1))
    }

    /// Runs `epochs` back to back in one execution, so the pipeline does not drain and refill
    /// between epochs, and yields their batches in order, each epoch's as [`Engine::run_epoch`]
    /// would (a batch never mixes epochs; [`Batch::epoch`] tells them apart).
    pub fn run_epochs(&self, epochs: std::ops::Range<u32>) -> EpochBatches {
        let tasks: Vec<Task> = epochs
            .flat_map(|epoch| {
                self.split_order(epoch).into_iter().map(move |split| Task::compute(epoch, split))
            })
            .collect();
        EpochBatches {
            execution: self.run_tasks(Box::new(tasks.into_iter())),
            batch_size: self.plan.batch_size,
            drop_remainder: self.spec.batch.drop_remainder,
            tails: None,
            ready: VecDeque::new(),
            done: false,
            skips: executor::Skips::default(),
            errors: self.spec.errors.clone().unwrap_or_default(),
        }
    }
}

/// The batches of one or more epochs, in order.
pub struct EpochBatches {
    execution: Execution,
    batch_size: usize,
    drop_remainder: bool,
    /// Split tails of the current epoch, merged, fewer than a batch.
    tails: Option<Batch>,
    /// Batches ready to hand out, in order.
    ready: VecDeque<Batch>,
    done: bool,
    /// Elements dropped so far under `spec.errors.policy: skip`, over every split.
    skips: executor::Skips,
    /// `spec.errors`: the limit on skips.
    errors: granary_crds::ErrorsSpec,
}

impl EpochBatches {
    /// Most bytes held against the prefetch budget at once so far.
    pub fn peak_in_flight(&self) -> usize {
        self.execution.peak_in_flight()
    }

    /// Most compute threads run at once so far (see [`most_compute_threads`]).
    pub fn peak_compute_threads(&self) -> usize {
        self.execution.peak_compute_threads()
    }

    /// Elements dropped so far because a stage failed on them (`spec.errors.policy: skip`), over
    /// every split completed: the count the run summary reports.
    pub fn skipped(&self) -> u64 {
        self.skips.elements
    }

    /// Counts a completed split's skips; past `spec.errors.maxSkipped` the run fails.
    fn count_skips(&mut self, skipped: executor::Skips) -> Result<(), EngineError> {
        if skipped.elements == 0 {
            return Ok(());
        }
        self.skips.elements = self.skips.elements.saturating_add(skipped.elements);
        if self.skips.first.is_none() {
            self.skips.first = skipped.first;
        }
        match self.errors.exceeded_by(self.skips.elements) {
            Some(max) => Err(EngineError::TooManySkipped {
                skipped: self.skips.elements,
                max,
                first: self.skips.first.clone().unwrap_or_else(|| "not described".into()),
            }),
            None => Ok(()),
        }
    }

    /// Ends the iteration with `error`: nothing after it is handed out.
    fn fail(&mut self, error: EngineError) -> EngineError {
        self.done = true;
        self.ready.clear();
        error
    }

    /// Queues the merged tails as the epoch's last batch (unless `dropRemainder`).
    fn flush_tails(&mut self) {
        if let Some(rest) = self.tails.take().filter(|b| !b.is_empty() && !self.drop_remainder) {
            self.ready.push_back(rest);
        }
    }

    fn take(&mut self, batch: Batch, tail: bool) -> Result<(), EngineError> {
        if self.tails.as_ref().is_some_and(|t| t.epoch != batch.epoch) {
            self.flush_tails();
        }
        if !tail {
            self.ready.push_back(batch);
            return Ok(());
        }
        match self.tails.as_mut() {
            None => self.tails = Some(batch),
            Some(acc) => batch::concat(acc, batch, self.batch_size)
                .map_err(|e: BatchError| EngineError::Exec(e.into()))?,
        }
        if let Some(acc) = self.tails.as_mut()
            && acc.len() >= self.batch_size
        {
            let rest = batch::split_off(acc, self.batch_size, self.batch_size);
            let full = std::mem::replace(acc, rest);
            self.ready.push_back(full);
        }
        Ok(())
    }
}

impl Iterator for EpochBatches {
    type Item = Result<Batch, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(mut batch) = self.ready.pop_front() {
                // Batches are final here: a ragged one gets its width and mask.
                batch.pad();
                return Some(Ok(batch));
            }
            if self.done {
                return None;
            }
            match self.execution.next() {
                Some(Ok(Output::Batch { batch, tail })) => {
                    if let Err(e) = self.take(batch, tail) {
                        return Some(Err(self.fail(e)));
                    }
                }
                Some(Ok(Output::SplitDone { skipped, .. })) => {
                    if let Err(e) = self.count_skips(skipped) {
                        return Some(Err(self.fail(e)));
                    }
                }
                Some(Err(e)) => return Some(Err(self.fail(e.into()))),
                None => {
                    self.done = true;
                    self.flush_tails();
                }
            }
        }
    }
}

/// Starts the runners of the pipeline's Python stages, when it has any, and records each stage's
/// module file as a resource of the stage (a changed function changes the cache fingerprints
/// after it).
/// Compute threads for `threads` cores (`EngineOptions::threads`): one more when a stage runs in
/// Python. A compute thread waits while its runner calls the function, leaving its core to the
/// runner, and the hand-off back is slow when a core has gone idle in between (on a VM, a halted
/// vCPU takes 0.1 ms or more to wake); the extra thread, with its own runner, keeps every core
/// busy meanwhile. The benchmark measured 18% more throughput for the ImageNet recipe with a
/// NumPy colour jitter on 2 cores. With fewer threads than cores, the extra thread can take part
/// of another core: to hold a process to N cores, bind it to them (`taskset`, a container's CPU
/// limit), which the default count follows.
pub fn compute_threads(threads: usize, configs: &[OpConfig]) -> usize {
    threads.max(1) + usize::from(configs.iter().any(|c| c.python_call().is_some()))
}

/// Most compute threads the executor's tuner may run for `threads` cores: with a Python stage and
/// the optimizer on (`spec.optimize`), up to 4 per core (at most 32), each with its runner, since
/// a Python function may wait (on the network, a lock, a sleep) and leave its core idle; without
/// one, [`compute_threads`]: native stages keep their core busy, so more threads would only
/// contend. The tuner adds threads only while they raise the element rate (see the executor's
/// `tune`).
pub fn most_compute_threads(threads: usize, configs: &[OpConfig], optimize: bool) -> usize {
    let start = compute_threads(threads, configs);
    let python = configs.iter().any(|c| c.python_call().is_some());
    if optimize && python { start.max(threads.max(1).saturating_mul(4).min(32)) } else { start }
}

/// The runs of stages of `spec` (a plan's spec, see [`Engine::spec`]) that the executor fuses
/// into one operator on the image path `path`, as index ranges into `spec.stages`: what
/// [`Engine::stages`] shows once the pipeline is open, without listing its source. A spec whose
/// stages do not parse has none.
pub fn fused_runs(spec: &InputPipelineSpec, path: ImagePath) -> Vec<std::ops::Range<usize>> {
    let Ok(configs) = spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| OpConfig::parse(s, &format!("spec.stages[{i}]")))
        .collect::<Result<Vec<_>, _>>()
    else {
        return Vec::new();
    };
    let pinned = entries::pinned_cut(spec).filter(|_| entries::caches(spec));
    let mut runs = Vec::new();
    let mut i = 0;
    while i < configs.len() {
        let end = pinned.filter(|k| *k > i).map_or(configs.len(), |k| k.min(configs.len()));
        match ops::fused_len(&configs[i..end], path, keeps_cuts(spec)) {
            Some(used) => {
                runs.push(i..i + used);
                i += used;
            }
            None => i += 1,
        }
    }
    runs
}

/// Whether the autocacher may cut `spec` after any stage of its deterministic prefix
/// (`cache.policy: auto` with a store): then runs of deterministic stages stay apart, since a
/// fused run offers no cut inside it.
fn keeps_cuts(spec: &InputPipelineSpec) -> bool {
    entries::caches(spec) && spec.cache.as_ref().is_some_and(|c| c.policy == granary_crds::CachePolicy::Auto)
}

/// What the source reads: the fields the plan gave every source (`source.fields`), or all.
fn projection(spec: &InputPipelineSpec) -> Option<crate::source::Projection> {
    let sources: Vec<&granary_crds::SourceSpec> =
        spec.source.iter().chain(spec.sources.iter().map(|s| &s.source)).collect();
    let all: Option<Vec<&Vec<String>>> = sources.iter().map(|s| s.fields.as_ref()).collect();
    all.filter(|f| !f.is_empty()).map(|f| f.into_iter().flatten().cloned().collect())
}

/// The field path of a run of stages fused into one, by their places as written:
/// `spec.stages[0..=3]`, or `spec.stages[0,1,3,2]` when the plan reordered them.
fn stages_path(origins: &[usize]) -> String {
    let contiguous = origins.windows(2).all(|w| w[1] == w[0] + 1);
    match (origins.first(), origins.last()) {
        (Some(a), Some(b)) if contiguous => format!("spec.stages[{a}..={b}]"),
        _ => {
            let list: Vec<String> = origins.iter().map(ToString::to_string).collect();
            format!("spec.stages[{}]", list.join(","))
        }
    }
}

fn start_python(
    configs: &[OpConfig],
    origins: &[usize],
    base_dir: &Path,
    options: &EngineOptions,
    threads: usize,
    resources: &Resources,
) -> Result<Option<PythonStages>, EngineError> {
    let stages: Vec<(usize, PythonCall)> =
        configs.iter().enumerate().filter_map(|(i, c)| Some((i, c.python_call()?))).collect();
    let Some(&(first, _)) = stages.first() else { return Ok(None) };
    let origin = |i: usize| origins.get(i).copied().unwrap_or(i);
    let build = |i: usize, message: String| EngineError::Build {
        path: format!("spec.stages[{}]", origin(i)),
        error: BuildError(message),
    };
    let interpreter = Interpreter::find(options.python.as_deref()).map_err(|e| build(first, e))?;
    let paths = vec![base_dir.display().to_string()];
    let configs_only = stages.iter().map(|(_, m)| m.clone()).collect();
    let python = PythonStages::start(interpreter, configs_only, paths, threads).map_err(|e| match e {
        StartError::Stage { stage, message } => EngineError::Build {
            path: format!("spec.stages[{}].function", origin(stages.get(stage).map_or(first, |s| s.0))),
            error: BuildError(message),
        },
        other => build(first, other.to_string()),
    })?;
    if let Ok(mut read) = resources.read.lock() {
        // Named by the function, not the file's path, so that entries are shared across
        // machines that install the module in different places.
        for ((i, m), facts) in stages.iter().zip(python.facts()) {
            read.push(entries::Resource {
                stage: *i,
                location: m.function.clone(),
                sha256: facts.sha256.clone(),
            });
        }
    }
    Ok(Some(python))
}

/// A name for this process's cache writes, distinct across processes and engines.
fn writer_id() -> String {
    static ENGINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = ENGINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("w{}-{:x}-{n}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

/// The files stages read when they were built (tokenizers and the like), by stage, so that a
/// changed file changes the fingerprint of every cache entry after that stage.
#[derive(Clone, Default)]
struct Resources {
    /// The stage being built.
    stage: Arc<std::sync::atomic::AtomicUsize>,
    read: Arc<std::sync::Mutex<Vec<entries::Resource>>>,
}

/// Reads tokenizer files and the like: a path relative to the manifest's folder, an absolute
/// path, or an object-store URL; records what each stage read in `resources`.
fn build_context(base_dir: &Path, rt: tokio::runtime::Handle, resources: Resources) -> BuildContext {
    let base: PathBuf = base_dir.to_path_buf();
    let read = move |location: &str| -> Result<Vec<u8>, BuildError> {
        if location.contains("://") {
            let located = store::open(location).map_err(|e| BuildError(e.to_string()))?;
            let bytes =
                rt.block_on(get_bytes(located.store, located.path)).map_err(|e| BuildError(e.to_string()))?;
            return Ok(bytes.to_vec());
        }
        let path = location.strip_prefix("file:").unwrap_or(location);
        let full = base.join(path);
        std::fs::read(&full).map_err(|e| BuildError(format!("cannot read `{}`: {e}", full.display())))
    };
    BuildContext {
        base_dir: base_dir.to_path_buf(),
        read: Box::new(move |location: &str| {
            let bytes = read(location)?;
            let stage = resources.stage.load(std::sync::atomic::Ordering::Relaxed);
            if let Ok(mut read) = resources.read.lock() {
                read.push(entries::Resource::new(stage, location, &bytes));
            }
            Ok(bytes)
        }),
        python: None,
    }
}
