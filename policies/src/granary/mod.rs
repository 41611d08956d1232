//! Granary's model-based autoscaler: compute the needed worker count from trainer demand and
//! per-worker supply, correct it with feedback from trainer waiting, worker buffers and idle
//! cores, and keep it steady with noise bands, settling and a reversal cooldown. See the crate
//! documentation for the formulas.

mod config;
pub mod cost;
mod decide;
mod policy;

pub use config::GranaryConfig;
pub use policy::GranaryPolicy;
