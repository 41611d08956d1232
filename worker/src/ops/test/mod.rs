//! Operators for testing the service itself.

pub mod sleep;
