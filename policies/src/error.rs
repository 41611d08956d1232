//! Errors of this crate: only lookups by name and report encoding can fail.

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No policy has this name.
    #[error("unknown policy `{0}` (known: granary, cachew, hpa)")]
    UnknownPolicy(String),
    /// No scenario has this name.
    #[error("unknown scenario `{0}` (known: {1})")]
    UnknownScenario(String, String),
    /// A report row could not be encoded.
    #[error("cannot encode a report row: {0}")]
    Json(#[from] serde_json::Error),
}
