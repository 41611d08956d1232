//! Checkpoint positions: where a consumer is in its job, serializable to bytes.

use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::mode::Mode;
use crate::ranges::SlotRanges;

/// Version of the [`Position`] encoding this crate writes and reads.
pub const POSITION_VERSION: u32 = 1;

/// A consumer's place in its job: the epoch it is in and the batches (slots) of that epoch it
/// delivered. Taken with [`crate::Client::checkpoint`], resumed with [`crate::ClientOptions::resume`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The pipeline.
    pub pipeline: String,
    /// The job (resolved: never empty).
    pub job: String,
    /// This consumer's index in the job.
    pub consumer_index: u32,
    /// Consumers of the job.
    pub num_consumers: u32,
    /// How the job's consumers share an epoch.
    pub mode: Mode,
    /// The epoch being delivered.
    pub epoch: u32,
    /// Delivered slots of `epoch`, as sorted, disjoint `[start, end)` ranges.
    pub delivered: Vec<(u64, u64)>,
    /// Fingerprint of the plan the position was taken under.
    pub plan_fingerprint: u64,
    /// With mixed sources (`spec.sources`): how many elements of each source the delivered slots
    /// of `epoch` hold. The plan (its fingerprint covers the mix) places every source's stream,
    /// so a resume continues each source where it stood; this says where that is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourcePosition>,
    /// Encoding version ([`POSITION_VERSION`]).
    pub version: u32,
}

/// Where one mixed source's stream stands in a consumer's epoch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourcePosition {
    /// The source's name in `spec.sources`.
    pub name: String,
    /// Its elements in the delivered slots.
    pub elements: u64,
}

impl Position {
    /// The position as bytes (JSON), to store with a training checkpoint.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain strings, integers and vectors cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A position from [`Position::to_bytes`]; anything else is a [`ClientError::BadPosition`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Position, ClientError> {
        let position: Position = serde_json::from_slice(bytes)
            .map_err(|error| ClientError::BadPosition(format!("not a Granary position: {error}")))?;
        position.validate()?;
        Ok(position)
    }

    /// Checks the fields are consistent.
    pub fn validate(&self) -> Result<(), ClientError> {
        if self.version != POSITION_VERSION {
            return Err(ClientError::BadPosition(format!(
                "version {} is not supported (this client reads version {POSITION_VERSION})",
                self.version
            )));
        }
        if self.pipeline.is_empty() {
            return Err(ClientError::BadPosition("the pipeline is empty".into()));
        }
        if self.num_consumers == 0 || self.consumer_index >= self.num_consumers {
            return Err(ClientError::BadPosition(format!(
                "consumer {} of {} does not exist",
                self.consumer_index, self.num_consumers
            )));
        }
        self.delivered_slots().map(|_| ())
    }

    /// The delivered slots as a set.
    pub(crate) fn delivered_slots(&self) -> Result<SlotRanges, ClientError> {
        SlotRanges::from_ranges(&self.delivered)
            .map_err(|reason| ClientError::BadPosition(format!("delivered slots: {reason}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position() -> Position {
        Position {
            pipeline: "imagenet".into(),
            job: "train".into(),
            consumer_index: 1,
            num_consumers: 4,
            mode: Mode::Distributed,
            epoch: 3,
            delivered: vec![(0, 10), (12, 13)],
            plan_fingerprint: 0xdead_beef_cafe_f00d,
            sources: vec![SourcePosition { name: "web".into(), elements: 700 }],
            version: POSITION_VERSION,
        }
    }

    #[test]
    fn round_trips_through_bytes() {
        let position = position();
        assert_eq!(Position::from_bytes(&position.to_bytes()).unwrap(), position);
        let replicated = Position { mode: Mode::Replicated, delivered: vec![], ..position };
        assert_eq!(Position::from_bytes(&replicated.to_bytes()).unwrap(), replicated);
    }

    #[test]
    fn rejects_garbage() {
        for garbage in [&b""[..], b"\x00\x01\x02", b"{}", b"[1, 2, 3]", b"{\"pipeline\": 3}"] {
            let error = Position::from_bytes(garbage).unwrap_err();
            assert!(matches!(error, ClientError::BadPosition(_)), "{error}");
            assert!(error.to_string().contains("not a Granary position"), "{error}");
        }
    }

    #[test]
    fn rejects_inconsistent_positions() {
        let cases = [
            Position { version: 99, ..position() },
            Position { consumer_index: 4, ..position() },
            Position { num_consumers: 0, consumer_index: 0, ..position() },
            Position { delivered: vec![(5, 3)], ..position() },
            Position { delivered: vec![(4, 8), (0, 2)], ..position() },
        ];
        for case in cases {
            let error = Position::from_bytes(&case.to_bytes()).unwrap_err();
            assert!(matches!(error, ClientError::BadPosition(_)), "{error}");
        }
    }
}
