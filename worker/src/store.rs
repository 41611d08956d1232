//! Opening object stores from URLs: re-exported from [`granary_store::url`], where it lives so that
//! the cache layer and the data plane share one set of `memory://` stores.

pub use granary_store::url::*;
