//! `spec.batch.pad` and `spec.batch.bucket`: variable-length fields padded per batch, and
//! elements grouped by length so that a batch pads little.

use crate::problem::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest accepted `spec.batch.pad.multipleOf`.
pub const MAX_PAD_MULTIPLE: u32 = 65_536;

/// Most boundaries of `spec.batch.bucket` (one more bucket than boundaries).
pub const MAX_BUCKET_BOUNDARIES: usize = 256;

/// Padding of variable-length fields to the longest element of each batch.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PadSpec {
    /// Fields padded along their first axis, all to one width per batch. At least one. They
    /// share one length in each element (as `input_ids`, `attention_mask` and `token_type_ids`
    /// do), so one mask marks the real positions of all of them.
    #[schemars(length(min = 1))]
    pub fields: Vec<String>,
    /// The width each batch pads to: `longest`, its longest element (the default). See
    /// `multipleOf` to round it up.
    #[serde(default)]
    pub to: PadTo,
    /// Round each batch's width up to a multiple of this (e.g. 8 for tensor cores), 1 to
    /// 65,536. Absent: the longest element's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65_536))]
    pub multiple_of: Option<u32>,
    /// Value written into padding positions, converted to each field's dtype. Defaults to 0.
    #[serde(default)]
    pub value: f64,
    /// Name of the `uint8` mask added to each batch, shape [rows, width]: 1 at the real
    /// positions of the padded fields, 0 at padding. Defaults to `<first field>_mask`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
}

/// The width a batch pads to.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum PadTo {
    /// The longest element of the batch, rounded up to `multipleOf` when it is set.
    #[default]
    Longest,
}

impl PadSpec {
    /// The mask field's name: `mask`, or `<first field>_mask`.
    pub fn mask_name(&self) -> String {
        match &self.mask {
            Some(mask) => mask.clone(),
            None => format!("{}_mask", self.fields.first().map_or("pad", String::as_str)),
        }
    }
}

/// Grouping of elements by length, as tf.data's `bucket_by_sequence_length`: within each split,
/// a batch is filled from elements of one length bucket, so it pads to a length close to its
/// elements' own.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BucketSpec {
    /// Upper bounds (exclusive) of the length buckets, strictly increasing and positive: `[16,
    /// 32, 64]` makes the buckets `< 16`, `16..32`, `32..64` and `>= 64`. At least one.
    #[schemars(length(min = 1, max = 256))]
    pub boundaries: Vec<u64>,
    /// The field whose first-axis length decides the bucket, one of `spec.batch.pad.fields`.
    /// Defaults to the first of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl BucketSpec {
    /// The field whose length decides the bucket: `field`, or the first padded field.
    pub fn field_name<'a>(&'a self, pad: &'a PadSpec) -> Option<&'a str> {
        self.field.as_deref().or_else(|| pad.fields.first().map(String::as_str))
    }
}

/// Checks `spec.batch.pad` and `spec.batch.bucket`.
pub fn check_batch(pad: Option<&PadSpec>, bucket: Option<&BucketSpec>, problems: &mut Vec<Problem>) {
    if let Some(pad) = pad {
        check_pad(pad, problems);
    }
    if let Some(bucket) = bucket {
        check_bucket(bucket, pad, problems);
    }
}

fn check_pad(pad: &PadSpec, problems: &mut Vec<Problem>) {
    const PATH: &str = "spec.batch.pad";
    if pad.fields.is_empty() {
        problems.push(Problem::new(
            format!("{PATH}.fields"),
            "must name at least one field, e.g. [input_ids, attention_mask]",
        ));
    }
    let mask = pad.mask_name();
    for (i, field) in pad.fields.iter().enumerate() {
        let path = format!("{PATH}.fields[{i}]");
        if field.is_empty() {
            problems.push(Problem::new(path, "must not be empty"));
        } else if pad.fields[..i].contains(field) {
            problems.push(Problem::new(path, format!("`{field}` is listed twice")));
        } else if *field == mask {
            problems.push(Problem::new(
                path,
                format!("`{field}` is also the mask's name; set `spec.batch.pad.mask` to another name"),
            ));
        }
    }
    if let Some(m) = pad.multiple_of
        && !(1..=MAX_PAD_MULTIPLE).contains(&m)
    {
        problems.push(Problem::new(
            format!("{PATH}.multipleOf"),
            format!("is {m}; it must be 1 to {MAX_PAD_MULTIPLE}, e.g. 8"),
        ));
    }
    if !pad.value.is_finite() {
        problems.push(Problem::new(format!("{PATH}.value"), "must be a finite number"));
    }
    if pad.mask.as_ref().is_some_and(|m| m.is_empty()) {
        problems.push(Problem::new(
            format!("{PATH}.mask"),
            "must not be empty; remove it for `<first field>_mask`",
        ));
    }
}

fn check_bucket(bucket: &BucketSpec, pad: Option<&PadSpec>, problems: &mut Vec<Problem>) {
    const PATH: &str = "spec.batch.bucket";
    let Some(pad) = pad else {
        problems.push(Problem::new(
            PATH,
            "needs `spec.batch.pad`: bucketing groups elements by the length of a padded field, e.g. \
             `pad: {fields: [input_ids, attention_mask]}`",
        ));
        return;
    };
    if bucket.boundaries.is_empty() {
        problems.push(Problem::new(
            format!("{PATH}.boundaries"),
            "must hold at least one length, e.g. [32, 64, 128, 256]",
        ));
    } else if bucket.boundaries.len() > MAX_BUCKET_BOUNDARIES {
        problems.push(Problem::new(
            format!("{PATH}.boundaries"),
            format!("has {} lengths; the most is {MAX_BUCKET_BOUNDARIES}", bucket.boundaries.len()),
        ));
    }
    for (i, &b) in bucket.boundaries.iter().enumerate() {
        let path = format!("{PATH}.boundaries[{i}]");
        if b == 0 {
            problems.push(Problem::new(path, "must be >= 1: it is the exclusive upper bound of a bucket"));
        } else if let Some(&before) = i.checked_sub(1).and_then(|p| bucket.boundaries.get(p))
            && b <= before
        {
            problems.push(Problem::new(
                path,
                format!("is {b}, not above the boundary before it ({before}); boundaries must be strictly increasing"),
            ));
        }
    }
    if let Some(field) = &bucket.field
        && !pad.fields.contains(field)
    {
        let listed = pad.fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ");
        problems.push(Problem::new(
            format!("{PATH}.field"),
            format!("`{field}` is not padded; name one of `spec.batch.pad.fields` ({listed}), or remove it for the first"),
        ));
    }
}
