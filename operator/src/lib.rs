//! Granary's Kubernetes operator: reconciles each `InputPipeline` into a worker Deployment and a
//! headless Service, hosts the dispatcher those workers and the trainers talk to, sizes each
//! pool through the Deployment's scale subresource from the autoscaling policy, and reports
//! progress, scaling and caching in the pipeline's status and Events. One replica leads (a
//! `coordination.k8s.io` Lease); the others wait.

pub mod backoff;
pub mod config;
pub mod context;
pub mod controller;
pub mod credentials;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod pod;
pub mod pool;
pub mod python;
pub mod rbac;
pub mod reconcile;
pub mod run;
pub mod status;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use config::{OperatorConfig, WorkerSettings};
pub use run::{OperatorError, OperatorOptions, run};
