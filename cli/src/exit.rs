//! The exit statuses of every `granary` subcommand, in one table, and how an error is reported.

use std::process::ExitCode;

/// Everything worked.
pub const OK: u8 = 0;
/// A failure while running: the data, the object store (unreachable, no credentials, missing
/// objects), a worker, the dispatcher, the cluster.
pub const FAILURE: u8 = 1;
/// Invalid input: a manifest that is missing, unreadable or invalid, or a bad flag or argument
/// (the same status clap gives a command line it cannot parse).
pub const INVALID_INPUT: u8 = 2;
// 130 and 143 (128 + SIGINT, 128 + SIGTERM) are not returned by granary: the shell reports them
// for a command the signal ended. Serving commands handle both signals and exit 0.

/// The table, as `granary --help` prints it.
pub const TABLE: &str = "\
Exit status (every subcommand):
  0    success
  1    failure while running: data, object store (unreachable, no credentials, missing object),
       worker, dispatcher or cluster
  2    invalid input: a manifest that is missing, unreadable or invalid, a bad flag or argument
  130  interrupted by SIGINT (Ctrl-C); 143 terminated by SIGTERM. Serving commands (worker,
       operator, run --serve) stop cleanly on either signal and exit 0";

/// `code` as an [`ExitCode`].
pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

/// An error that is the user's input, not a failure while running: exits [`INVALID_INPUT`].
#[derive(Debug)]
pub struct InvalidInput(pub String);

impl std::fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidInput {}

/// Prints `error` on stderr as `error: ` and its causes, each said once, and returns its exit
/// status: [`INVALID_INPUT`] when the error is an [`InvalidInput`], else [`FAILURE`].
pub fn report(error: &anyhow::Error) -> ExitCode {
    eprintln!("error: {}", granary_proto::error_text(error.as_ref()));
    if error.chain().any(|cause| cause.is::<InvalidInput>()) { code(INVALID_INPUT) } else { code(FAILURE) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_status() {
        for status in [OK, FAILURE, INVALID_INPUT, 130, 143] {
            assert!(TABLE.contains(&format!(" {status} ")), "{status} missing from the table");
        }
    }
}
