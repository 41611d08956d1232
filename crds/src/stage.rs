//! `spec.stages[]`: one operator applied to every element, in order.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// One stage of the pipeline: an operator (`op`) and its fields.
///
/// The operator's own fields sit beside `op` (`{op: image.resize, size: 256}`). The CRD keeps
/// unknown fields here so that a misspelt one is reported by Granary rather than silently dropped
/// by the API server.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct StageSpec {
    /// Operator name, one of the built-in operators (`image.decode`, `image.random_resized_crop`,
    /// `text.tokenize`, ...); the CRD schema lists them all.
    pub op: String,
    /// Optional stage name, unique within the pipeline; `spec.cache.at` refers to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The operator's own fields.
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl StageSpec {
    /// The name used in messages and by `spec.cache.at`: `name`, or `op` when unnamed.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.op)
    }
}

impl JsonSchema for StageSpec {
    fn schema_name() -> Cow<'static, str> {
        "StageSpec".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = crate::ops::OPS.iter().map(|op| op.name).collect();
        let random: Vec<&str> = crate::ops::OPS
            .iter()
            .filter(|op| op.deterministic == crate::ops::Determinism::Never)
            .map(|op| op.name)
            .collect();
        let op = format!(
            "Operator name: one of {}. The operator's own fields sit beside `op` (docs/spec.md lists \
             them). Random operators ({}), and `python.map` unless it says \
             `deterministic: true`, end the deterministic prefix, within which a stage's output can be cached.",
            names.join(", "),
            random.join(", ")
        );
        json_schema!({
            "description": "One stage of the pipeline: an operator (`op`) and its fields, which sit beside `op`.",
            "type": "object",
            "required": ["op"],
            "properties": {
                "op": {
                    "description": op,
                    "type": "string",
                    "enum": names
                },
                "name": {
                    "description": "Optional stage name, unique within the pipeline; `spec.cache.at` refers to it.",
                    "type": "string",
                    "minLength": 1
                }
            },
            "x-kubernetes-preserve-unknown-fields": true
        })
    }
}
