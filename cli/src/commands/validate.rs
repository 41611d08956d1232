//! `granary validate FILE...`: checks manifests and prints every problem as `FIELD_PATH: message`.
//!
//! Output, on stdout: `FILE: ok` for a valid file; for an invalid one a header
//! `FILE: invalid (N problems)` followed by one `FIELD_PATH: message` line per problem. An
//! unreadable file gets `FILE: cannot read: ...` on stderr. Exit status: 0 when every file is
//! valid, 1 when some file is invalid, 2 when some file could not be read.

use granary_crds::manifest::{base_dir_of, parse_manifest};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Validates each manifest in `files`, printing the report described in the module docs.
pub fn validate(files: &[PathBuf]) -> ExitCode {
    validate_with_overrides(files, &[])
}

/// Like [`validate`], applying `FIELD=VALUE` overrides (as `granary run --set` does) to every
/// file before checking it.
pub fn validate_with_overrides(files: &[PathBuf], overrides: &[String]) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut invalid = false;
    let mut unreadable = false;
    for file in files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                unreadable = true;
                eprintln!("{}: cannot read: {e}", file.display());
                continue;
            }
        };
        // A failed write to stdout (a closed pipe) cannot be reported anywhere useful; the exit
        // status still tells.
        match parse_manifest(&text, &base_dir_of(file), overrides) {
            Ok(_) => {
                let _ = writeln!(out, "{}: ok", file.display());
            }
            Err(problems) => {
                invalid = true;
                let n = problems.0.len();
                let _ = writeln!(
                    out,
                    "{}: invalid ({n} problem{})",
                    file.display(),
                    if n == 1 { "" } else { "s" }
                );
                for problem in &problems.0 {
                    let _ = writeln!(out, "{problem}");
                }
            }
        }
    }
    let _ = out.flush();
    if unreadable {
        ExitCode::from(2)
    } else if invalid {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
