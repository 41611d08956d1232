//! Everything that can go wrong between a trainer and the Granary data plane.

use thiserror::Error;

/// An error from the client: connecting, registering, assembling batches or decoding positions.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No dispatcher address was given and `GRANARY_DISPATCHER` is not set.
    #[error("no dispatcher address: pass one (e.g. `localhost:7070`) or set GRANARY_DISPATCHER")]
    NoDispatcher,

    /// Options that cannot work (an empty pipeline name).
    #[error("invalid client options: {0}")]
    InvalidOptions(String),

    /// An address that is not a valid `host:port` or `http://host:port`.
    #[error("invalid address `{address}`: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The dispatcher could not be reached (connection refused, timed out, or it went away).
    #[error("the dispatcher at {address} is unreachable: {reason}")]
    Unreachable {
        /// The dispatcher address.
        address: String,
        /// What the transport reported.
        reason: String,
    },

    /// The dispatcher answered a call with an error status; `message` is the server's text.
    #[error("the dispatcher refused {call}: {message} ({code:?})")]
    Refused {
        /// The gRPC method (`RegisterClient`, `GetEpochPlan`, ...).
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message from the dispatcher.
        message: String,
    },

    /// The dispatcher sent an epoch plan the client cannot use.
    #[error("invalid epoch plan for epoch {epoch}: {reason}")]
    BadPlan {
        /// The epoch the plan was requested for.
        epoch: u32,
        /// What is wrong with it.
        reason: String,
    },

    /// A checkpoint position that cannot be decoded or does not fit these options.
    #[error("invalid position: {0}")]
    BadPosition(String),

    /// A batch part that does not match its plan or the other parts of its batch.
    #[error("cannot assemble batch {slot} of epoch {epoch}: {reason}")]
    Assembly {
        /// Epoch of the batch.
        epoch: u32,
        /// Slot of the batch in the consumer's plan.
        slot: u64,
        /// What is wrong.
        reason: String,
    },

    /// Every worker stream task stopped; no more batches can arrive.
    #[error("the worker streams stopped")]
    StreamsClosed,

    /// The pipeline failed on the service side (e.g. a stage fails on an element every time it
    /// is tried): no more batches will come.
    #[error("pipeline `{pipeline}` failed: {message}")]
    PipelineFailed {
        /// The pipeline.
        pipeline: String,
        /// Why, as the dispatcher says.
        message: String,
    },

    /// The runtime of a [`crate::BlockingClient`] could not be started.
    #[error("cannot start the client runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

impl ClientError {
    /// The error's one text: its message and each cause that adds something, said once. What the
    /// Python client raises with, and what a program should print.
    pub fn message(&self) -> String {
        granary_proto::error_text(self)
    }

    /// Whether the dispatcher answered that what was asked for does not exist (an unknown
    /// pipeline or job).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Refused { code: tonic::Code::NotFound, .. })
    }

    /// Maps a failed dispatcher call: transport failures become [`ClientError::Unreachable`],
    /// every other status [`ClientError::Refused`] with the server's message.
    pub(crate) fn from_status(call: &'static str, address: &str, status: &tonic::Status) -> Self {
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => ClientError::Unreachable {
                address: address.to_owned(),
                reason: format!("{call}: {}", status.message()),
            },
            code => ClientError::Refused { call, code, message: status.message().to_owned() },
        }
    }
}
