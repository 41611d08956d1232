//! Text operators: tokenization with a Hugging Face `tokenizer.json`, truncation and padding.

use super::default_text_field;
use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `text.tokenize`: encodes a text field with a Hugging Face `tokenizer.json`, producing the
/// tensors `input_ids` and `attention_mask` (int64).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tokenize {
    /// Path or URL of the `tokenizer.json`. A relative path resolves from the manifest's folder.
    pub tokenizer: String,
    /// Field holding the text. Defaults to `text`.
    #[serde(default = "default_text_field")]
    pub field: String,
    /// Add the tokenizer's special tokens (`[CLS]`, `[SEP]`, ...). Defaults to true.
    #[serde(default = "default_true")]
    pub add_special_tokens: bool,
}

/// `text.truncate_pad`: cuts `input_ids` and `attention_mask` to `length` tokens, or pads them
/// to it with `padId` (mask 0).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TruncatePad {
    /// Sequence length after truncation and padding.
    pub length: u32,
    /// Token id used for padding. Defaults to 0.
    #[serde(default)]
    pub pad_id: i64,
}

/// `text.truncate`: cuts token tensors (1-D, from `text.tokenize`) to at most `length` tokens,
/// without padding; shorter ones keep their length.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Truncate {
    /// Most tokens kept per sequence, at least 1.
    #[schemars(range(min = 1))]
    pub length: u32,
    /// Token fields cut, each a 1-D integer tensor. Defaults to `input_ids` and
    /// `attention_mask`.
    #[serde(default = "default_token_fields")]
    pub fields: Vec<String>,
}

fn default_token_fields() -> Vec<String> {
    vec!["input_ids".to_string(), "attention_mask".to_string()]
}

fn default_true() -> bool {
    true
}

impl Tokenize {
    /// The `op` name: `text.tokenize`.
    pub const OP: &str = "text.tokenize";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.tokenizer.trim().is_empty() {
            problems.push(Problem::new(
                format!("{path}.tokenizer"),
                "must name a tokenizer.json file (a path or a URL)",
            ));
        }
        if self.field.is_empty() {
            problems.push(Problem::new(format!("{path}.field"), "must not be empty"));
        }
    }
}

impl TruncatePad {
    /// The `op` name: `text.truncate_pad`.
    pub const OP: &str = "text.truncate_pad";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.length == 0 {
            problems.push(Problem::new(format!("{path}.length"), "must be > 0"));
        }
        if self.pad_id < 0 {
            problems.push(Problem::new(format!("{path}.padId"), "must be >= 0"));
        }
    }
}

impl Truncate {
    /// The `op` name: `text.truncate`.
    pub const OP: &str = "text.truncate";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.length == 0 {
            problems.push(Problem::new(format!("{path}.length"), "must be > 0"));
        }
        if self.fields.is_empty() {
            problems.push(Problem::new(format!("{path}.fields"), "must name at least one field"));
        }
        for (i, field) in self.fields.iter().enumerate() {
            if field.is_empty() {
                problems.push(Problem::new(format!("{path}.fields[{i}]"), "must not be empty"));
            } else if self.fields[..i].contains(field) {
                problems
                    .push(Problem::new(format!("{path}.fields[{i}]"), format!("`{field}` is listed twice")));
            }
        }
    }
}
