//! `spec.source`: where the samples live and how they are laid out.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the samples live and how they are stored.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.format == 'files' || (!has(self.labels) && !has(self.filesPerSplit))",
        "message": "`labels` and `filesPerSplit` apply only to `format: files`"
    }
]))]
pub struct SourceSpec {
    /// Object-store URL of the dataset prefix or file: `file://`, `s3://`, `gs://`, `az://` or
    /// `memory://`. A relative `file:` path (`file:data/train/`) resolves from the folder of the
    /// manifest that names it.
    #[schemars(length(min = 1))]
    pub url: String,
    /// Layout of the data under `url`: `files` (one object per sample), `webdataset` (tar shards
    /// whose members are grouped by basename, e.g. `N.jpg` + `N.cls`), `jsonl` (one JSON object per
    /// line) or `parquet` (one row per sample).
    pub format: SourceFormat,
    /// Only for `format: files`: a URL, or a path relative to `url`, of a JSONL file of
    /// `{"file": ..., "label": ...}` records. Each `file` is relative to the labels file's own
    /// folder; each sample gets the record's integer `label`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<String>,
    /// Only for `format: files`: how many files make one split, the unit of work that is
    /// shuffled, assigned to a worker and replayed after a failure. Defaults to the smallest
    /// multiple of the batch size that is at least 64, so that every batch but an epoch's last
    /// comes whole from one split (batches merged from split remainders cost an extra copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub files_per_split: Option<u32>,
}

/// Layout of the data under `spec.source.url`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// One object per sample under the prefix (images, text files).
    Files,
    /// WebDataset tar shards: members grouped by basename (`N.jpg` + `N.cls`).
    Webdataset,
    /// JSON Lines files: one JSON object per line, each a sample.
    Jsonl,
    /// Parquet files: one row per sample; a row group is a split.
    Parquet,
}

impl SourceSpec {
    /// Files per split for `format: files` with batches of `batch_size`: the spec's value, or
    /// the smallest multiple of the batch size that is at least 64.
    pub fn files_per_split(&self, batch_size: usize) -> usize {
        match self.files_per_split {
            Some(n) => n.max(1) as usize,
            None => {
                let batch = batch_size.max(1);
                64usize.div_ceil(batch) * batch
            }
        }
    }
}

/// Checks `spec.source.url` before [`crate::object_url::check_url`] does: text no URL can hold
/// (spaces, control characters), which would otherwise be read as a relative path and fail only
/// when the source is listed. Problems go to `problems`.
pub fn check_source_url(url: &str, problems: &mut Vec<crate::Problem>) {
    const FIELD: &str = "spec.source.url";
    let inner = url.trim();
    if inner.chars().any(char::is_whitespace) || inner.chars().any(char::is_control) {
        problems.push(crate::Problem::new(
            FIELD,
            format!(
                "`{url}` has spaces or control characters in it, so it is no URL; write an object-store \
                 URL such as s3://bucket/prefix/ or file:data/train/ (a folder name with spaces is \
                 written with %20)"
            ),
        ));
        return;
    }
    crate::object_url::check_url(url, FIELD, problems);
}
