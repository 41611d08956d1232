//! The cache layer's error type.

use crate::url::StoreError;

/// Failure of a cache operation.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The object store failed (network, permissions, ...). Retrying may help; the data itself is
    /// not known to be bad.
    #[error("cannot {what} `{location}`: {source}")]
    Store {
        /// The operation, as a verb phrase ("read", "write", "list", "delete").
        what: String,
        /// The object or prefix inside the store.
        location: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// An object the cache needs is not there.
    #[error("`{location}` is missing from the cache store")]
    Missing {
        /// The object inside the store.
        location: String,
    },
    /// An object is there but fails verification (size, header, checksum, decoded length, record
    /// count, or a manifest that does not belong where it was found).
    #[error("cache object `{location}` is corrupt: {reason}")]
    Corrupt {
        /// The object inside the store.
        location: String,
        /// What did not match.
        reason: String,
    },
    /// The store URL could not be opened.
    #[error(transparent)]
    Url(#[from] StoreError),
    /// Bad input to the cache layer itself: a malformed fingerprint, a record too large for a
    /// chunk, an out-of-range chunk index, a malformed throttle setting, an encoding failure.
    #[error("{0}")]
    Format(String),
}

impl CacheError {
    /// Whether the data is missing or bad (as opposed to the store failing or bad input): the split
    /// must be marked bad and recomputed.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, CacheError::Missing { .. } | CacheError::Corrupt { .. })
    }

    /// A [`CacheError::Corrupt`] for `location`.
    pub(crate) fn corrupt(location: impl ToString, reason: impl Into<String>) -> CacheError {
        CacheError::Corrupt { location: location.to_string(), reason: reason.into() }
    }

    /// Maps a store error on `location`: `NotFound` becomes [`CacheError::Missing`], anything else
    /// [`CacheError::Store`] with `what` as the operation.
    pub(crate) fn from_store(what: &str, location: impl ToString, source: object_store::Error) -> CacheError {
        match source {
            object_store::Error::NotFound { .. } => CacheError::Missing { location: location.to_string() },
            source => CacheError::Store { what: what.to_string(), location: location.to_string(), source },
        }
    }
}
