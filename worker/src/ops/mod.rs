//! Operator implementations: one module per family, one file per operator. The typed configs
//! live in `granary_crds::ops`; [`build`] maps each config to its implementation.

pub mod filter;
pub mod image;
pub mod python;
pub mod table;
pub mod test;
pub mod text;

use crate::element::Element;
use crate::seed::SeededRng;
use granary_crds::OpConfig;
use std::path::PathBuf;

/// A failure applying an operator to one element.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

impl OpError {
    /// An error with a message that says what was wrong with the element and how to fix it.
    pub fn new(message: impl Into<String>) -> OpError {
        OpError(message.into())
    }
}

/// A failure building an operator from its config (e.g. an unreadable tokenizer file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub String);

/// Reads a whole file given as a path or an object-store URL.
pub type ReadFn = dyn Fn(&str) -> Result<Vec<u8>, BuildError> + Send + Sync;

/// What operators may need when they are built.
pub struct BuildContext {
    /// Folder that relative paths in the spec resolve from (the manifest's folder).
    pub base_dir: PathBuf,
    /// Reads a whole file given as a path (relative to `base_dir`) or an object-store URL.
    pub read: Box<ReadFn>,
    /// The runners of the pipeline's Python stages, when it has any.
    pub python: Option<std::sync::Arc<python::PythonStages>>,
}

/// What becomes of an element after a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It goes on to the next stage.
    Keep,
    /// A filter rejected it: the stages after this one do not run on it, and its split produces
    /// one element fewer.
    Drop,
}

/// One stage's implementation: applied to every element, possibly in parallel.
///
/// The executor calls [`Operator::run`] (and [`Operator::run_group`] for batched stages). An
/// operator that transforms implements [`Operator::apply`] and keeps the defaults, which apply
/// and keep every element; a filter overrides `run` (and `run_group`) to say which elements it
/// drops.
pub trait Operator: Send + Sync {
    /// Transforms `element` in place. Random operators draw only from `rng`, the element's own
    /// seeded stream, so that output does not depend on threads or timing. A filter leaves the
    /// element as it is (its decision is what [`Operator::run`] returns).
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError>;

    /// Runs the stage on `element` and says whether it goes on: [`Operator::apply`] and
    /// [`Fate::Keep`] unless the operator is a filter.
    #[inline]
    fn run(&self, element: &mut Element, rng: &mut SeededRng) -> Result<Fate, OpError> {
        self.apply(element, rng)?;
        Ok(Fate::Keep)
    }

    /// Whether the operator takes consecutive elements of a split together
    /// ([`Operator::apply_group`]) rather than one at a time.
    fn batched(&self) -> bool {
        false
    }

    /// Transforms a group of consecutive elements of one split at once; `rng` is the group's own
    /// seeded stream. Only called when [`Operator::batched`] says so.
    fn apply_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<(), OpError> {
        elements.iter_mut().try_for_each(|e| self.apply(e, rng))
    }

    /// Runs the stage on a group (as [`Operator::apply_group`]) and says which members go on:
    /// `None` when all do, else one flag per member (`true`: kept). Only called when
    /// [`Operator::batched`] says so.
    fn run_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<Option<Vec<bool>>, OpError> {
        self.apply_group(elements, rng)?;
        Ok(None)
    }

    /// Whether the executor should hand this element-wise stage several consecutive elements of a
    /// split in one call ([`Operator::run_each`]): a stage with a fixed cost per call (a Python
    /// stage's round trip to its runner) then pays it once per group. Each element still gets
    /// its own stream, so the output is the same as one call per element.
    fn gathers(&self) -> bool {
        false
    }

    /// Runs the stage on each of `elements` with its own stream (`rngs[i]` for `elements[i]`),
    /// as [`Operator::run`] would one at a time, and says which go on. An error carries the
    /// index of the element it concerns.
    fn run_each(
        &self,
        elements: &mut [Element],
        rngs: &mut [&mut SeededRng],
    ) -> Result<Vec<Fate>, (usize, OpError)> {
        elements
            .iter_mut()
            .zip(rngs.iter_mut())
            .enumerate()
            .map(|(i, (element, rng))| self.run(element, rng).map_err(|e| (i, e)))
            .collect()
    }

    /// The split-level packing this stage does, when it is `text.pack`: the executor then feeds
    /// it a split's elements in order and runs the later stages on its rows, rather than calling
    /// [`Operator::run`] per element.
    fn packing(&self) -> Option<&text::pack::PackOp> {
        None
    }

    /// The executor now runs `threads` compute threads (its tuner moved them): a stage that keeps
    /// one resource per concurrent call (a Python stage's runner processes) sizes it to match.
    fn set_threads(&self, _threads: usize) {}
}

/// A fused operator and how many stages it runs.
pub type FusedRun = (Box<dyn Operator>, usize);

/// The fused operator that runs the stages at the start of `configs` in one pass, with how many
/// it takes, or `None` when they run one by one: an image run ([`image::fuse_run`]) or
/// tokenization with truncation and padding ([`text::tokenize_pad`]). `keep_cuts` says that a
/// cache may cut the pipeline after any stage of its deterministic prefix, so fusions of
/// deterministic stages do not apply.
pub fn fuse(
    configs: &[OpConfig],
    path: image::fused::ImagePath,
    keep_cuts: bool,
    ctx: &BuildContext,
) -> Result<Option<FusedRun>, BuildError> {
    if let Some(run) = image::fuse_run(configs, path, keep_cuts) {
        return Ok(Some(run));
    }
    match text::tokenize_pad::TokenizePadOp::fuse(configs, ctx, keep_cuts) {
        Some(built) => built.map(|(op, used)| Some((Box::new(op) as Box<dyn Operator>, used))),
        None => Ok(None),
    }
}

/// How many stages at the start of `configs` [`fuse`] would take, without building anything.
pub fn fused_len(configs: &[OpConfig], path: image::fused::ImagePath, keep_cuts: bool) -> Option<usize> {
    image::fuse_run(configs, path, keep_cuts)
        .map(|(_, used)| used)
        .or_else(|| text::tokenize_pad::fusable(configs, keep_cuts))
}

/// Builds the implementation of one stage.
pub fn build(config: &OpConfig, ctx: &BuildContext) -> Result<Box<dyn Operator>, BuildError> {
    Ok(match config {
        OpConfig::ImageDecode(c) => Box::new(image::decode::DecodeOp::new(c)),
        OpConfig::ImageResize(c) => Box::new(image::resize::ResizeOp::new(c)),
        OpConfig::ImageCenterCrop(c) => Box::new(image::crop::CenterCropOp::new(c)),
        OpConfig::ImageRandomResizedCrop(c) => Box::new(image::crop::RandomResizedCropOp::new(c)),
        OpConfig::ImageFlip(c) => Box::new(image::flip::FlipOp::new(c)),
        OpConfig::ImageNormalize(c) => Box::new(image::normalize::NormalizeOp::new(c)),
        OpConfig::TextTokenize(c) => Box::new(text::tokenize::TokenizeOp::new(c, ctx)?),
        OpConfig::TextTruncatePad(c) => Box::new(text::truncate_pad::TruncatePadOp::new(c)),
        OpConfig::TextTruncate(c) => Box::new(text::truncate::TruncateOp::new(c)),
        OpConfig::TextPack(c) => Box::new(text::pack::PackOp::new(c)),
        OpConfig::TableSelect(c) => Box::new(table::select::SelectOp::new(c)),
        OpConfig::TableCast(c) => Box::new(table::cast::CastOp::new(c)),
        OpConfig::TestSleep(c) => Box::new(test::sleep::SleepOp::new(c)),
        OpConfig::PythonMap(_) | OpConfig::PythonFilter(_) => Box::new(
            config
                .python_call()
                .and_then(|call| ctx.python.as_ref()?.op(&call))
                .ok_or_else(|| BuildError("no Python runners were started for this stage".into()))?,
        ),
        OpConfig::Filter(c) => Box::new(filter::FilterOp::new(c)?),
    })
}
