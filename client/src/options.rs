//! What a client connects to and which consumer of which job it is.

use crate::error::ClientError;
use crate::mode::Mode;
use crate::position::Position;

/// Environment variable that names the dispatcher when no address is given.
pub const DISPATCHER_ENV: &str = "GRANARY_DISPATCHER";

/// Environment variable naming the CA certificate (PEM) that the dispatcher's and workers'
/// certificates chain to: set, the client dials them over TLS.
pub const TLS_CA_ENV: &str = "GRANARY_TLS_CA";

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
    /// The pipeline's trainer token (from its Secret); `None` reads `$GRANARY_TOKEN`, and
    /// without either the client sends none (a dispatcher without authentication).
    pub token: Option<String>,
    /// TLS to the dispatcher and the workers: the CA their certificates chain to (and a client
    /// certificate, if the trainer has one). `None` reads the CA from `$GRANARY_TLS_CA`, and
    /// without either the client dials plaintext.
    pub tls: Option<granary_security::TlsMaterial>,
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
            token: None,
            tls: None,
        }
    }

    /// The token to send: the option, else `$GRANARY_TOKEN`.
    pub fn token(&self) -> Result<Option<String>, ClientError> {
        match &self.token {
            Some(token) => Ok(Some(token.trim().to_owned()).filter(|t| !t.is_empty())),
            None => {
                granary_security::read_token(None).map_err(|e| ClientError::InvalidOptions(e.to_string()))
            }
        }
    }

    /// The TLS settings to dial with: the option, else the CA named by `$GRANARY_TLS_CA`.
    pub fn tls(&self) -> Result<Option<granary_security::TlsMaterial>, ClientError> {
        if let Some(tls) = &self.tls {
            return Ok(Some(tls.clone()));
        }
        let Some(ca) = std::env::var_os(TLS_CA_ENV).filter(|v| !v.is_empty()) else { return Ok(None) };
        let files = granary_security::TlsFiles { ca: ca.into(), cert: None, key: None };
        files.load().map(Some).map_err(|e| ClientError::InvalidOptions(format!("{TLS_CA_ENV}: {e}")))
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
