//! `python.map` and `python.filter`: the user's own Python functions as stages.
//!
//! The worker never links Python. Each engine with Python stages starts one runner process per
//! compute thread ([`Runners`]), with the interpreter [`Interpreter::find`] picks; each runner
//! imports every Python stage's function once. A compute thread that reaches a Python stage
//! borrows a runner, copies the fields of its elements (a group of consecutive ones: an
//! element-wise stage gathers its calls, see [`Operator::gathers`]) into the shared memory they
//! both map, and waits for the function's results, which come back the same way: the Python
//! processes, not the GIL of one, bound the parallelism. Stages before and after run in Rust as
//! usual. A filter's function answers with one decision per element instead of fields, and its
//! elements stay as they were.

pub mod cpu;
mod interpreter;
mod pool;
mod runner;
mod shm;
mod spawner;
mod wire;

pub use interpreter::{Interpreter, PYTHON_ENV};
pub use pool::Runners;
pub use runner::{Setup, StageFacts, StageSetup, StartError, describe_exit};

use crate::element::{Element, FieldName};
use crate::ops::{Fate, OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::{PythonCall, PythonRole};
use runner::{CallError, Returned};
use std::sync::Arc;
use wire::CallHeader;

/// The Python stages of one pipeline and the runners that run them.
pub struct PythonStages {
    runners: Arc<Runners>,
    configs: Vec<PythonCall>,
}

impl PythonStages {
    /// Starts `threads` runners for `configs` (the pipeline's Python stages, in order), importing
    /// from `paths` first.
    pub fn start(
        interpreter: Interpreter,
        configs: Vec<PythonCall>,
        paths: Vec<String>,
        threads: usize,
    ) -> Result<PythonStages, StartError> {
        let setup = Setup { stages: configs.iter().map(setup_of).collect(), paths, check: false };
        let runners = Arc::new(Runners::start(interpreter, setup, threads)?);
        Ok(PythonStages { runners, configs })
    }

    /// What each stage's import found, in order.
    pub fn facts(&self) -> &[StageFacts] {
        self.runners.facts()
    }

    /// The operator of `config`, one of the stages this was started with.
    pub fn op(&self, config: &PythonCall) -> Option<PythonOp> {
        let stage = self.configs.iter().position(|c| c == config)?;
        let facts = self.runners.facts().get(stage).cloned().unwrap_or_default();
        Some(PythonOp {
            runners: Arc::clone(&self.runners),
            stage: u16::try_from(stage).ok()?,
            function: config.function.clone(),
            batched: config.batched,
            filter: config.role == PythonRole::Filter,
            rng: facts.rng,
            writes: config.writes.clone(),
        })
    }
}

/// Imports `configs`' functions in `interpreter` (from `paths` first) and checks that each fits
/// its stage, without running anything: what `granary validate` does. Returns Python's and
/// NumPy's versions.
pub fn check(
    interpreter: &Interpreter,
    configs: &[PythonCall],
    paths: Vec<String>,
) -> Result<(String, String), StartError> {
    let setup = Setup { stages: configs.iter().map(setup_of).collect(), paths, check: true };
    let (_runner, hello) = runner::Runner::start(interpreter, &setup)?;
    Ok((hello.python, hello.numpy))
}

/// How a runner is told about a stage.
pub fn setup_of(config: &PythonCall) -> StageSetup {
    StageSetup {
        function: config.function.clone(),
        batched: config.batched,
        args: config.args.clone(),
        filter: config.role == PythonRole::Filter,
    }
}

/// One `python.map` or `python.filter` stage.
pub struct PythonOp {
    runners: Arc<Runners>,
    stage: u16,
    function: String,
    batched: bool,
    /// A filter: the function decides which elements to keep.
    filter: bool,
    rng: bool,
    /// A map's declared `writes`: the only fields it may add or remove.
    writes: Option<Vec<String>>,
}

impl PythonOp {
    /// Calls the function on `elements` (one, or a group when batched). A map replaces their
    /// fields with what it returned and gives `None`; a filter leaves them as they are and gives
    /// which to keep. The function's `rng` is seeded from `rng`, the stream of the element (of
    /// the group, when batched).
    pub fn call(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<Option<Vec<bool>>, OpError> {
        let header = CallHeader { stage: self.stage, rng: self.rng.then(|| rng.next_u64()) };
        let mut lent = self.runners.checkout().map_err(|e| {
            OpError::new(format!("cannot start a Python runner for `{}`: {e}", self.function))
        })?;
        let Some(runner) = lent.runner() else {
            return Err(OpError::new("no Python runner is available"));
        };
        // The call may take the elements' fields (to hand unchanged inputs back without a
        // copy): what the declared writes are checked against is what they held before it.
        let before = self.field_names(elements);
        match runner.call(&header, elements, self.batched) {
            Ok(Returned::Fields(rows)) if !self.filter => {
                for (i, (element, fields)) in elements.iter_mut().zip(rows).enumerate() {
                    self.check_writes(element, before.as_ref().and_then(|b| b.get(i)), &fields)?;
                    element.fields = fields;
                }
                Ok(None)
            }
            Ok(Returned::Kept(kept)) if self.filter => Ok(Some(kept)),
            Ok(_) => {
                lent.discard();
                Err(self.error(CallError::WrongKind, 1))
            }
            Err(error) => {
                if error.breaks_runner() {
                    lent.discard();
                }
                Err(self.error(error, 1))
            }
        }
    }
}

impl PythonOp {
    /// Calls an element-wise function on each of `elements` in one round trip, each with a seed
    /// from its own stream; a map replaces each element's fields, a filter says which to keep.
    fn call_each(
        &self,
        elements: &mut [Element],
        rngs: &mut [&mut SeededRng],
    ) -> Result<Vec<Fate>, (usize, OpError)> {
        let seeds: Option<Vec<u64>> = self.rng.then(|| rngs.iter_mut().map(|r| r.next_u64()).collect());
        let mut lent = self.runners.checkout().map_err(|e| {
            (0, OpError::new(format!("cannot start a Python runner for `{}`: {e}", self.function)))
        })?;
        let Some(runner) = lent.runner() else {
            return Err((0, OpError::new("no Python runner is available")));
        };
        let before = self.field_names(elements);
        let returned = match runner.call_each(self.stage, seeds.as_deref(), elements) {
            Ok(returned) => returned,
            Err((at, error)) => {
                let broken = error.breaks_runner();
                let error = self.error(error, elements.len());
                if broken {
                    lent.discard();
                }
                return Err((at, error));
            }
        };
        let mut fates = Vec::with_capacity(returned.len());
        for (i, (element, returned)) in elements.iter_mut().zip(returned).enumerate() {
            fates.push(match returned {
                Returned::Fields(mut rows) if !self.filter && rows.len() == 1 => {
                    let fields = rows.swap_remove(0);
                    self.check_writes(element, before.as_ref().and_then(|b| b.get(i)), &fields)
                        .map_err(|e| (i, e))?;
                    element.fields = fields;
                    Fate::Keep
                }
                Returned::Kept(kept) if self.filter && kept.len() == 1 => {
                    if kept[0] {
                        Fate::Keep
                    } else {
                        Fate::Drop
                    }
                }
                _ => {
                    lent.discard();
                    return Err((i, self.error(CallError::WrongKind, 1)));
                }
            });
        }
        Ok(fates)
    }

    /// The names of each element's fields, when the stage declares its writes (what
    /// [`PythonOp::check_writes`] compares the function's output with).
    fn field_names(&self, elements: &[Element]) -> Option<Vec<Vec<FieldName>>> {
        self.writes.as_ref()?;
        Some(elements.iter().map(|e| e.fields.iter().map(|(n, _)| n.clone()).collect()).collect())
    }

    /// Checks a map's new `fields` for `element`, which had the fields `before` the call,
    /// against its declared `writes`: a field added or dropped outside them would make the
    /// optimizer's moves across this stage unsound.
    fn check_writes(
        &self,
        element: &Element,
        before: Option<&Vec<FieldName>>,
        fields: &[(FieldName, crate::element::Value)],
    ) -> Result<(), OpError> {
        let (Some(writes), Some(before)) = (&self.writes, before) else { return Ok(()) };
        let declared = |name: &str| writes.iter().any(|w| w == name);
        let added = fields.iter().map(|(n, _)| n).find(|n| !declared(n) && !before.contains(n));
        let dropped = before.iter().find(|n| !declared(n) && !fields.iter().any(|(f, _)| f == *n));
        let (what, name) = match (added, dropped) {
            (Some(n), _) => ("added", n),
            (None, Some(n)) => ("dropped", n),
            (None, None) => return Ok(()),
        };
        Err(OpError::new(format!(
            "`{}` {what} field `{name}` of element `{}`, but the stage's `writes` ({}) does not list it; \
             add it to `writes`, or remove `reads` and `writes` to declare nothing",
            self.function,
            element.key,
            writes.join(", ")
        )))
    }

    /// The stage's error for a call on `count` elements that failed with `error`.
    fn error(&self, error: CallError, count: usize) -> OpError {
        let function = &self.function;
        match error {
            CallError::Raised(traceback) => {
                OpError::new(format!("`{function}` raised an exception:\n{traceback}"))
            }
            CallError::Input(e) => e,
            CallError::Died(how) => OpError::new(format!(
                "the Python process running `{function}` died{}: {how}; a new one takes the next call",
                if count > 1 {
                    format!(" during a call on {count} elements, from this one on")
                } else {
                    String::new()
                }
            )),
            CallError::WrongKind => OpError::new(format!(
                "the Python process running `{function}` answered as for another kind of stage"
            )),
            CallError::Protocol(e) => {
                OpError::new(format!("the Python process running `{function}` broke the protocol: {e}"))
            }
        }
    }
}

impl Operator for PythonOp {
    /// A map's new fields; a filter evaluates its function and leaves the element as it is.
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        self.call(std::slice::from_mut(element), rng).map(|_| ())
    }

    fn run(&self, element: &mut Element, rng: &mut SeededRng) -> Result<Fate, OpError> {
        let kept = self.call(std::slice::from_mut(element), rng)?;
        Ok(match kept.as_deref() {
            Some([false]) => Fate::Drop,
            _ => Fate::Keep,
        })
    }

    fn batched(&self) -> bool {
        self.batched
    }

    /// Element-wise functions take groups too, one round trip for all, each element with its
    /// own seed.
    fn gathers(&self) -> bool {
        !self.batched
    }

    fn run_each(
        &self,
        elements: &mut [Element],
        rngs: &mut [&mut SeededRng],
    ) -> Result<Vec<Fate>, (usize, OpError)> {
        self.call_each(elements, rngs)
    }

    fn apply_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<(), OpError> {
        self.call(elements, rng).map(|_| ())
    }

    fn run_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<Option<Vec<bool>>, OpError> {
        self.call(elements, rng)
    }

    /// One runner per compute thread: the pool (shared by the pipeline's Python stages) grows
    /// with the threads, and shrinks as runners come back once there are fewer.
    fn set_threads(&self, threads: usize) {
        self.runners.resize(threads);
    }
}
