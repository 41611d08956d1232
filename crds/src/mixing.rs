//! `spec.sources` and `spec.mixing`: several datasets mixed into one stream by weight, the way
//! tf.data's `sample_from_datasets`, Hugging Face's `interleave_datasets` and MosaicML's
//! `streams` mix them.

use crate::{Problem, SourceSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most sources one pipeline may mix.
pub const MAX_SOURCES: usize = 64;

/// Longest source name.
pub const MAX_SOURCE_NAME: usize = 63;

/// Most elements drawn from one source at a time (`spec.mixing.block`).
pub const MAX_BLOCK: u32 = 65_536;

/// One of the datasets of `spec.sources`, with its share of the mix.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WeightedSource {
    /// Name of the source, unique in the pipeline: lower-case letters, digits and `-`, as in a
    /// Kubernetes name. It labels the source's metrics, its position in a checkpoint and its
    /// cache entries.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Share of the mixed stream drawn from this source, relative to the other sources' weights
    /// (weights 7 and 3 mean 70% and 30%). Must be > 0.
    pub weight: f64,
    /// Where the samples live and how they are stored, as in `spec.source`.
    #[serde(flatten)]
    pub source: SourceSpec,
}

/// How the sources of `spec.sources` are mixed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MixingSpec {
    /// When an epoch ends. `firstExhausted` (the default): as soon as a draw finds its source
    /// with no element left in this epoch, like tf.data's `stop_on_empty_dataset=True`; every
    /// element is used at most once per epoch. `elements`: after `elements` elements in all; a
    /// source that runs out starts over in a new seeded order, so small sources are repeated
    /// (upsampled) to keep their share.
    #[serde(default)]
    pub stop: MixStop,
    /// With `stop: elements`: the epoch's number of elements, across all sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub elements: Option<u64>,
    /// Consecutive elements drawn from one source at a time, 1 to 65536. Defaults to 16. Smaller
    /// blocks mix more finely (a batch of 256 holds 16 blocks of 16); larger ones cost less to
    /// route, since each block is a separate piece of a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub block: Option<u32>,
}

/// When an epoch of mixed sources ends.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum MixStop {
    /// When a draw finds its source exhausted: each element is used at most once per epoch.
    #[default]
    FirstExhausted,
    /// After `spec.mixing.elements` elements; exhausted sources start over.
    Elements,
}

/// The default `spec.mixing.block`.
pub const DEFAULT_BLOCK: u32 = 16;

impl MixingSpec {
    /// Elements drawn from one source at a time.
    pub fn block(&self) -> u32 {
        self.block.unwrap_or(DEFAULT_BLOCK).clamp(1, MAX_BLOCK)
    }
}

/// One input of a pipeline: its single `spec.source`, or one of `spec.sources`.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The source's name (`source` for a single `spec.source`).
    pub name: &'a str,
    /// Its field path in the spec (`spec.source`, `spec.sources[1]`).
    pub path: InputPath,
    /// Where it lives and how it is stored.
    pub source: &'a SourceSpec,
    /// Its weight (1 for a single source).
    pub weight: f64,
}

/// Where an input is written in the spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputPath {
    /// `spec.source`.
    Single,
    /// `spec.sources[i]`.
    Mixed(usize),
}

impl std::fmt::Display for InputPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputPath::Single => f.write_str("spec.source"),
            InputPath::Mixed(i) => write!(f, "spec.sources[{i}]"),
        }
    }
}

/// The name a single `spec.source` goes by where sources are named.
pub const SINGLE_SOURCE_NAME: &str = "source";

/// Checks `spec.sources` and `spec.mixing` against `spec.source`: exactly one of `source` and
/// `sources`, names, weights, and `mixing` only with `sources`. Problems go to `problems`.
pub fn check_mixing(
    source: Option<&SourceSpec>,
    sources: &[WeightedSource],
    mixing: Option<&MixingSpec>,
    problems: &mut Vec<Problem>,
) {
    match (source.is_some(), sources.is_empty()) {
        (false, true) => problems.push(Problem::new(
            "spec.source",
            "missing: give the data as `source: {url, format}`, or several datasets to mix as \
             `sources: [{name, url, format, weight}, ...]`",
        )),
        (true, false) => problems.push(Problem::new(
            "spec.sources",
            "cannot be given with `spec.source`; list the single source under `sources` (with a name \
             and a weight) or remove `sources`",
        )),
        _ => {}
    }
    if sources.len() > MAX_SOURCES {
        problems.push(Problem::new(
            "spec.sources",
            format!("lists {} sources; the most is {MAX_SOURCES}", sources.len()),
        ));
    }
    for (i, s) in sources.iter().enumerate() {
        let path = format!("spec.sources[{i}]");
        check_name(&s.name, &format!("{path}.name"), problems);
        if sources[..i].iter().any(|o| o.name == s.name) && !s.name.is_empty() {
            problems.push(Problem::new(
                format!("{path}.name"),
                format!("`{}` names an earlier source too; give each source its own name", s.name),
            ));
        }
        if !(s.weight.is_finite() && s.weight > 0.0) {
            problems.push(Problem::new(
                format!("{path}.weight"),
                format!("is {}; a weight is a number > 0, e.g. 0.7 (weights are relative)", s.weight),
            ));
        }
    }
    let Some(mixing) = mixing else { return };
    if sources.is_empty() {
        problems.push(Problem::new(
            "spec.mixing",
            "applies only to `spec.sources`; remove it, or list the datasets to mix under `sources`",
        ));
    }
    match (mixing.stop, mixing.elements) {
        (MixStop::Elements, None) => problems.push(Problem::new(
            "spec.mixing.elements",
            "missing: `stop: elements` ends each epoch after `elements` elements; give the count, \
             e.g. `elements: 100000`, or use `stop: firstExhausted`",
        )),
        (MixStop::Elements, Some(0)) => {
            problems.push(Problem::new("spec.mixing.elements", "must be >= 1 (elements per epoch)"))
        }
        (MixStop::FirstExhausted, Some(_)) => problems.push(Problem::new(
            "spec.mixing.elements",
            "applies only to `stop: elements`; set `stop: elements` for a fixed epoch size, or \
             remove it to end each epoch when the first source runs out",
        )),
        _ => {}
    }
    if let Some(block) = mixing.block
        && !(1..=MAX_BLOCK).contains(&block)
    {
        problems.push(Problem::new(
            "spec.mixing.block",
            format!("is {block}; give 1 to {MAX_BLOCK} elements drawn from one source at a time"),
        ));
    }
}

fn check_name(name: &str, path: &str, problems: &mut Vec<Problem>) {
    let fits = !name.is_empty()
        && name.len() <= MAX_SOURCE_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !fits {
        problems.push(Problem::new(
            path,
            format!(
                "`{name}` is not a source name: use 1 to {MAX_SOURCE_NAME} lower-case letters, digits \
                 and `-`, starting and ending with a letter or digit, e.g. `web-text`"
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SourceFormat;

    fn src(name: &str, weight: f64) -> WeightedSource {
        WeightedSource {
            name: name.to_string(),
            weight,
            source: SourceSpec {
                url: "file:///d/".into(),
                format: SourceFormat::Jsonl,
                labels: None,
                files_per_split: None,
                compression: None,
                delimiter: None,
                fields: None,
            },
        }
    }

    fn paths(p: &[Problem]) -> Vec<&str> {
        p.iter().map(|p| p.path.as_str()).collect()
    }

    #[test]
    fn names_weights_and_stop_rules_are_checked_with_their_paths() {
        let mut p = Vec::new();
        check_mixing(None, &[src("web", 0.7), src("code", 0.3)], None, &mut p);
        assert!(p.is_empty(), "{p:?}");
        check_mixing(None, &[src("Web", 0.0), src("x", f64::NAN), src("x", 1.0)], None, &mut p);
        assert_eq!(
            paths(&p),
            [
                "spec.sources[0].name",
                "spec.sources[0].weight",
                "spec.sources[1].weight",
                "spec.sources[2].name"
            ]
        );
        let mut p = Vec::new();
        check_mixing(None, &[], None, &mut p);
        assert_eq!(paths(&p), ["spec.source"]);
        let mut p = Vec::new();
        let elements = MixingSpec { stop: MixStop::Elements, elements: None, block: Some(0) };
        check_mixing(None, &[src("a", 1.0)], Some(&elements), &mut p);
        assert_eq!(paths(&p), ["spec.mixing.elements", "spec.mixing.block"]);
        let mut p = Vec::new();
        let stray = MixingSpec { stop: MixStop::FirstExhausted, elements: Some(5), block: None };
        check_mixing(Some(&src("a", 1.0).source), &[src("a", 1.0)], Some(&stray), &mut p);
        assert_eq!(paths(&p), ["spec.sources", "spec.mixing.elements"]);
    }
}
