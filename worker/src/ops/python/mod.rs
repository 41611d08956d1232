//! `python.map` and `python.filter`: the user's own Python functions as stages.
//!
//! The worker never links Python. Each engine with Python stages starts one runner process per
//! compute thread ([`Runners`]), with the interpreter [`Interpreter::find`] picks; each runner
//! imports every Python stage's function once. A compute thread that reaches a Python stage
//! borrows a runner, copies the element's fields into the shared memory they both map, and waits
//! for the function's result, which comes back the same way: the Python processes, not the GIL
//! of one, bound the parallelism. Stages before and after run in Rust as usual. A filter's
//! function answers with one decision per element instead of fields, and its elements stay as
//! they were.

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

use crate::element::Element;
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
        match runner.call(&header, elements, self.batched) {
            Ok(Returned::Fields(rows)) if !self.filter => {
                for (element, fields) in elements.iter_mut().zip(rows) {
                    element.fields = fields;
                }
                Ok(None)
            }
            Ok(Returned::Kept(kept)) if self.filter => Ok(Some(kept)),
            Ok(_) => {
                lent.discard();
                Err(OpError::new(format!(
                    "the Python process running `{}` answered as for another kind of stage",
                    self.function
                )))
            }
            Err(CallError::Raised(traceback)) => {
                Err(OpError::new(format!("`{}` raised an exception:\n{traceback}", self.function)))
            }
            Err(CallError::Input(e)) => Err(e),
            Err(CallError::Died(how)) => {
                lent.discard();
                Err(OpError::new(format!(
                    "the Python process running `{}` died: {how}; a new one takes the next call",
                    self.function
                )))
            }
            Err(CallError::Protocol(e)) => {
                lent.discard();
                Err(OpError::new(format!(
                    "the Python process running `{}` broke the protocol: {e}",
                    self.function
                )))
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

    fn apply_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<(), OpError> {
        self.call(elements, rng).map(|_| ())
    }

    fn run_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<Option<Vec<bool>>, OpError> {
        self.call(elements, rng)
    }
}
