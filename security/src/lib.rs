//! Granary's security primitives, shared by the dispatcher, the workers, the clients and the
//! operator (none of which this crate knows about):
//!
//! - [`authority`]: a certificate authority that issues each component a leaf certificate naming
//!   its role (the operator keeps one in a Secret; `granary run --tls` makes one per run);
//! - [`tls`]: tonic's server and client TLS settings from PEM files, mutual where the caller has a
//!   certificate;
//! - [`key`]: the deployment's master key and what is derived from it;
//! - [`token`]: bearer tokens, each naming its holder's role and scope (the owner, the workers of
//!   one pipeline, the trainers of one pipeline), checked without any stored state;
//! - [`capability`]: the dispatcher's signed, expiring permission for one consumer of one job to
//!   stream batches, which workers check with the dispatcher's public key only;
//! - [`names`]: the name a pipeline's workers serve TLS under, whatever address they have;
//! - [`provider`]: the process's TLS cryptography (aws-lc-rs, AES-128-GCM first);
//! - [`principal`]: who made a gRPC request, from its certificate or its bearer token;
//! - [`bearer`]: the caller's side: sending a token with every request.

pub mod authority;
pub mod bearer;
pub mod capability;
pub mod key;
pub mod names;
pub mod principal;
pub mod provider;
pub mod tls;
pub mod token;

pub use authority::{Authority, Issued};
pub use bearer::{Bearer, BearerError, TOKEN_ENV, read_token};
pub use capability::{Capability, CapabilityError, CapabilitySigner, CapabilityVerifier};
pub use key::MasterKey;
pub use names::worker_server_name;
pub use principal::{Authenticator, Principal};
pub use tls::{TlsError, TlsFiles, TlsMaterial};
pub use token::{Role, Token, TokenError};
