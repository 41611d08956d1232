//! Stopping `granary run` with a signal: SIGTERM or SIGINT (Ctrl-C) ends a consuming run (its
//! workers are stopped first, and it exits with 128 + the signal's number, as a shell reports a
//! process the signal ended) and stops `--serve` (which then exits 0: that is how it is stopped).

use std::fmt;
use std::process::ExitCode;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT, listened for from the moment this is made (instead of ending the
/// process, which would leave the workers running).
pub struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    /// Starts listening. Needs a Tokio runtime.
    pub fn listen() -> std::io::Result<StopSignals> {
        Ok(StopSignals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Completes on the next SIGTERM or SIGINT.
    pub async fn recv(&mut self) -> Interrupted {
        tokio::select! {
            _ = self.term.recv() => Interrupted { signal: "SIGTERM", number: libc::SIGTERM },
            _ = self.int.recv() => Interrupted { signal: "SIGINT", number: libc::SIGINT },
        }
    }
}

/// A run ended by a signal.
#[derive(Debug, Clone, Copy)]
pub struct Interrupted {
    signal: &'static str,
    number: libc::c_int,
}

impl Interrupted {
    /// The exit status of an interrupted run: 128 + the signal's number (143 for SIGTERM, 130
    /// for SIGINT).
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(u8::try_from(128 + self.number).unwrap_or(u8::MAX))
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "interrupted by {}", self.signal)
    }
}

impl std::error::Error for Interrupted {}
