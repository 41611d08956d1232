//! Tests against a mocked API server.

mod apiserver;
mod reconcile;
