//! What a client connects to and which consumer of which job it is.

use crate::error::ClientError;
use crate::mode::Mode;
use crate::position::Position;

/// Environment variable that names the dispatcher when no address is given.
pub const DISPATCHER_ENV: &str = "GRANARY_DISPATCHER";

/// Options for [`crate::Client::open`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Dispatcher address, `host:port` or `http://host:port`; `None` reads `$GRANARY_DISPATCHER`.
    pub dispatcher: Option<String>,
    /// The pipeline to read: `metadata.name` locally, `namespace/name` under Kubernetes.
    pub pipeline: String,
    /// Job name; `None` means the pipeline's name.
    pub job: Option<String>,
    /// How the job's consumers share an epoch. Taken from the position when resuming.
    pub mode: Mode,
    /// This consumer's index; `None` takes the lowest free one.
    pub consumer_index: Option<u32>,
    /// Consumers of the job (fixed by its first consumer). Taken from the position when resuming.
    pub num_consumers: u32,
    /// Resume from a checkpoint taken with [`crate::Client::checkpoint`].
    pub resume: Option<Position>,
}

impl ClientOptions {
    /// Options for a single distributed consumer of `pipeline`, dispatcher from the environment.
    pub fn new(pipeline: impl Into<String>) -> ClientOptions {
        ClientOptions {
            dispatcher: None,
            pipeline: pipeline.into(),
            job: None,
            mode: Mode::Distributed,
            consumer_index: None,
            num_consumers: 1,
            resume: None,
        }
    }

    /// The dispatcher address to use: the option, else `$GRANARY_DISPATCHER`.
    pub fn dispatcher_address(&self) -> Result<String, ClientError> {
        if let Some(address) = self.dispatcher.as_deref().map(str::trim)
            && !address.is_empty()
        {
            return Ok(address.to_owned());
        }
        match std::env::var(DISPATCHER_ENV) {
            Ok(address) if !address.trim().is_empty() => Ok(address.trim().to_owned()),
            _ => Err(ClientError::NoDispatcher),
        }
    }
}
