//! Granary's object-store layer: opening stores from URLs ([`url`]) and the autocache's entry
//! format on top of them ([`cache`]).
//!
//! A cache entry is a folder `<fingerprint>/` under the cache root holding an `entry.json`, and per
//! split a folder of compressed, checksummed chunk objects that become visible only through the
//! split's `manifest.json`, which is written last. See [`cache`] for the layout and guarantees.

#![warn(missing_docs)]

pub mod cache;
pub mod credentials;
pub mod delayed;
pub mod url;

pub use crate::credentials::{Cloud, CredentialError};
pub use crate::url::{Located, StoreError, join, memory_store, open};
