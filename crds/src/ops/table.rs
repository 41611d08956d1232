//! Table operators for Parquet and JSONL rows: column selection and casts.

use super::DType;
use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `table.select`: keeps only the named columns (fields), in that order.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Select {
    /// Columns to keep. At least one.
    pub columns: Vec<String>,
}

/// `table.cast`: converts numeric columns to the given element types
/// (`uint8`, `int32`, `int64`, `float32`, `float64`).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cast {
    /// Column name → element type.
    pub columns: BTreeMap<String, DType>,
}

impl Select {
    /// The `op` name: `table.select`.
    pub const OP: &str = "table.select";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.columns.is_empty() {
            problems.push(Problem::new(format!("{path}.columns"), "must name at least one column"));
        }
        for (i, c) in self.columns.iter().enumerate() {
            if c.is_empty() {
                problems.push(Problem::new(format!("{path}.columns[{i}]"), "must not be empty"));
            } else if self.columns[..i].contains(c) {
                problems.push(Problem::new(
                    format!("{path}.columns[{i}]"),
                    format!("column `{c}` is listed twice"),
                ));
            }
        }
    }
}

impl Cast {
    /// The `op` name: `table.cast`.
    pub const OP: &str = "table.cast";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.columns.is_empty() {
            problems.push(Problem::new(format!("{path}.columns"), "must map at least one column to a type"));
        }
    }
}
