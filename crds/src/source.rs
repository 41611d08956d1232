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
    },
    {
        "rule": "self.format == 'tfrecord' || !has(self.compression)",
        "message": "`compression` applies only to `format: tfrecord`"
    },
    {
        "rule": "self.format == 'csv' || !has(self.delimiter)",
        "message": "`delimiter` applies only to `format: csv`"
    },
    {
        "rule": "self.format in ['jsonl', 'parquet', 'csv'] || !has(self.fields)",
        "message": "`fields` applies only to `format: jsonl`, `parquet` and `csv`"
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
    /// line), `parquet` (one row per sample), `tfrecord` (TFRecord files of `tf.train.Example`
    /// records) or `csv` (a header row, then one row per sample).
    pub format: SourceFormat,
    /// Only for `format: files`: a URL, or a path relative to `url`, of a JSONL file of
    /// `{"file": ..., "label": ...}` records. Each `file` is relative to the labels file's own
    /// folder; each sample gets the record's integer `label`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<String>,
    /// Only for `format: files`: how many files make one split, the unit of work that is
    /// shuffled, assigned to a worker, replayed after a failure and cached. Defaults to 256,
    /// whatever the batch size, so that pipelines differing only in `batch.size` share their
    /// cache entries; with a batch size that divides it (any power of two up to 256) every batch
    /// but an epoch's last comes whole from one split. Batches merged from split remainders cost
    /// an extra copy: for larger batch sizes, set a multiple of the largest one used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub files_per_split: Option<u32>,
    /// Only for `format: tfrecord`: `gzip` when the files are GZIP-compressed (TensorFlow's
    /// `compression_type="GZIP"`), `none` when they are not. Unset: decided per file by its name,
    /// GZIP when it ends in `.gz`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Only for `format: csv`: the one ASCII character between fields, e.g. `;` or a tab
    /// (`"\t"`). Defaults to `,` (a tab for `.tsv` files). Quoting follows RFC 4180 (`"`, doubled
    /// inside a quoted field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1))]
    pub delimiter: Option<String>,
    /// Only for `format: jsonl`, `parquet` and `csv`: the fields (keys, columns) to read; the
    /// others are skipped while reading, and a Parquet file's other columns are never fetched.
    /// Unset: every field. The optimizer sets it from the fields the stages and the batch use
    /// (`granary plan` shows it), so a spec rarely needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub fields: Option<Vec<String>>,
}

/// Files per split of `format: files` when `filesPerSplit` is unset: a multiple of every power
/// of two up to 256, so batches of those sizes lie whole in one split, and the same for every
/// batch size, so a sweep over batch sizes reads one cache entry.
pub const DEFAULT_FILES_PER_SPLIT: usize = 256;

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
    /// TFRecord files of `tf.train.Example` records, plain or GZIP-compressed (see
    /// `compression`): one record per sample, each feature a field; a file is a split. Both CRCs
    /// of every record are checked.
    Tfrecord,
    /// CSV files: a header row names the fields, then one row per sample; a file is a split.
    /// Numbers become scalars as in `jsonl`, other cells text.
    Csv,
}

impl SourceFormat {
    /// The name a manifest gives the format (`files`, `tfrecord`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Files => "files",
            SourceFormat::Webdataset => "webdataset",
            SourceFormat::Jsonl => "jsonl",
            SourceFormat::Parquet => "parquet",
            SourceFormat::Tfrecord => "tfrecord",
            SourceFormat::Csv => "csv",
        }
    }
}

/// Only for `format: tfrecord`: `gzip` when the files are GZIP-compressed (TensorFlow's
/// `compression_type="GZIP"`), `none` when they are not. Unset: decided per file by its name,
/// GZIP when it ends in `.gz`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Plain TFRecord files.
    None,
    /// GZIP-compressed TFRecord files (TensorFlow's `compression_type="GZIP"`).
    Gzip,
}

impl SourceSpec {
    /// Files per split for `format: files`: the spec's value, or [`DEFAULT_FILES_PER_SPLIT`].
    /// It does not depend on the batch size, so neither do the splits nor the cache entries,
    /// which hold one split each.
    pub fn files_per_split(&self) -> usize {
        self.files_per_split.map_or(DEFAULT_FILES_PER_SPLIT, |n| n.max(1) as usize)
    }

    /// Whether a `format: tfrecord` file named `name` is GZIP-compressed: as `compression` says,
    /// or, when it is unset, when the name ends in `.gz`.
    pub fn gzip(&self, name: &str) -> bool {
        match self.compression {
            Some(Compression::Gzip) => true,
            Some(Compression::None) => false,
            None => name.ends_with(".gz"),
        }
    }

    /// The `format: csv` delimiter for a file named `name`: `delimiter`, else a tab for `.tsv`
    /// files and `,` for others. A `delimiter` that is not one ASCII character (which
    /// [`check_source_options`] refuses) falls back to the default.
    pub fn csv_delimiter(&self, name: &str) -> u8 {
        let default = if name.ends_with(".tsv") { b'\t' } else { b',' };
        match self.delimiter.as_deref().map(str::as_bytes) {
            Some([b]) if b.is_ascii() => *b,
            _ => default,
        }
    }
}

/// Checks the format-specific options of the source at `path` (`spec.source`,
/// `spec.sources[i]`): `compression` only with `tfrecord`, a `delimiter` only with `csv`, and one
/// that can be a delimiter. Problems go to `problems`.
pub fn check_source_options(source: &SourceSpec, path: &str, problems: &mut Vec<crate::Problem>) {
    let format = source.format.name();
    if source.compression.is_some() && source.format != SourceFormat::Tfrecord {
        problems.push(crate::Problem::new(
            format!("{path}.compression"),
            format!("applies only to `format: tfrecord`, but the format is `{format}`; remove it"),
        ));
    }
    let Some(delimiter) = &source.delimiter else { return };
    if source.format != SourceFormat::Csv {
        problems.push(crate::Problem::new(
            format!("{path}.delimiter"),
            format!("applies only to `format: csv`, but the format is `{format}`; remove it"),
        ));
    }
    let fits = matches!(delimiter.as_bytes(), [b] if b.is_ascii() && !matches!(b, b'"' | b'\r' | b'\n'));
    if !fits {
        problems.push(crate::Problem::new(
            format!("{path}.delimiter"),
            format!(
                "is {delimiter:?}, but a delimiter is one ASCII character other than a quote or a line \
                 break, e.g. \";\" or \"\\t\" (a tab); remove it for `,`"
            ),
        ));
    }
}

/// Checks a source's `url` (at `field`, e.g. `spec.source.url`) before
/// [`crate::object_url::check_url`] does: text no URL can hold (spaces, control characters),
/// which would otherwise be read as a relative path and fail only when the source is listed.
/// Problems go to `problems`.
pub fn check_source_url(url: &str, field: &str, problems: &mut Vec<crate::Problem>) {
    let inner = url.trim();
    if inner.chars().any(char::is_whitespace) || inner.chars().any(char::is_control) {
        problems.push(crate::Problem::new(
            field,
            format!(
                "`{url}` has spaces or control characters in it, so it is no URL; write an object-store \
                 URL such as s3://bucket/prefix/ or file:data/train/ (a folder name with spaces is \
                 written with %20)"
            ),
        ));
        return;
    }
    crate::object_url::check_url(url, field, problems);
}
