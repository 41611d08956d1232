//! Which Python runs the stages: the one named by `--python` or `GRANARY_PYTHON`, else the
//! active virtual environment's, else `python3` on PATH.

use std::path::{Path, PathBuf};

/// The environment variable that names the Python interpreter for `python.*` stages.
pub const PYTHON_ENV: &str = "GRANARY_PYTHON";

/// The interpreter to run, and where the choice came from (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// The executable.
    pub path: PathBuf,
    /// Where it was found: `--python or GRANARY_PYTHON` (the flag, or its variable read by the
    /// command line), `GRANARY_PYTHON`, `VIRTUAL_ENV` or `PATH`.
    pub origin: &'static str,
}

impl Interpreter {
    /// The interpreter to use: `explicit` (from `--python`) first, then `GRANARY_PYTHON`, then
    /// `$VIRTUAL_ENV/bin/python`, then `python3` on PATH. `Err` says where it looked.
    pub fn find(explicit: Option<&Path>) -> Result<Interpreter, String> {
        if let Some(path) = explicit {
            return Ok(Interpreter { path: path.to_path_buf(), origin: "--python or GRANARY_PYTHON" });
        }
        if let Some(path) = std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) {
            return Ok(Interpreter { path: PathBuf::from(path), origin: PYTHON_ENV });
        }
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV").filter(|p| !p.is_empty()) {
            let path = Path::new(&venv).join("bin/python");
            if path.is_file() {
                return Ok(Interpreter { path, origin: "VIRTUAL_ENV" });
            }
        }
        let on_path = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .map(|dir| dir.join("python3"))
            .find(|p| p.is_file());
        match on_path {
            Some(path) => Ok(Interpreter { path, origin: "PATH" }),
            None => Err(format!(
                "no Python found: none named by --python or {PYTHON_ENV}, no virtual environment active, \
                 and no python3 on PATH; install Python 3 with NumPy, or name an interpreter with \
                 --python or {PYTHON_ENV}"
            )),
        }
    }
}

impl std::fmt::Display for Interpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (from {})", self.path.display(), self.origin)
    }
}
