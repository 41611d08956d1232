//! `python.map`: the user's own Python functions as stages.
//!
//! The worker never links Python. Each engine with Python stages starts one runner process per
//! compute thread ([`Runners`]), with the interpreter [`Interpreter::find`] picks; each runner
//! imports every Python stage's function once. A compute thread that reaches a Python stage
//! borrows a runner, copies the element's fields into the shared memory they both map, and waits
//! for the function's result, which comes back the same way: the Python processes, not the GIL
//! of one, bound the parallelism. Stages before and after run in Rust as usual.

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
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use granary_crds::ops::PythonMap;
use runner::CallError;
use std::sync::Arc;
use wire::CallHeader;

/// The Python stages of one pipeline and the runners that run them.
pub struct PythonStages {
    runners: Arc<Runners>,
    configs: Vec<PythonMap>,
}

impl PythonStages {
    /// Starts `threads` runners for `configs` (the pipeline's Python stages, in order), importing
    /// from `paths` first.
    pub fn start(
        interpreter: Interpreter,
        configs: Vec<PythonMap>,
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
    pub fn op(&self, config: &PythonMap) -> Option<PythonMapOp> {
        let stage = self.configs.iter().position(|c| c == config)?;
        let facts = self.runners.facts().get(stage).cloned().unwrap_or_default();
        Some(PythonMapOp {
            runners: Arc::clone(&self.runners),
            stage: u16::try_from(stage).ok()?,
            function: config.function.clone(),
            batched: config.batched,
            rng: facts.rng,
        })
    }
}

/// Imports `configs`' functions in `interpreter` (from `paths` first) and checks that each fits
/// its stage, without running anything: what `granary validate` does. Returns Python's and
/// NumPy's versions.
pub fn check(
    interpreter: &Interpreter,
    configs: &[PythonMap],
    paths: Vec<String>,
) -> Result<(String, String), StartError> {
    let setup = Setup { stages: configs.iter().map(setup_of).collect(), paths, check: true };
    let (_runner, hello) = runner::Runner::start(interpreter, &setup)?;
    Ok((hello.python, hello.numpy))
}

/// How a runner is told about a stage.
pub fn setup_of(config: &PythonMap) -> StageSetup {
    StageSetup { function: config.function.clone(), batched: config.batched, args: config.args.clone() }
}

/// One `python.map` stage.
pub struct PythonMapOp {
    runners: Arc<Runners>,
    stage: u16,
    function: String,
    batched: bool,
    rng: bool,
}

impl PythonMapOp {
    /// Calls the function on `elements` (one, or a group when batched) and replaces their fields
    /// with what it returned. The function's `rng` is seeded from `rng`, the stream of the
    /// element (of the group's first element).
    pub fn call(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<(), OpError> {
        let header = CallHeader { stage: self.stage, rng: self.rng.then(|| rng.next_u64()) };
        let mut lent = self.runners.checkout().map_err(|e| {
            OpError::new(format!("cannot start a Python runner for `{}`: {e}", self.function))
        })?;
        let Some(runner) = lent.runner() else {
            return Err(OpError::new("no Python runner is available"));
        };
        match runner.call(&header, elements, self.batched) {
            Ok(rows) => {
                for (element, fields) in elements.iter_mut().zip(rows) {
                    element.fields = fields;
                }
                Ok(())
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

impl Operator for PythonMapOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        self.call(std::slice::from_mut(element), rng)
    }

    fn batched(&self) -> bool {
        self.batched
    }

    fn apply_group(&self, elements: &mut [Element], rng: &mut SeededRng) -> Result<(), OpError> {
        self.call(elements, rng)
    }
}
