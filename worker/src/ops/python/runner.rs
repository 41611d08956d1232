//! One Python runner process: started with the pipeline's stages imported, then called once per
//! element (or group) over a Unix socket, with the data in shared memory.

use super::interpreter::Interpreter;
use super::shm::Shared;
use super::wire::{self, CallHeader, Reply};
use crate::element::{Element, FieldName, Value};
use crate::ops::OpError;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The runner's source, shipped with the worker so that both sides of the protocol match.
const SOURCE: &str = include_str!("../../../../python/granary/_stage_runner.py");
/// What `python -c` runs: the source, read from standard input.
const BOOT: &str =
    "import sys; exec(compile(sys.stdin.read(), '<granary stage runner>', 'exec'), {'__name__': '__main__'})";
/// Descriptors the runner finds its socket and its shared memory at.
const SOCKET_FD: i32 = 3;
const SHM_FD: i32 = 4;
/// How long importing the stages may take.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(300);

/// One stage as the runner imports it.
#[derive(Clone, Debug, Serialize)]
pub struct StageSetup {
    /// `module:function`.
    pub function: String,
    /// Whether it takes groups of elements.
    pub batched: bool,
    /// Keyword arguments.
    pub args: serde_json::Map<String, serde_json::Value>,
    /// Whether the function decides which elements to keep (`python.filter`) rather than
    /// returning their new fields.
    pub filter: bool,
}

/// What a runner is told at start.
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    /// The pipeline's Python stages, in order.
    pub stages: Vec<StageSetup>,
    /// Folders to import from, before the environment's own (the manifest's folder).
    pub paths: Vec<String>,
    /// Only import and report, then exit (`granary validate`).
    pub check: bool,
}

/// What a runner found when it imported a stage's function.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StageFacts {
    /// The file of the function's module.
    pub file: String,
    /// SHA-256 of that file: part of the identity of cache entries after the stage.
    pub sha256: String,
    /// Whether the function takes `rng`.
    pub rng: bool,
    /// Whether it takes `key` (`keys` when batched).
    pub key: bool,
}

/// A runner's first answer.
#[derive(Debug, Deserialize)]
pub struct Hello {
    ok: bool,
    #[serde(default)]
    stage: usize,
    #[serde(default)]
    error: String,
    /// Python's version.
    #[serde(default)]
    pub python: String,
    /// NumPy's version.
    #[serde(default)]
    pub numpy: String,
    /// Per stage, what was imported.
    #[serde(default)]
    pub stages: Vec<StageFacts>,
}

/// Why a runner could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The interpreter could not be run or did not speak the protocol.
    #[error("cannot start Python {interpreter}: {message}")]
    Interpreter {
        /// Which interpreter.
        interpreter: String,
        /// What went wrong.
        message: String,
    },
    /// A stage's function could not be imported or does not fit the stage.
    #[error("{message}")]
    Stage {
        /// Index among the Python stages.
        stage: usize,
        /// What Python said.
        message: String,
    },
}

/// A runner process.
pub struct Runner {
    child: Child,
    socket: UnixStream,
    shm: Shared,
    frame: Vec<u8>,
    outgoing: Vec<u8>,
    reply: Vec<u8>,
}

impl Runner {
    /// Starts a runner with `interpreter` and sends it `setup`; returns it with what it imported.
    pub fn start(interpreter: &Interpreter, setup: &Setup) -> Result<(Runner, Hello), StartError> {
        let fail =
            |message: String| StartError::Interpreter { interpreter: interpreter.to_string(), message };
        let mut shm = Shared::new().map_err(|e| fail(format!("cannot create shared memory: {e}")))?;
        shm.reserve(1 << 20).map_err(|e| fail(format!("cannot size shared memory: {e}")))?;
        let (socket, theirs) =
            UnixStream::pair().map_err(|e| fail(format!("cannot create a socket: {e}")))?;
        // Copies above the descriptors the child expects, so that placing one cannot close the
        // other.
        let high = |fd: i32| -> std::io::Result<OwnedFd> {
            // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (or -1) and touches nothing else.
            let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
            if new < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `new` is a fresh descriptor owned by nothing else.
            Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(new) })
        };
        let sock_fd = high(theirs.as_raw_fd()).map_err(|e| fail(e.to_string()))?;
        let shm_fd = high(shm.fd()).map_err(|e| fail(e.to_string()))?;
        drop(theirs);
        let mut command = Command::new(&interpreter.path);
        command
            .args(["-c", BOOT, &SOCKET_FD.to_string(), &SHM_FD.to_string()])
            .stdin(Stdio::piped())
            .stderr(Stdio::inherit());
        // What the user's code prints goes to the worker's log, never into its own output.
        match std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned() {
            Ok(err) => command.stdout(Stdio::from(err)),
            Err(_) => command.stdout(Stdio::null()),
        };
        // One interpreter per core: NumPy's BLAS threads would only compete with the others.
        for var in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"] {
            if std::env::var_os(var).is_none() {
                command.env(var, "1");
            }
        }
        let (a, b) = (sock_fd.as_raw_fd(), shm_fd.as_raw_fd());
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (dup2, prctl, sched_setscheduler) on descriptors that are open in the child.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(a, SOCKET_FD) < 0 || libc::dup2(b, SHM_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The runner ends with the worker, even when the worker is killed.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // A runner computes, like the worker's compute threads (see `crate::scheduling`);
                // one left under the spawner's policy only loses wakeup preemption.
                let _ = crate::scheduling::compute_first();
                Ok(())
            });
        }
        let mut child = super::spawner::spawn(command).map_err(|e| {
            fail(format!("{e}; is it a Python 3 interpreter? (set --python or GRANARY_PYTHON)"))
        })?;
        drop((sock_fd, shm_fd));
        if let Some(mut stdin) = child.stdin.take() {
            // A runner that died at once shows in the answer below.
            let _ = stdin.write_all(SOURCE.as_bytes());
        }
        let mut runner =
            Runner { child, socket, shm, frame: Vec::new(), outgoing: Vec::new(), reply: Vec::new() };
        super::cpu::track(runner.pid());
        let setup = serde_json::to_vec(setup).map_err(|e| fail(e.to_string()))?;
        let _ = runner.socket.set_read_timeout(Some(IMPORT_TIMEOUT));
        if let Err(e) = runner.send(&setup).and_then(|()| runner.receive().map(|_| ())) {
            return Err(fail(format!(
                "{}; it needs NumPy: check `{} -c 'import numpy'`",
                runner.died(&e),
                interpreter.path.display()
            )));
        }
        let _ = runner.socket.set_read_timeout(None);
        let hello: Hello =
            serde_json::from_slice(&runner.reply).map_err(|e| fail(format!("unreadable answer: {e}")))?;
        if !hello.ok {
            return Err(StartError::Stage { stage: hello.stage, message: hello.error });
        }
        Ok((runner, hello))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Calls stage `stage` on `elements` (one, or a group when `batched`) and returns what it
    /// returned: the new fields of each (a map), or which to keep (a filter, whose elements are
    /// left as they are). `Err` carries the Python error, or says the runner died.
    pub fn call(
        &mut self,
        header: &CallHeader,
        elements: &mut [Element],
        batched: bool,
    ) -> Result<Returned, CallError> {
        wire::encode_call(header, elements, batched, &mut self.frame, &mut self.shm)
            .map_err(CallError::Input)?;
        let frame = std::mem::take(&mut self.frame);
        let sent = self.send(&frame);
        self.frame = frame;
        if let Err(e) = sent.and_then(|()| self.receive().map(|_| ())) {
            return Err(CallError::Died(self.died(&e)));
        }
        let reply = std::mem::take(&mut self.reply);
        let result = self.decode(&reply, elements, batched);
        self.reply = reply;
        result
    }

    /// Calls element-wise stage `stage` on each of `elements` in one round trip (`seeds`: one
    /// per element when the function takes `rng`) and returns what each call returned, in order.
    /// `Err` carries the index of the element whose call failed, with why (0 when the whole
    /// call failed: the runner died, or answered something unreadable).
    pub fn call_each(
        &mut self,
        stage: u16,
        seeds: Option<&[u64]>,
        elements: &mut [Element],
    ) -> Result<Vec<Returned>, (usize, CallError)> {
        wire::encode_each(stage, seeds, elements, &mut self.frame, &mut self.shm)
            .map_err(|e| (0, CallError::Input(e)))?;
        let frame = std::mem::take(&mut self.frame);
        let sent = self.send(&frame);
        self.frame = frame;
        if let Err(e) = sent.and_then(|()| self.receive().map(|_| ())) {
            return Err((0, CallError::Died(self.died(&e))));
        }
        let reply = std::mem::take(&mut self.reply);
        let result = self.decode_each(&reply, elements);
        self.reply = reply;
        result
    }

    fn decode_each(
        &mut self,
        reply: &[u8],
        elements: &mut [Element],
    ) -> Result<Vec<Returned>, (usize, CallError)> {
        let (shm_size, parts) = wire::decode_each(reply).map_err(|e| (0, CallError::Protocol(e)))?;
        self.shm
            .remap(shm_size)
            .map_err(|e| (0, CallError::Protocol(OpError::new(format!("cannot map the outputs: {e}")))))?;
        if parts.len() > elements.len() {
            return Err((
                0,
                CallError::Protocol(OpError::new(format!(
                    "the Python runner answered {} calls of {}",
                    parts.len(),
                    elements.len()
                ))),
            ));
        }
        let answered = parts.len();
        let mut out = Vec::with_capacity(answered);
        for (i, (part, element)) in parts.into_iter().zip(elements.iter_mut()).enumerate() {
            out.push(self.decode(part, std::slice::from_mut(element), false).map_err(|e| (i, e))?);
        }
        if answered < elements.len() {
            return Err((
                answered,
                CallError::Protocol(OpError::new(format!(
                    "the Python runner answered {answered} calls of {} without an error",
                    elements.len()
                ))),
            ));
        }
        Ok(out)
    }

    fn decode(
        &mut self,
        reply: &[u8],
        elements: &mut [Element],
        batched: bool,
    ) -> Result<Returned, CallError> {
        match wire::decode_reply(reply).map_err(CallError::Protocol)? {
            Reply::Raised(message) => Err(CallError::Raised(message)),
            Reply::BadReturn(message) => Err(CallError::Input(OpError::new(message))),
            Reply::Kept(flags) => {
                if flags.len() != elements.len() {
                    return Err(CallError::Protocol(OpError::new(format!(
                        "the Python runner decided on {} elements of a call with {}",
                        flags.len(),
                        elements.len()
                    ))));
                }
                Ok(Returned::Kept(flags.iter().map(|&f| f != 0).collect()))
            }
            Reply::Ok { shm_size, mut fields } => {
                self.shm
                    .remap(shm_size)
                    .map_err(|e| CallError::Protocol(OpError::new(format!("cannot map the outputs: {e}"))))?;
                let mut inputs = match (batched, elements) {
                    (false, [element]) => std::mem::take(&mut element.fields),
                    _ => Vec::new(),
                };
                let n = if batched { Some(self.group_len()) } else { None };
                wire::decode_fields(&mut fields, self.shm.bytes(), n, &mut inputs)
                    .map(Returned::Fields)
                    .map_err(CallError::Protocol)
            }
        }
    }

    fn group_len(&self) -> usize {
        // The call frame holds the group's size at a fixed offset (after op, stage, flags, seed,
        // shm size, output offset).
        let at = 1 + 2 + 1 + 8 + 8 + 8;
        self.frame.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// Sends one frame: its length and body in one write (`body` is the frame buffer's, or the
    /// setup's).
    fn send(&mut self, body: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(body.len())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame too large"))?;
        let mut out = std::mem::take(&mut self.outgoing);
        out.clear();
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(body);
        let sent = self.socket.write_all(&out);
        self.outgoing = out;
        sent
    }

    fn receive(&mut self) -> std::io::Result<&[u8]> {
        let mut len = [0u8; 4];
        self.socket.read_exact(&mut len)?;
        self.reply.resize(u32::from_le_bytes(len) as usize, 0);
        self.socket.read_exact(&mut self.reply)?;
        Ok(&self.reply)
    }

    /// Says how the runner ended, after the socket failed with `error`.
    fn died(&mut self, error: &std::io::Error) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return describe_exit(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = self.child.kill();
                    return format!("it stopped answering ({error}) and was killed");
                }
            }
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        super::cpu::retire(self.pid());
        // Closing the socket ends the runner's loop; a runner stuck in user code is killed.
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a call returned.
#[derive(Debug)]
pub enum Returned {
    /// A map's new fields, per element.
    Fields(Vec<Vec<(FieldName, Value)>>),
    /// A filter's decisions, per element (`true`: kept).
    Kept(Vec<bool>),
}

/// Why a call did not return fields.
#[derive(Debug)]
pub enum CallError {
    /// The function raised: the exception and its traceback.
    Raised(String),
    /// The process died; how.
    Died(String),
    /// The element cannot be passed (e.g. unequal shapes in a group), or what the function
    /// returned cannot be carried.
    Input(OpError),
    /// The runner answered something unreadable.
    Protocol(OpError),
    /// The runner answered a map's call as a filter's, or the other way round.
    WrongKind,
}

impl CallError {
    /// Whether the runner cannot take another call after this (it died, or lost the protocol):
    /// a new one replaces it.
    pub fn breaks_runner(&self) -> bool {
        matches!(self, CallError::Died(_) | CallError::Protocol(_) | CallError::WrongKind)
    }
}

/// "exited with status 3", "was killed by signal 11 (SIGSEGV)".
pub fn describe_exit(status: std::process::ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("it exited with status {code}");
    }
    match status.signal() {
        Some(signal) => {
            let name = match signal {
                libc::SIGSEGV => " (SIGSEGV: a crash in native code)",
                libc::SIGABRT => " (SIGABRT: native code aborted)",
                libc::SIGBUS => " (SIGBUS)",
                libc::SIGILL => " (SIGILL)",
                libc::SIGFPE => " (SIGFPE)",
                libc::SIGKILL => " (SIGKILL: out of memory, or killed)",
                libc::SIGTERM => " (SIGTERM)",
                _ => "",
            };
            format!("it was killed by signal {signal}{name}")
        }
        None => "it ended".to_string(),
    }
}
