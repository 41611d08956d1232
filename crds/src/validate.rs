//! Validation of a parsed spec: every problem, each with its field path.
//!
//! [`validate`] checks what the types cannot: URLs, combinations of fields, ranges, each stage's
//! own fields (through [`OpConfig::parse`]), the order of the stages (an image must be decoded
//! before it is cropped, tokens exist only after tokenization), which operators fit which source
//! format, whether the cache point lies in the deterministic prefix, and whether each filter's
//! predicate reads the kind of data its field holds at that point.

pub use crate::object_url::{SUPPORTED_SCHEMES, check_url};
use crate::ops::filter::TOKENS_FIELD;
use crate::ops::{Count, Family, Filter, FormatFit, Kind, OpInfo, Pack, TruncatePad, op_info, producer_of};
use crate::quantity::{BYTES_FORM, DURATION_FORM, parse_duration};
use crate::suggest::{backticked, closest, did_you_mean, edit_distance};
use crate::{
    CachePolicy, CacheSpec, InputPipelineSpec, OpConfig, Problem, ScalingPolicy, ScalingSpec, SourceFormat,
    SourceSpec, StageSpec,
};
use std::collections::HashMap;

/// Largest accepted `spec.batch.size`.
pub const MAX_BATCH_SIZE: u32 = 1_000_000;

/// Checks `spec` and returns every problem found (empty when valid).
pub fn validate(spec: &InputPipelineSpec) -> Vec<Problem> {
    let mut problems = Vec::new();
    crate::mixing::check_mixing(spec.source.as_ref(), &spec.sources, spec.mixing.as_ref(), &mut problems);
    for input in spec.inputs() {
        check_source(input.source, &input.path.to_string(), &mut problems);
    }
    check_stages(spec, &mut problems);
    if let Some(shuffle) = &spec.shuffle
        && shuffle.buffer == 0
    {
        problems.push(Problem::new(
            "spec.shuffle.buffer",
            "must be >= 1 (elements held for shuffling); remove `shuffle` to keep the source order",
        ));
    }
    if spec.batch.size == 0 {
        problems.push(Problem::new("spec.batch.size", "must be >= 1 (elements per batch), e.g. 128"));
    } else if spec.batch.size > MAX_BATCH_SIZE {
        problems.push(Problem::new(
            "spec.batch.size",
            format!("is {}; the most is {MAX_BATCH_SIZE} elements per batch", spec.batch.size),
        ));
    }
    crate::batch::check_batch(spec.batch.pad.as_ref(), spec.batch.bucket.as_ref(), &mut problems);
    if spec.epochs == 0 {
        problems.push(Problem::new("spec.epochs", "must be >= 1 (passes over the source); remove it for 1"));
    }
    if let Some(scaling) = &spec.scaling {
        check_scaling(scaling, &mut problems);
    }
    if let Some(cache) = &spec.cache {
        // With `spec.sources` each source has entries of its own; the checks are the same.
        check_cache(cache, &spec.stages, &mut problems);
    }
    if let Some(workers) = &spec.workers {
        workers.check(&mut problems);
    }
    if let Some(python) = &spec.python {
        python.check(&mut problems);
    }
    if let Some(errors) = &spec.errors {
        errors.check(&mut problems);
    }
    problems
}

fn check_source(source: &SourceSpec, path: &str, problems: &mut Vec<Problem>) {
    crate::source::check_source_url(&source.url, &format!("{path}.url"), problems);
    crate::source::check_source_options(source, path, problems);
    if source.format != SourceFormat::Files {
        let format = source.format.name();
        if source.labels.is_some() {
            problems.push(Problem::new(
                format!("{path}.labels"),
                format!(
                    "applies only to `format: files`, but the format is `{format}`; remove it \
                     ({format} samples carry their own labels)"
                ),
            ));
        }
        if source.files_per_split.is_some() {
            problems.push(Problem::new(
                format!("{path}.filesPerSplit"),
                format!("applies only to `format: files`, but the format is `{format}`; remove it"),
            ));
        }
    }
    if let Some(labels) = &source.labels
        && labels.trim().is_empty()
    {
        problems.push(Problem::new(
            format!("{path}.labels"),
            "must not be empty; give the labels JSONL file (relative to `url`, or a URL), or remove it",
        ));
    }
    if let Some(fields) = &source.fields {
        use crate::SourceFormat::{Csv, Jsonl, Parquet};
        if !matches!(source.format, Jsonl | Parquet | Csv) {
            problems.push(Problem::new(
                format!("{path}.fields"),
                format!(
                    "applies only to `format: jsonl`, `parquet` and `csv`, but the format is `{}`; \
                     remove it",
                    source.format.name()
                ),
            ));
        }
        if fields.is_empty() {
            problems.push(Problem::new(
                format!("{path}.fields"),
                "must name at least one field; remove it to read every field",
            ));
        }
        for (i, f) in fields.iter().enumerate() {
            if f.is_empty() {
                problems.push(Problem::new(format!("{path}.fields[{i}]"), "must not be empty; name a field"));
            } else if fields[..i].contains(f) {
                problems.push(Problem::new(
                    format!("{path}.fields[{i}]"),
                    format!("field `{f}` is listed twice"),
                ));
            }
        }
    }
    if source.files_per_split == Some(0) {
        problems.push(Problem::new(
            format!("{path}.filesPerSplit"),
            "must be >= 1; remove it for the default 64",
        ));
    }
}

/// The field a stage works on: its `field`, or the operator's default.
fn stage_field(stage: &StageSpec, info: &OpInfo) -> String {
    match stage.params.get("field").and_then(|v| v.as_str()) {
        Some(f) => f.to_string(),
        None => info.field.unwrap_or_default().to_string(),
    }
}

fn check_stages(spec: &InputPipelineSpec, problems: &mut Vec<Problem>) {
    let stages = &spec.stages;
    if stages.is_empty() {
        problems.push(Problem::new("spec.stages", "must list at least one stage, e.g. `- op: image.decode`"));
        return;
    }
    for (i, stage) in stages.iter().enumerate() {
        let path = format!("spec.stages[{i}]");
        if stage.op.trim().is_empty() {
            problems.push(Problem::new(format!("{path}.op"), "must name an operator, e.g. `image.decode`"));
            continue;
        }
        // Serde stops at the first unknown field; drop each one found and parse again to find the
        // rest, and the problems behind them.
        let mut trial = stage.clone();
        for _ in 0..=stage.params.len() {
            let Err(found) = OpConfig::parse(&trial, &path) else { break };
            let unknown: Vec<String> = found.iter().filter_map(|p| unknown_field_name(&p.message)).collect();
            problems.extend(found.into_iter().map(|p| refine_stage_problem(p, &path, stage)));
            if unknown.is_empty() || unknown.iter().any(|k| trial.params.remove(k).is_none()) {
                break;
            }
        }
    }
    check_stage_names(stages, problems);
    for input in spec.inputs() {
        check_formats(stages, input.source.format, &input.path.to_string(), problems);
    }
    check_flow(stages, problems);
    check_after_pack(stages, problems);
}

/// Checks the stages after a `text.pack`: no second one, and only stages that take its rows
/// (which hold nothing but `input_ids`, `position_ids` and `segment_ids` of one length) one at a
/// time: table and test operators, and element-wise Python stages.
fn check_after_pack(stages: &[StageSpec], problems: &mut Vec<Problem>) {
    let Some(p) = stages.iter().position(|s| s.op == Pack::OP) else { return };
    for (j, stage) in stages.iter().enumerate().skip(p + 1) {
        let path = format!("spec.stages[{j}]");
        let Some(info) = op_info(&stage.op) else { return };
        let op = &stage.op;
        if op == Pack::OP {
            problems.push(Problem::new(
                format!("{path}.op"),
                format!(
                    "a second `{op}` after spec.stages[{p}]; documents are packed once: remove this stage"
                ),
            ));
            continue;
        }
        match info.family {
            Family::Python if stage.params.get("batched") == Some(&serde_json::Value::Bool(true)) => {
                problems.push(Problem::new(
                    format!("{path}.batched"),
                    format!(
                        "a batched stage cannot follow `{}` (spec.stages[{p}]), which makes its rows one at a \
                         time from the whole split; set `batched: false`, or move this stage before spec.stages[{p}]",
                        Pack::OP
                    ),
                ));
            }
            Family::Python | Family::Table | Family::Test => {}
            _ => problems.push(Problem::new(
                format!("{path}.op"),
                format!(
                    "`{op}` cannot follow `{}` (spec.stages[{p}]): its rows hold only `input_ids`, \
                     `position_ids` and `segment_ids`, all of one length; move this stage before spec.stages[{p}]",
                    Pack::OP
                ),
            )),
        }
    }
}

fn unknown_field_name(message: &str) -> Option<String> {
    Some(message.strip_prefix("unknown field `")?.split('`').next()?.to_string())
}

/// Puts serde's stage-level messages (`unknown field`, `missing field`) on the field they name.
fn refine_stage_problem(p: Problem, path: &str, stage: &StageSpec) -> Problem {
    if let Some(rest) = p.message.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or_default().to_string();
        let known: Vec<&str> = rest
            .split_once("expected ")
            .map(|(_, list)| list.split('`').skip(1).step_by(2).collect())
            .unwrap_or_default();
        let mut message = format!("unknown field `{name}` for `{}`{}", stage.op, did_you_mean(&name, &known));
        if known.is_empty() {
            message.push_str("; it takes no fields besides `op` and `name`");
        } else {
            message.push_str(&format!("; its fields are {} (besides `op` and `name`)", backticked(&known)));
        }
        return Problem::new(format!("{path}.{name}"), message);
    }
    if p.path == format!("{path}.op") && p.message.starts_with("unknown operator") {
        let known: Vec<&str> = crate::ops::OPS.iter().map(|i| i.name).collect();
        if let Some(best) = closest(&stage.op, &known) {
            return Problem::new(p.path, format!("{} (did you mean `{best}`?)", p.message));
        }
        return p;
    }
    if p.path != path {
        return p;
    }
    if let Some(rest) = p.message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or_default();
        return Problem::new(format!("{path}.{name}"), format!("missing: `{}` needs `{name}`", stage.op));
    }
    p
}

fn check_stage_names(stages: &[StageSpec], problems: &mut Vec<Problem>) {
    for (j, stage) in stages.iter().enumerate() {
        if let Some(name) = &stage.name
            && name.trim().is_empty()
        {
            problems.push(Problem::new(
                format!("spec.stages[{j}].name"),
                "must not be empty; give the stage a name or remove `name`",
            ));
            continue;
        }
        let name = stage.display_name();
        let Some(i) = stages[..j].iter().position(|s| s.display_name() == name) else { continue };
        let earlier = &stages[i];
        if stage.name.is_none() && earlier.name.is_none() {
            // Two unnamed stages of the same operator are fine until `cache.at` names them.
            continue;
        }
        let at = if stage.name.is_some() { j } else { i };
        problems.push(Problem::new(
            format!("spec.stages[{at}].name"),
            format!(
                "stage name `{name}` is used by both spec.stages[{i}] and spec.stages[{j}] (a stage without \
                 `name` goes by its `op`); give each a unique name"
            ),
        ));
    }
}

fn check_formats(stages: &[StageSpec], format: SourceFormat, path: &str, problems: &mut Vec<Problem>) {
    let name = format.name();
    for fam in Family::ALL {
        let Some(FormatFit { formats, needs }) = fam.format_fit() else { continue };
        if formats.contains(&format) {
            continue;
        }
        let offending: Vec<usize> = (0..stages.len())
            .filter(|i| op_info(&stages[*i].op).is_some_and(|op| op.family == fam))
            .collect();
        let Some(first) = offending.first() else { continue };
        let more = match offending.len() {
            1 => String::new(),
            n => format!(" ({} more such stage{} follow)", n - 1, if n == 2 { "" } else { "s" }),
        };
        problems.push(Problem::new(
            format!("spec.stages[{first}].op"),
            format!(
                "`{}` does not fit {path}.format `{name}`: {needs}{more}; change the format or remove the stage",
                stages[*first].op
            ),
        ));
    }
}

/// Checks that each stage gets the kind of data its operator takes: pixels only after a decode of
/// their field, nothing on an image field after the stage that finishes it, tokens only after a
/// tokenizer, and each filter's predicate the kind it reads.
fn check_flow(stages: &[StageSpec], problems: &mut Vec<Problem>) {
    // Per image field: the stage that decoded it and the one that finished it.
    let mut decoded: HashMap<String, usize> = HashMap::new();
    let mut finished: HashMap<String, usize> = HashMap::new();
    let mut tokenized: Option<usize> = None;
    // Per text field: the stage that tokenized it (and removed it); the first that pads tokens.
    let mut consumed: HashMap<String, usize> = HashMap::new();
    let mut padded: Option<usize> = None;
    let mut reported_missing_decode: Vec<String> = Vec::new();
    for (i, stage) in stages.iter().enumerate() {
        let op = stage.op.as_str();
        let Some(info) = op_info(op) else {
            // What an unknown operator produces is unknown: stop rather than guess.
            return;
        };
        let path = format!("spec.stages[{i}]");
        if info.family == Family::Filter {
            // A stage that does not parse is reported already.
            if let Ok(crate::OpConfig::Filter(filter)) = crate::OpConfig::parse(stage, &path) {
                let seen =
                    Seen { decoded: &decoded, finished: &finished, tokenized, consumed: &consumed, padded };
                check_filter_input(stages, &filter, &path, &seen, problems);
            }
            continue;
        }
        if info.family == Family::Image {
            let field = stage_field(stage, info);
            // A flip mirrors a HWC tensor of any element type, so it may follow a HWC
            // normalization (the optimizer moves it before, where it costs less).
            let mirrors_hwc = |n: usize| {
                op == crate::ops::Flip::OP
                    && matches!(
                        crate::OpConfig::parse(&stages[n], &format!("spec.stages[{n}]")),
                        Ok(crate::OpConfig::ImageNormalize(c)) if c.layout == crate::ops::Layout::HWC
                    )
            };
            if let Some(&n) = finished.get(&field)
                && !mirrors_hwc(n)
            {
                problems.push(Problem::new(
                    format!("{path}.op"),
                    format!(
                        "`{op}` comes after `{}` of field `{field}` (spec.stages[{n}]); \
                         normalize must be the last image operator for its field: move this stage before it",
                        stages[n].op
                    ),
                ));
                continue;
            }
            if info.input == Kind::EncodedImage {
                if let Some(d) = decoded.get(&field) {
                    problems.push(Problem::new(
                        format!("{path}.op"),
                        format!("field `{field}` is already decoded by spec.stages[{d}]; remove this stage"),
                    ));
                } else {
                    decoded.insert(field, i);
                }
                continue;
            }
            if info.input == Kind::Pixels
                && !decoded.contains_key(&field)
                && !reported_missing_decode.contains(&field)
            {
                let decoder = producer_of(Kind::Pixels).map(|p| p.name).unwrap_or_default();
                problems.push(Problem::new(
                    format!("{path}.op"),
                    format!(
                        "`{op}` needs decoded pixels, but no earlier stage decodes field `{field}`; \
                         add `- op: {decoder}` (with `field: {field}` if not `image`) before it"
                    ),
                ));
                // Report the missing decode once per field.
                reported_missing_decode.push(field.clone());
            }
            // A `uint8` HWC normalization leaves the pixels as they are: image operators may
            // still follow it.
            let identity = matches!(
                crate::OpConfig::parse(stage, &path),
                Ok(crate::OpConfig::ImageNormalize(c))
                    if c.dtype == crate::ops::ImageDType::Uint8 && c.layout == crate::ops::Layout::HWC
            );
            if info.output == Kind::ImageTensor && !identity {
                finished.insert(field, i);
            }
        } else if info.input == Kind::Tokens && tokenized.is_none() {
            let tokenizer = producer_of(Kind::Tokens).map(|p| p.name).unwrap_or_default();
            problems.push(Problem::new(
                format!("{path}.op"),
                format!(
                    "`{op}` works on the token ids `{tokenizer}` produces, but no earlier stage \
                     tokenizes; add a `{tokenizer}` stage before it"
                ),
            ));
            tokenized = Some(i);
        } else if info.output == Kind::Tokens {
            tokenized.get_or_insert(i);
            if info.input == Kind::Text {
                consumed.insert(stage_field(stage, info), i);
            } else if stage.op == TruncatePad::OP {
                // It pads every sequence to one length (`text.truncate` only caps them).
                padded.get_or_insert(i);
            }
        }
    }
}

/// What the stages before a filter did to the fields, as [`check_flow`] followed them.
struct Seen<'a> {
    /// Per image field: the stage that decoded it.
    decoded: &'a HashMap<String, usize>,
    /// Per image field: the stage that finished it (`image.normalize`).
    finished: &'a HashMap<String, usize>,
    /// The first stage that tokenizes.
    tokenized: Option<usize>,
    /// Per text field: the stage that tokenized it away.
    consumed: &'a HashMap<String, usize>,
    /// The first stage that truncates and pads the token ids.
    padded: Option<usize>,
}

/// Checks that a filter's predicate reads the kind of data its field holds after the stages
/// before it: decoded pixels for `image.min_size`, text for `unit: chars`, token ids for
/// `unit: tokens`. Problems name the field whose change fixes them.
fn check_filter_input(
    stages: &[StageSpec],
    filter: &Filter,
    path: &str,
    seen: &Seen<'_>,
    problems: &mut Vec<Problem>,
) {
    let Seen { decoded, finished, tokenized, consumed, padded } = *seen;
    let field = filter.field();
    // Where a wrong field is fixed: `field` when the stage names one, else the predicate that
    // chose the default.
    let field_path =
        if filter.field.is_some() { format!("{path}.field") } else { format!("{path}.predicate") };
    let op = |n: usize| stages.get(n).map_or("", |s| s.op.as_str());
    match filter.input_kind() {
        Kind::Pixels => {
            let decoder = producer_of(Kind::Pixels).map(|p| p.name).unwrap_or_default();
            if let Some(n) = finished.get(field) {
                problems.push(Problem::new(
                    field_path,
                    format!(
                        "`image.min_size` reads decoded pixels (height × width × 3), but field `{field}` is \
                         finished by `{}` (spec.stages[{n}]) before it; move this filter before spec.stages[{n}]",
                        op(*n)
                    ),
                ));
            } else if !decoded.contains_key(field) {
                problems.push(Problem::new(
                    field_path,
                    format!(
                        "`image.min_size` reads decoded pixels, but no earlier stage decodes field `{field}`; \
                         add `- op: {decoder}` (with `field: {field}` if not `image`) before it, or name the \
                         image field in `field`"
                    ),
                ));
            }
        }
        Kind::Tokens => {
            let tokenizer = producer_of(Kind::Tokens).map(|p| p.name).unwrap_or_default();
            if tokenized.is_none() {
                problems.push(Problem::new(
                    format!("{path}.unit"),
                    format!(
                        "`unit: tokens` counts the ids of a token field, but no earlier stage tokenizes; add a \
                         `{tokenizer}` stage before it, or count characters with `unit: chars`"
                    ),
                ));
            } else if let Some(n) = consumed.get(field) {
                problems.push(Problem::new(
                    format!("{path}.field"),
                    format!(
                        "field `{field}` is tokenized by spec.stages[{n}], which leaves its ids in `{TOKENS_FIELD}`; \
                         set `field: {TOKENS_FIELD}` (or remove `field`)"
                    ),
                ));
            } else if let Some(n) = padded.filter(|_| field == TOKENS_FIELD) {
                problems.push(Problem::new(
                    format!("{path}.op"),
                    format!(
                        "comes after `{}` (spec.stages[{n}]), which makes every `{field}` the same length, so \
                         this filter would keep all elements or none; move it before spec.stages[{n}]",
                        op(n)
                    ),
                ));
            }
        }
        _ => {
            if let Some(n) = decoded.get(field) {
                problems.push(Problem::new(
                    field_path,
                    format!(
                        "field `{field}` holds the pixels `{}` (spec.stages[{n}]) decoded, not text; name a text \
                         field in `field`",
                        op(*n)
                    ),
                ));
            } else if let Some(n) = consumed.get(field) {
                problems.push(Problem::new(
                    format!("{path}.unit"),
                    format!(
                        "`unit: chars` counts the text of field `{field}`, which spec.stages[{n}] tokenizes before \
                         this filter; count its tokens with `unit: tokens` (field `{TOKENS_FIELD}`), or move this \
                         filter before spec.stages[{n}]"
                    ),
                ));
            } else if tokenized.is_some() && field == TOKENS_FIELD {
                problems.push(Problem::new(
                    format!("{path}.unit"),
                    format!("field `{field}` holds token ids, not text; count them with `unit: tokens`"),
                ));
            }
        }
    }
}

fn check_scaling(scaling: &ScalingSpec, problems: &mut Vec<Problem>) {
    match scaling.policy {
        ScalingPolicy::Fixed => {
            if scaling.replicas.is_none() {
                problems.push(Problem::new(
                    "spec.scaling.replicas",
                    "missing: `policy: fixed` runs exactly `replicas` workers; set e.g. `replicas: 4`, \
                     or use `policy: auto`",
                ));
            }
            for (value, name) in [(scaling.min_workers, "minWorkers"), (scaling.max_workers, "maxWorkers")] {
                if value.is_some() {
                    problems.push(Problem::new(
                        format!("spec.scaling.{name}"),
                        "applies only to `policy: auto`; remove it, or use `policy: auto` instead of `replicas`",
                    ));
                }
            }
        }
        ScalingPolicy::Auto => {
            if scaling.replicas.is_some() {
                problems.push(Problem::new(
                    "spec.scaling.replicas",
                    "applies only to `policy: fixed`; set `policy: fixed`, or bound the autoscaler with \
                     `minWorkers`/`maxWorkers` instead",
                ));
            }
            let min = scaling.min_workers.unwrap_or(1);
            let max = scaling.max_workers.unwrap_or(16);
            if min > max {
                let (path, which) = if scaling.max_workers.is_some() {
                    ("spec.scaling.minWorkers", format!("maxWorkers ({max})"))
                } else {
                    ("spec.scaling.minWorkers", format!("the default maxWorkers ({max}); set `maxWorkers`"))
                };
                problems.push(Problem::new(
                    path,
                    format!("is {min}, more than {which}; minWorkers must be <= maxWorkers"),
                ));
            }
        }
    }
    for (value, name) in [(scaling.replicas, "replicas"), (scaling.max_workers, "maxWorkers")] {
        if value == Some(0) {
            let fix = if name == "replicas" {
                "; for a pool that goes to zero when idle, use `policy: auto` with `minWorkers: 0`"
            } else {
                ""
            };
            problems.push(Problem::new(format!("spec.scaling.{name}"), format!("must be >= 1{fix}")));
        }
    }
    if let Some(idle) = &scaling.idle_after {
        match crate::parse_duration(idle) {
            Err(why) => problems.push(Problem::new("spec.scaling.idleAfter", why)),
            Ok(d) if d.is_zero() => problems.push(Problem::new(
                "spec.scaling.idleAfter",
                "must be longer than 0, e.g. `5m`: trainers between epochs would see the pool vanish",
            )),
            Ok(_) if scaling.policy != ScalingPolicy::Auto || scaling.min_workers != Some(0) => problems
                .push(Problem::new(
                    "spec.scaling.idleAfter",
                    "applies only with `policy: auto` and `minWorkers: 0`; set `minWorkers: 0`, or remove it",
                )),
            Ok(_) => {}
        }
    }
    for (value, name) in [
        (scaling.worker_cost_per_hour, "workerCostPerHour"),
        (scaling.trainer_cost_per_hour, "trainerCostPerHour"),
    ] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            problems.push(Problem::new(
                format!("spec.scaling.{name}"),
                format!("must be a finite number >= 0 (dollars per hour), got {v}"),
            ));
        }
    }
}

fn check_cache(cache: &CacheSpec, stages: &[StageSpec], problems: &mut Vec<Problem>) {
    match (cache.policy, &cache.at) {
        (CachePolicy::At, None) => problems.push(Problem::new(
            "spec.cache.at",
            "missing: `policy: at` caches the output of the stage named by `at`; name a stage of the \
             deterministic prefix, or use `policy: auto`",
        )),
        (CachePolicy::At, Some(at)) => check_cache_at(at, stages, problems),
        (_, Some(_)) => problems.push(Problem::new(
            "spec.cache.at",
            "applies only to `policy: at`; set `policy: at` or remove `at`",
        )),
        (_, None) => {}
    }
    match (&cache.store, cache.policy) {
        (Some(store), _) => check_url(store, "spec.cache.store", problems),
        (None, CachePolicy::Never) => {}
        (None, _) => problems.push(Problem::new(
            "spec.cache.store",
            "missing: every cache policy but `never` needs an object-store URL for the entries, e.g. \
             s3://bucket/granary-cache/ or file:///var/cache/granary/",
        )),
    }
    if let Some(max) = &cache.max_bytes {
        match max.bytes() {
            Ok(0) => problems
                .push(Problem::new("spec.cache.maxBytes", format!("must be > 0; expected {BYTES_FORM}"))),
            Ok(_) => {}
            Err(why) => problems.push(Problem::new("spec.cache.maxBytes", why)),
        }
    }
    if let Some(ttl) = &cache.ttl {
        match parse_duration(ttl) {
            Ok(d) if d.is_zero() => problems
                .push(Problem::new("spec.cache.ttl", format!("must be > 0; expected {DURATION_FORM}"))),
            Ok(_) => {}
            Err(why) => problems.push(Problem::new("spec.cache.ttl", why)),
        }
    }
}

/// Index of the first stage outside the deterministic prefix (`stages.len()` when all are
/// deterministic). Unknown operators end the prefix, and so does the first stage that changes
/// the element count (a filter, packing): a cache entry holds one split's elements as the
/// listing counts them.
pub fn deterministic_prefix_len(stages: &[StageSpec]) -> usize {
    stages
        .iter()
        .position(|s| !op_info(&s.op).is_some_and(|i| i.deterministic_for(s) && i.count == Count::Same))
        .unwrap_or(stages.len())
}

/// Whether every split's output count is its listed element count: true when every stage gives
/// one element for each it takes. Otherwise the counts are learnt as splits are computed.
pub fn counts_known(stages: &[StageSpec]) -> bool {
    stages.iter().all(|s| op_info(&s.op).is_none_or(|i| i.count == Count::Same))
}

/// Whether every split of `spec` yields its listed element count: [`counts_known`] of its
/// stages, unless elements a stage fails on are skipped (`spec.errors.policy: skip`), which makes
/// a split's count known only once it is computed, as a filter does.
pub fn spec_counts_known(spec: &InputPipelineSpec) -> bool {
    counts_known(&spec.stages) && !spec.skips_elements()
}

fn check_cache_at(at: &str, stages: &[StageSpec], problems: &mut Vec<Problem>) {
    let prefix = deterministic_prefix_len(stages);
    let names_in_prefix: Vec<String> =
        stages[..prefix].iter().map(|s| format!("`{}`", s.display_name())).collect();
    let choices = if names_in_prefix.is_empty() {
        "no stage is deterministic before the first random one, so nothing can be cached; use `policy: never`"
            .to_string()
    } else {
        format!("stages that can be cached: {}", names_in_prefix.join(", "))
    };
    let matches: Vec<usize> = (0..stages.len()).filter(|i| stages[*i].display_name() == at).collect();
    match matches.as_slice() {
        [] => {
            let hint = stages
                .iter()
                .map(|s| s.display_name())
                .find(|n| edit_distance(n, at) <= 2)
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            problems.push(Problem::new(
                "spec.cache.at",
                format!(
                    "no stage is named `{at}`{hint} (a stage without `name` goes by its `op`); {choices}"
                ),
            ));
        }
        [j] => {
            if *j >= prefix {
                let random = &stages[prefix];
                problems.push(Problem::new(
                    "spec.cache.at",
                    format!(
                        "stage `{at}` (spec.stages[{j}]) is not in the deterministic prefix: spec.stages[{prefix}] \
                         (`{}`) {}; {choices}",
                        random.op,
                        match op_info(&random.op) {
                            None => {
                                "is not a known operator, so its output and everything after it differ between \
                                 epochs"
                            }
                            Some(info) if info.count != Count::Same => {
                                "changes the element count, and a cache entry holds every element of its split \
                                 as listed"
                            }
                            Some(_) => "is random, so its output and everything after it differ between epochs",
                        },
                    ),
                ));
            }
        }
        many => {
            let list: Vec<String> = many.iter().map(|i| format!("spec.stages[{i}]")).collect();
            problems.push(Problem::new(
                "spec.cache.at",
                format!(
                    "`{at}` names {} stages ({}); give the one to cache a unique `name`",
                    many.len(),
                    list.join(", ")
                ),
            ));
        }
    }
}
