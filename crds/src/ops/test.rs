//! Operators for testing the service itself, not for training pipelines.

use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `test.sleep`: waits `ms` milliseconds per element without using CPU, then passes the element
/// on unchanged. It gives a pipeline a known per-batch wall time, so that autoscaling can be
/// tested with more workers than cores.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sleep {
    /// Milliseconds per element, 0 to 60000.
    pub ms: f64,
}

impl Sleep {
    /// The `op` name: `test.sleep`.
    pub const OP: &str = "test.sleep";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if !(0.0..=60_000.0).contains(&self.ms) {
            problems.push(Problem::new(
                format!("{path}.ms"),
                format!("is {}; use a number of milliseconds from 0 to 60000", self.ms),
            ));
        }
    }
}
