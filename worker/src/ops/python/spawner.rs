//! Starts runner processes from one thread that lives as long as the worker: a child's
//! parent-death signal fires when the *thread* that forked it ends, and compute threads come and
//! go with executions.

use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::mpsc::{Sender, channel};

type Request = (Command, Sender<std::io::Result<Child>>);

static SPAWNER: Mutex<Option<Sender<Request>>> = Mutex::new(None);

/// Spawns `command` from the spawner thread (started on first use).
pub fn spawn(command: Command) -> std::io::Result<Child> {
    let (reply, answer) = channel();
    let sent = {
        let mut guard = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
        let sender = match guard.as_ref() {
            Some(s) => s.clone(),
            None => {
                let (tx, rx) = channel::<Request>();
                std::thread::Builder::new().name("granary-python-spawner".into()).spawn(move || {
                    for (mut command, reply) in rx {
                        let _ = reply.send(command.spawn());
                    }
                })?;
                *guard = Some(tx.clone());
                tx
            }
        };
        sender.send((command, reply))
    };
    if sent.is_err() {
        return Err(std::io::Error::other("the process spawner thread is gone"));
    }
    answer.recv().unwrap_or_else(|_| Err(std::io::Error::other("the process spawner thread is gone")))
}
