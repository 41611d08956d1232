//! `filter`: built-in predicates that keep or drop each element.
//!
//! A filter leaves the elements it keeps as they are and drops the others: the stages after it
//! do not run on them, and a split's output count is known only once the split is computed.
//! The user-facing config ([`Filter`]) is flat, as YAML reads best; [`Filter::test`] turns a
//! checked config into the typed [`Test`] the worker runs.

use super::Kind;
use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The field `text.length` reads with `unit: chars` when the stage names none.
pub const CHARS_FIELD: &str = "text";
/// The field `text.length` reads with `unit: tokens` when the stage names none: the token ids
/// `text.tokenize` writes.
pub const TOKENS_FIELD: &str = "input_ids";
/// The field `image.min_size` reads when the stage names none.
pub const IMAGE_FIELD: &str = "image";

/// `filter`: keeps the elements a built-in predicate accepts and drops the others; the stages
/// after it do not see the dropped ones.
///
/// `predicate: text.length` keeps an element whose text (`unit: chars`, Unicode scalar values) or
/// token field (`unit: tokens`, its length) is within `min`..`max`, both inclusive.
/// `predicate: image.min_size` keeps an element whose decoded image (after `image.decode`, before
/// `image.normalize`) is at least `minWidth` wide and `minHeight` high.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filter {
    /// The test: `text.length` (the length of a text or token field within `min`..`max`) or
    /// `image.min_size` (decoded pixels at least `minWidth` × `minHeight`).
    pub predicate: Predicate,
    /// Field tested. Defaults to `text` for `text.length` with `unit: chars`, `input_ids` for
    /// `unit: tokens`, and `image` for `image.min_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// `text.length` only: `chars` counts the Unicode scalar values of a text field; `tokens`
    /// counts the ids of a token field (after `text.tokenize`, before `text.truncate_pad`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<LengthUnit>,
    /// `text.length` only: the least length kept (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// `text.length` only: the greatest length kept (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// `image.min_size` only: the least width kept, in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_width: Option<u32>,
    /// `image.min_size` only: the least height kept, in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_height: Option<u32>,
}

/// A built-in filter predicate.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Predicate {
    /// The length of a text or token field within bounds.
    #[serde(rename = "text.length")]
    TextLength,
    /// A decoded image at least a given size.
    #[serde(rename = "image.min_size")]
    ImageMinSize,
}

/// What `text.length` counts.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LengthUnit {
    /// Unicode scalar values of a text field (or of bytes that are UTF-8).
    Chars,
    /// Ids of a 1-D integer token field.
    Tokens,
}

/// A checked filter, as the worker runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// Keeps an element whose `field` has a length in `min..=max` (counted in `unit`).
    Length {
        /// The field counted.
        field: String,
        /// What is counted.
        unit: LengthUnit,
        /// Least length kept.
        min: u64,
        /// Greatest length kept.
        max: u64,
    },
    /// Keeps an element whose decoded image in `field` (height × width × channels) is at least
    /// `min_width` × `min_height`.
    MinSize {
        /// The image field.
        field: String,
        /// Least width kept.
        min_width: u32,
        /// Least height kept.
        min_height: u32,
    },
}

impl Filter {
    /// The `op` name: `filter`.
    pub const OP: &str = "filter";

    /// The field tested: `field`, or the predicate's default.
    pub fn field(&self) -> &str {
        if let Some(field) = &self.field {
            return field;
        }
        match (self.predicate, self.unit) {
            (Predicate::ImageMinSize, _) => IMAGE_FIELD,
            (Predicate::TextLength, Some(LengthUnit::Tokens)) => TOKENS_FIELD,
            (Predicate::TextLength, _) => CHARS_FIELD,
        }
    }

    /// The kind of data the predicate reads from its field: text, tokens or decoded pixels.
    pub fn input_kind(&self) -> Kind {
        match (self.predicate, self.unit) {
            (Predicate::ImageMinSize, _) => Kind::Pixels,
            (Predicate::TextLength, Some(LengthUnit::Tokens)) => Kind::Tokens,
            (Predicate::TextLength, _) => Kind::Text,
        }
    }

    /// The test to run, when the config is complete (as [`Filter::check`] requires).
    pub fn test(&self) -> Option<Test> {
        let field = self.field().to_string();
        match self.predicate {
            Predicate::TextLength => Some(Test::Length {
                field,
                unit: self.unit?,
                min: self.min.unwrap_or(0),
                max: self.max.unwrap_or(u64::MAX),
            }),
            Predicate::ImageMinSize => Some(Test::MinSize {
                field,
                min_width: self.min_width.unwrap_or(0),
                min_height: self.min_height.unwrap_or(0),
            }),
        }
    }

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        if self.field.as_deref().is_some_and(|f| f.trim().is_empty()) {
            problems.push(Problem::new(
                format!("{path}.field"),
                format!(
                    "must not be empty; name the field to test, or remove `field` for `{}`",
                    self.field()
                ),
            ));
        }
        match self.predicate {
            Predicate::TextLength => self.check_length(path, problems),
            Predicate::ImageMinSize => self.check_min_size(path, problems),
        }
    }

    fn check_length(&self, path: &str, problems: &mut Vec<Problem>) {
        for (value, name) in [(self.min_width, "minWidth"), (self.min_height, "minHeight")] {
            if value.is_some() {
                problems.push(Problem::new(
                    format!("{path}.{name}"),
                    format!(
                        "applies only to `predicate: image.min_size`; `text.length` takes `min` and `max`: \
                         remove `{name}`"
                    ),
                ));
            }
        }
        if self.unit.is_none() {
            problems.push(Problem::new(
                format!("{path}.unit"),
                "missing: `predicate: text.length` needs `unit`: `chars` (Unicode characters of a text field) \
                 or `tokens` (ids of a token field, after `text.tokenize`)",
            ));
        }
        match (self.min, self.max) {
            (None, None) => problems.push(Problem::new(
                format!("{path}.min"),
                "missing: `text.length` needs `min`, `max` or both (inclusive bounds), e.g. `min: 8`",
            )),
            (Some(min), Some(max)) if min > max => problems.push(Problem::new(
                format!("{path}.min"),
                format!("is {min}, more than `max` ({max}), so nothing would be kept; min must be <= max"),
            )),
            _ => {}
        }
    }

    fn check_min_size(&self, path: &str, problems: &mut Vec<Problem>) {
        for (present, name) in
            [(self.unit.is_some(), "unit"), (self.min.is_some(), "min"), (self.max.is_some(), "max")]
        {
            if present {
                problems.push(Problem::new(
                    format!("{path}.{name}"),
                    format!(
                        "applies only to `predicate: text.length`; `image.min_size` takes `minWidth` and \
                         `minHeight`: remove `{name}`"
                    ),
                ));
            }
        }
        if self.min_width.is_none() && self.min_height.is_none() {
            problems.push(Problem::new(
                format!("{path}.minWidth"),
                "missing: `image.min_size` needs `minWidth`, `minHeight` or both (pixels), e.g. `minWidth: 64`",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> Filter {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn paths(filter: &Filter) -> Vec<String> {
        let mut problems = Vec::new();
        filter.check("s", &mut problems);
        problems.into_iter().map(|p| p.path).collect()
    }

    #[test]
    fn fields_default_by_predicate_and_unit() {
        let chars = parse(serde_json::json!({"predicate": "text.length", "unit": "chars", "min": 1}));
        assert_eq!((chars.field(), chars.input_kind()), ("text", Kind::Text));
        let tokens = parse(serde_json::json!({"predicate": "text.length", "unit": "tokens", "max": 9}));
        assert_eq!((tokens.field(), tokens.input_kind()), ("input_ids", Kind::Tokens));
        assert_eq!(
            tokens.test(),
            Some(Test::Length { field: "input_ids".into(), unit: LengthUnit::Tokens, min: 0, max: 9 })
        );
        let image =
            parse(serde_json::json!({"predicate": "image.min_size", "minHeight": 4, "field": "photo"}));
        assert_eq!((image.field(), image.input_kind()), ("photo", Kind::Pixels));
        assert_eq!(image.test(), Some(Test::MinSize { field: "photo".into(), min_width: 0, min_height: 4 }));
        assert!(paths(&chars).is_empty() && paths(&tokens).is_empty() && paths(&image).is_empty());
    }

    #[test]
    fn problems_name_the_field() {
        let f = parse(serde_json::json!({"predicate": "text.length", "min": 9, "max": 3, "minWidth": 2}));
        assert_eq!(paths(&f), ["s.minWidth", "s.unit", "s.min"]);
        let f = parse(serde_json::json!({"predicate": "text.length", "unit": "chars"}));
        assert_eq!(paths(&f), ["s.min"]);
        let f = parse(serde_json::json!({"predicate": "image.min_size", "unit": "chars", "max": 3}));
        assert_eq!(paths(&f), ["s.unit", "s.max", "s.minWidth"]);
        let f = parse(serde_json::json!({"predicate": "image.min_size", "minWidth": 1, "field": " "}));
        assert_eq!(paths(&f), ["s.field"]);
    }
}
