//! Text operators: tokenization with a Hugging Face `tokenizer.json`, truncation, padding and
//! packing.

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

/// `text.pack`: concatenates a split's tokenized documents, each followed by `eos`, into rows of
/// exactly `length` tokens, in the split's order. Each row is one element with the int64
/// tensors `input_ids`, `position_ids` (each token's position in its document, from 0) and
/// `segment_ids` (1, 2, ... for the documents of the row, 0 on padding), all of shape
/// [`length`]; the documents' other fields are not kept. A document longer than the room left
/// continues in the next row, its positions counting on. Rows never cross splits, so a split's
/// rows are the same whenever it is computed; the split's last row is padded (see `lastRow`).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pack {
    /// Tokens per row, from 1 to 1048576 (e.g. the model's context, 2048).
    #[schemars(range(min = 1, max = 1048576))]
    pub length: u32,
    /// Token id appended after every document (the tokenizer's end-of-text id, e.g. 50256 for
    /// GPT-2), at least 0.
    #[schemars(range(min = 0))]
    pub eos: i64,
    /// Token id that fills the end of the split's last row (position and segment 0 there), at
    /// least 0. Defaults to 0.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pad_id: i64,
    /// The 1-D integer token field packed. Defaults to `input_ids`.
    #[serde(default = "default_pack_field")]
    pub field: String,
    /// What becomes of the split's last row when its documents do not fill it: `pad` (the
    /// default) fills it with `padId`, so no token is lost; `drop` leaves it out, so every row
    /// is full but the tokens of that row are not seen this epoch.
    #[serde(default)]
    pub last_row: LastRow,
}

/// What `text.pack` does with a split's last row when its documents do not fill it.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LastRow {
    /// Fill it with `padId` (position and segment 0 there).
    #[default]
    Pad,
    /// Leave it out.
    Drop,
}

/// Largest accepted `text.pack` `length`.
pub const MAX_PACK_LENGTH: u32 = 1 << 20;

fn default_pack_field() -> String {
    PACK_FIELD.to_string()
}

/// The token field `text.pack` reads when the stage names none, and the field of its rows' ids.
pub const PACK_FIELD: &str = "input_ids";

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

impl Pack {
    /// The `op` name: `text.pack`.
    pub const OP: &str = "text.pack";

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.length == 0 {
            problems.push(Problem::new(
                format!("{path}.length"),
                "must be >= 1 (tokens per row), e.g. 2048 for a 2048-token context",
            ));
        } else if self.length > MAX_PACK_LENGTH {
            problems.push(Problem::new(
                format!("{path}.length"),
                format!("is {}; the most is {MAX_PACK_LENGTH} tokens per row", self.length),
            ));
        }
        if self.eos < 0 {
            problems.push(Problem::new(
                format!("{path}.eos"),
                "must be a token id >= 0: the tokenizer's end-of-text id (e.g. 50256 for GPT-2)",
            ));
        }
        if self.pad_id < 0 {
            problems.push(Problem::new(format!("{path}.padId"), "must be a token id >= 0; remove it for 0"));
        }
        if self.field.is_empty() {
            problems.push(Problem::new(
                format!("{path}.field"),
                format!("must name the token field; remove it for `{PACK_FIELD}`"),
            ));
        }
    }
}
