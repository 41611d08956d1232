//! How a job's consumers share an epoch.

use serde::{Deserialize, Serialize};

/// How a job's consumers share an epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each element reaches exactly one of the job's consumers per epoch.
    #[default]
    Distributed,
    /// Every consumer sees every element once per epoch.
    Replicated,
}

impl Mode {
    /// The wire value.
    pub(crate) fn to_proto(self) -> granary_proto::v1::Mode {
        match self {
            Mode::Distributed => granary_proto::v1::Mode::Distributed,
            Mode::Replicated => granary_proto::v1::Mode::Replicated,
        }
    }

    /// From the wire value; unspecified reads as distributed.
    pub(crate) fn from_proto(value: i32) -> Mode {
        match granary_proto::v1::Mode::try_from(value) {
            Ok(granary_proto::v1::Mode::Replicated) => Mode::Replicated,
            _ => Mode::Distributed,
        }
    }
}
