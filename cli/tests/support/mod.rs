//! Running the built `granary` binary from the CLI's tests.

use std::process::{Command, Output};

/// `granary COMMAND ARGS…`, its output collected.
pub fn granary(command: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_granary")).arg(command).args(args).output().expect("running granary")
}

/// Bytes of an output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `granary COMMAND ARGS…`, which must succeed; its stdout.
pub fn succeed(command: &str, args: &[&str]) -> String {
    let out = granary(command, args);
    assert!(
        out.status.success(),
        "granary {command} {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}
