//! `granary validate FILE...`: checks manifests and prints every problem as `FIELD_PATH: message`.
//!
//! `-` reads a manifest from standard input (relative `file:` paths in it resolve from the current
//! folder). Output, on stdout: `FILE: ok` for a valid file; for an invalid one a header
//! `FILE: invalid (N problems)` followed by one `FIELD_PATH: message` line per problem. A file that
//! cannot be read (missing, unreadable, not UTF-8) gets `FILE: what is wrong; the fix` on stderr.
//!
//! With `--json`, one JSON object per file and per line (JSON Lines), in the order given:
//! `{"file": "FILE", "valid": true|false, "problems": [{"path": "...", "message": "..."}]}`; a file
//! that cannot be read is invalid with one problem whose path is the file.
//!
//! Exit status ([`crate::exit`]): 0 when every file is valid, 2 when some file is invalid or could
//! not be read.

use crate::exit;
use granary_crds::manifest::{base_dir_of, parse_manifest};
use granary_crds::ops::PythonCall;
use granary_crds::read::{manifest_text, read_manifest_text};
use granary_crds::{OpConfig, Problem, Problems};
use granary_worker::ops::python::{Interpreter, StartError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `granary validate`.
#[derive(clap::Args, Clone, Debug)]
pub struct ValidateArgs {
    /// Manifest files; `-` reads one from standard input.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print one JSON object per file and per line: `{"file", "valid", "problems": [{"path",
    /// "message"}]}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub python: crate::args::PythonArg,
}

/// One file's verdict, as `--json` prints it.
#[derive(serde::Serialize)]
struct Verdict<'a> {
    file: String,
    valid: bool,
    problems: Vec<JsonProblem<'a>>,
    /// What was checked beyond the manifest, or could not be (the Python stages' imports).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<&'a str>,
}

#[derive(serde::Serialize)]
struct JsonProblem<'a> {
    path: &'a str,
    message: &'a str,
}

/// Validates each manifest in `args.files`, printing the report described in the module docs.
pub fn validate(args: &ValidateArgs) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut invalid = false;
    for file in &args.files {
        let name = file.display().to_string();
        let mut notes = Vec::new();
        let result = check(file, args.python.path.as_deref(), &mut notes);
        invalid |= result.is_err();
        // A failed write to stdout (a closed pipe) cannot be reported anywhere useful; the exit
        // status still tells.
        if args.json {
            let problems = match &result {
                Ok(()) => &[][..],
                Err(Failure::Unreadable(p)) => std::slice::from_ref(p),
                Err(Failure::Invalid(p)) => p.0.as_slice(),
            };
            let verdict = Verdict {
                file: name,
                valid: result.is_ok(),
                problems: problems
                    .iter()
                    .map(|p| JsonProblem { path: &p.path, message: &p.message })
                    .collect(),
                notes: notes.iter().map(String::as_str).collect(),
            };
            if let Ok(line) = serde_json::to_string(&verdict) {
                let _ = writeln!(out, "{line}");
            }
            continue;
        }
        match result {
            Err(Failure::Unreadable(problem)) => eprintln!("{problem}"),
            Ok(()) => {
                let _ = writeln!(out, "{name}: ok");
                for note in &notes {
                    let _ = writeln!(out, "  {note}");
                }
            }
            Err(Failure::Invalid(problems)) => {
                let n = problems.0.len();
                let _ = writeln!(out, "{name}: invalid ({n} problem{})", if n == 1 { "" } else { "s" });
                for problem in &problems.0 {
                    let _ = writeln!(out, "{problem}");
                }
            }
        }
    }
    let _ = out.flush();
    exit::code(if invalid { exit::INVALID_INPUT } else { exit::OK })
}

/// Why a manifest did not pass.
enum Failure {
    /// The file could not be read: one problem at the file's path.
    Unreadable(Problem),
    /// The manifest has problems.
    Invalid(Problems),
}

/// Reads and checks one manifest (`-`: standard input); notes what else was checked.
fn check(file: &Path, python: Option<&Path>, notes: &mut Vec<String>) -> Result<(), Failure> {
    let (text, base_dir) = if file.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin().lock().read_to_end(&mut bytes).map_err(|e| {
            Failure::Unreadable(Problem::new("-", format!("cannot read standard input ({e})")))
        })?;
        let text = manifest_text(bytes).map_err(|m| Failure::Unreadable(Problem::new("-", m)))?;
        (text, PathBuf::from("."))
    } else {
        (read_manifest_text(file).map_err(Failure::Unreadable)?, base_dir_of(file))
    };
    let manifest = parse_manifest(&text, &base_dir, &[]).map_err(Failure::Invalid)?;
    check_python(&manifest, python, notes).map_err(Failure::Invalid)
}

/// Imports the functions of the manifest's Python stages (`python.map`, `python.filter`) and
/// checks each fits its stage; without a Python to do it, says so in a note instead.
fn check_python(
    manifest: &granary_crds::Manifest,
    python: Option<&Path>,
    notes: &mut Vec<String>,
) -> Result<(), Problems> {
    let stages: Vec<(usize, PythonCall)> = manifest
        .pipeline
        .spec
        .stages
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i, OpConfig::parse(s, &format!("spec.stages[{i}]")).ok()?.python_call()?)))
        .collect();
    if stages.is_empty() {
        return Ok(());
    }
    let interpreter = match Interpreter::find(python) {
        Ok(i) => i,
        Err(why) => {
            notes.push(format!("the Python stages' functions were not checked: {why}"));
            return Ok(());
        }
    };
    let configs: Vec<PythonCall> = stages.iter().map(|(_, m)| m.clone()).collect();
    let paths = vec![manifest.base_dir.display().to_string()];
    match granary_worker::ops::python::check(&interpreter, &configs, paths) {
        Ok((python, numpy)) => {
            notes.push(format!(
                "the Python stages' functions import and fit their stages in Python {python} with NumPy {numpy} ({interpreter})"
            ));
            Ok(())
        }
        Err(StartError::Stage { stage, message }) => {
            let i = stages.get(stage).map_or(0, |s| s.0);
            Err(Problems(vec![Problem::new(format!("spec.stages[{i}].function"), message)]))
        }
        Err(e) => {
            notes.push(format!("the Python stages' functions were not checked: {e}"));
            Ok(())
        }
    }
}
