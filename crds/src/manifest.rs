//! Reading an `InputPipeline` manifest from YAML.
//!
//! [`parse_manifest`] reports every problem it can find in one pass, each named by its field path
//! (`spec.stages[2].size`) or, for YAML syntax errors, by its place (`line 3, column 5`):
//! syntax, `--set` overrides, `apiVersion`/`kind`/`metadata`, unknown fields anywhere outside the
//! stages, type errors, missing required fields, and finally everything [`validate`] finds.

use crate::fieldpath::{Seg, format_path, parse_path};
use crate::object_url::has_scheme;
use crate::suggest::{backticked, did_you_mean};
use crate::{InputPipeline, InputPipelineSpec, Problem, Problems, validate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Map, Value as Json};
use serde_norway::Value as Yaml;
use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

/// The `apiVersion` of an `InputPipeline`.
pub const API_VERSION: &str = "granary.dev/v1alpha1";
/// The `kind` of an `InputPipeline`.
pub const KIND: &str = "InputPipeline";

/// A parsed, validated manifest and the folder relative paths resolve from.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The resource.
    pub pipeline: InputPipeline,
    /// Folder of the manifest file.
    pub base_dir: PathBuf,
}

/// Reads, parses and validates the manifest at `path`. Relative `file:` URLs resolve from the
/// file's folder. An unreadable file is one problem whose path is the file's path.
pub fn load_manifest(path: &Path, overrides: &[String]) -> Result<Manifest, Problems> {
    let text = crate::read::read_manifest_text(path).map_err(|p| Problems(vec![p]))?;
    parse_manifest(&text, &base_dir_of(path), overrides)
}

/// The folder relative paths in the manifest at `path` resolve from: its parent folder, made
/// absolute (against the current directory when relative).
pub fn base_dir_of(path: &Path) -> PathBuf {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    absolute(parent)
}

/// Parses and validates manifest text. `base_dir` is the folder relative `file:` URLs resolve
/// from; `overrides` are `FIELD=VALUE` settings (`spec.batch.size=64`,
/// `spec.stages[1].size=160`) applied before validation, VALUE read as YAML.
pub fn parse_manifest(text: &str, base_dir: &Path, overrides: &[String]) -> Result<Manifest, Problems> {
    let base_dir = absolute(base_dir);
    let mut yaml = parse_yaml(text).map_err(|p| Problems(vec![p]))?;
    if let Err(e) = yaml.apply_merge() {
        return Err(Problems(vec![yaml_problem(&e)]));
    }

    let mut problems = Vec::new();
    for o in overrides {
        if let Err(p) = apply_override(&mut yaml, o) {
            problems.push(p);
        }
    }

    let mut order = Vec::new();
    let json = yaml_to_json(&yaml, &mut Vec::new(), &mut order, &mut problems);

    let result = check_document(&json, &base_dir, &mut problems);
    match result {
        Some(pipeline) if problems.is_empty() => Ok(Manifest { pipeline, base_dir }),
        _ => {
            sort_problems(&mut problems, &order);
            if problems.is_empty() {
                // Unreachable in practice: every failure above records a problem.
                problems.push(Problem::new("spec", "could not be read"));
            }
            Err(Problems(problems))
        }
    }
}

/// Resolves a relative `file:` URL (`file:data/train/`, `file:../x`) or a bare path
/// (`data/train/`, `/data/train/`) against `base_dir` into an absolute `file:///...` URL, keeping
/// a trailing slash. Any other text (a URL with a scheme, `file:///...`, an empty string) is
/// returned unchanged.
pub fn resolve_url(text: &str, base_dir: &Path) -> String {
    let rest = if let Some(rest) = text.strip_prefix("file:") {
        if rest.starts_with("//") {
            return text.to_string();
        }
        rest
    } else if text.is_empty()
        || text.starts_with("//")
        || has_scheme(text)
        || text.contains(char::is_whitespace)
    {
        return text.to_string();
    } else {
        text
    };
    let joined = if rest.starts_with('/') { PathBuf::from(rest) } else { base_dir.join(rest) };
    let normalized = normalize(&joined);
    let Ok(url) = url::Url::from_file_path(&normalized) else {
        return text.to_string();
    };
    let mut out = url.to_string();
    if (rest.ends_with('/') || rest.is_empty() || rest.ends_with("/.") || rest == ".") && !out.ends_with('/')
    {
        out.push('/');
    }
    out
}

fn absolute(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    normalize(&abs)
}

/// Removes `.` and `..` components lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// YAML text → one YAML value

/// Parses exactly one YAML document.
fn parse_yaml(text: &str) -> Result<Yaml, Problem> {
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = Yaml::deserialize(document).map_err(|e| yaml_problem(&e))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    match documents.len() {
        0 => Err(Problem::new(
            "line 1",
            format!(
                "the manifest is empty; expected an `{KIND}` resource (apiVersion, kind, metadata, spec)"
            ),
        )),
        1 => Ok(documents.remove(0)),
        n => Err(Problem::new(
            format!("line {}", second_document_line(text)),
            format!("the file holds {n} YAML documents; put exactly one `{KIND}` in each manifest file"),
        )),
    }
}

/// The line of the `---` separator that starts the second non-empty document.
fn second_document_line(text: &str) -> usize {
    let mut seen_content = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if line.starts_with("---") {
            if seen_content {
                return i + 1;
            }
        } else if !trimmed.is_empty() && !trimmed.starts_with('#') && !line.starts_with("...") {
            seen_content = true;
        }
    }
    1
}

/// A YAML error as a problem at `line L, column C` with the parser's message.
fn yaml_problem(e: &serde_norway::Error) -> Problem {
    let mut message = e.to_string();
    match e.location() {
        Some(loc) => {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            if let Some(at) = message.find(&suffix) {
                message.replace_range(at..at + suffix.len(), "");
            }
            let hint = if text_has_tab_problem(&message) {
                "; indent with spaces, YAML does not allow tabs"
            } else {
                ""
            };
            Problem::new(format!("line {}, column {}", loc.line(), loc.column()), format!("{message}{hint}"))
        }
        None => Problem::new("line 1", message),
    }
}

fn text_has_tab_problem(message: &str) -> bool {
    message.contains("tab") || message.contains("cannot start any token")
}

// ---------------------------------------------------------------------------------------------
// --set FIELD=VALUE

fn apply_override(yaml: &mut Yaml, text: &str) -> Result<(), Problem> {
    let Some((field, value_text)) = text.split_once('=') else {
        return Err(Problem::new(
            format!("--set {text}"),
            "expected FIELD=VALUE, e.g. `spec.batch.size=64` or `spec.stages[1].size=160`",
        ));
    };
    let field = field.trim();
    let at = || format!("--set {field}");
    let path = parse_path(field).ok_or_else(|| {
        Problem::new(
            at(),
            format!(
                "`{field}` is not a field path; write dotted names with optional indices, \
                 e.g. `spec.batch.size` or `spec.stages[1].size`"
            ),
        )
    })?;
    let value: Yaml = serde_norway::from_str(value_text).map_err(|e| {
        Problem::new(
            at(),
            format!("`{value_text}` is not a YAML value ({e}); quote it to pass it as a string"),
        )
    })?;
    let mut node = yaml;
    for (i, seg) in path.iter().enumerate() {
        let last = i + 1 == path.len();
        let here = format_path(&path[..i]);
        match seg {
            Seg::Key(key) => {
                if node.is_null() {
                    *node = Yaml::Mapping(serde_norway::Mapping::new());
                }
                let Yaml::Mapping(map) = node else {
                    return Err(Problem::new(
                        at(),
                        format!("`{here}` is {}, not a mapping, so it has no field `{key}`", kind_of(node)),
                    ));
                };
                let key_value = Yaml::String(key.clone());
                if last {
                    map.insert(key_value, value);
                    return Ok(());
                }
                if !map.contains_key(&key_value) {
                    map.insert(key_value.clone(), Yaml::Null);
                }
                match map.get_mut(&key_value) {
                    Some(next) => node = next,
                    None => return Err(Problem::new(at(), format!("cannot set `{field}`"))),
                }
            }
            Seg::Index(index) => {
                let Yaml::Sequence(items) = node else {
                    return Err(Problem::new(
                        at(),
                        format!("`{here}` is {}, not a list, so it has no item [{index}]", kind_of(node)),
                    ));
                };
                let len = items.len();
                let Some(item) = items.get_mut(*index) else {
                    let range = if len == 0 {
                        "it is empty".to_string()
                    } else {
                        format!("it has {len} item{} (indices 0 to {})", plural(len), len - 1)
                    };
                    return Err(Problem::new(
                        at(),
                        format!("index {index} is out of range for `{here}`: {range}"),
                    ));
                };
                if last {
                    *item = value;
                    return Ok(());
                }
                node = item;
            }
        }
    }
    Ok(())
}

fn kind_of(value: &Yaml) -> &'static str {
    match value {
        Yaml::Null => "null",
        Yaml::Bool(_) => "a boolean",
        Yaml::Number(_) => "a number",
        Yaml::String(_) => "a string",
        Yaml::Sequence(_) => "a list",
        Yaml::Mapping(_) => "a mapping",
        Yaml::Tagged(_) => "a tagged value",
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

// ---------------------------------------------------------------------------------------------
// YAML value → JSON value, remembering document order

fn yaml_to_json(
    yaml: &Yaml,
    path: &mut Vec<Seg>,
    order: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> Json {
    order.push(format_path(path));
    match yaml {
        Yaml::Null => Json::Null,
        Yaml::Bool(b) => Json::Bool(*b),
        Yaml::Number(n) => {
            if let Some(u) = n.as_u64() {
                Json::from(u)
            } else if let Some(i) = n.as_i64() {
                Json::from(i)
            } else if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                Json::Number(f)
            } else {
                problems.push(Problem::new(
                    format_path(path),
                    format!("`{n}` is not a finite number; write a finite number such as 0.5"),
                ));
                Json::Null
            }
        }
        Yaml::String(s) => Json::String(s.clone()),
        Yaml::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                out.push(yaml_to_json(item, path, order, problems));
                path.pop();
            }
            Json::Array(out)
        }
        Yaml::Mapping(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Bool(b) => b.to_string(),
                    Yaml::Number(n) => n.to_string(),
                    other => {
                        problems.push(Problem::new(
                            format_path(path),
                            format!("has a key that is {}; keys must be plain names", kind_of(other)),
                        ));
                        continue;
                    }
                };
                path.push(Seg::Key(key.clone()));
                let value = yaml_to_json(value, path, order, problems);
                path.pop();
                out.insert(key, value);
            }
            Json::Object(out)
        }
        Yaml::Tagged(tagged) => {
            problems.push(Problem::new(
                format_path(path),
                format!("YAML tag `{}` is not supported; remove it", tagged.tag),
            ));
            yaml_to_json(&tagged.value, path, order, problems)
        }
    }
}

/// Sorts problems into document order: `--set` problems first, then YAML positions by line, then
/// field paths by where their field (or its closest written ancestor) appears in the manifest.
fn sort_problems(problems: &mut [Problem], order: &[String]) {
    let index: HashMap<&str, usize> = order.iter().enumerate().rev().map(|(i, p)| (p.as_str(), i)).collect();
    let key = |p: &Problem| -> (u8, usize) {
        if p.path.starts_with("--set") {
            return (0, 0);
        }
        if let Some(rest) = p.path.strip_prefix("line ") {
            let line = rest.split(',').next().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
            return (1, line);
        }
        let mut path = p.path.as_str();
        loop {
            if let Some(i) = index.get(path) {
                return (2, *i);
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path = &path[..cut],
                None => return (2, 0),
            }
        }
    };
    problems.sort_by_key(key);
}

// ---------------------------------------------------------------------------------------------
// The resource: apiVersion, kind, metadata, spec

fn check_document(json: &Json, base_dir: &Path, problems: &mut Vec<Problem>) -> Option<InputPipeline> {
    let Json::Object(top) = json else {
        problems.push(Problem::new(
            "line 1",
            format!(
                "the manifest must be a mapping with apiVersion, kind, metadata and spec; found {}",
                json_kind(json)
            ),
        ));
        return None;
    };

    match top.get("apiVersion") {
        None => {
            problems.push(Problem::new("apiVersion", format!("missing; set `apiVersion: {API_VERSION}`")))
        }
        Some(Json::String(v)) if v == API_VERSION => {}
        Some(Json::String(v)) if v.starts_with("granary.dev/") => problems.push(Problem::new(
            "apiVersion",
            format!("version `{v}` is not served; this Granary reads `{API_VERSION}`"),
        )),
        Some(v) => problems.push(Problem::new(
            "apiVersion",
            format!("is {}; an `{KIND}` has `apiVersion: {API_VERSION}`", describe(v)),
        )),
    }
    match top.get("kind") {
        None => problems.push(Problem::new("kind", format!("missing; set `kind: {KIND}`"))),
        Some(Json::String(v)) if v == KIND => {}
        Some(v) => problems.push(Problem::new(
            "kind",
            format!("is {}; Granary reads `kind: {KIND}` (the name is case-sensitive)", describe(v)),
        )),
    }
    for key in top.keys() {
        if !["apiVersion", "kind", "metadata", "spec", "status"].contains(&key.as_str()) {
            problems
                .push(unknown_field(&[Seg::Key(key.clone())], &["apiVersion", "kind", "metadata", "spec"]));
        }
    }

    let metadata = check_metadata(top.get("metadata"), problems);
    let spec = match top.get("spec") {
        None => {
            problems.push(Problem::new(
                "spec",
                "missing; an InputPipeline needs a `spec` with `source`, `stages` and `batch`",
            ));
            None
        }
        Some(value) => decode_spec(value, base_dir, problems),
    };
    Some(InputPipeline { metadata: metadata?, spec: spec?, status: None })
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

fn describe(v: &Json) -> String {
    match v {
        Json::String(s) => format!("`{s}`"),
        other => json_kind(other).to_string(),
    }
}

fn check_metadata(value: Option<&Json>, problems: &mut Vec<Problem>) -> Option<ObjectMeta> {
    let Some(value) = value else {
        problems.push(Problem::new(
            "metadata",
            "missing; set `metadata: {name: NAME}` with a lowercase name such as `imagenet-train`",
        ));
        return None;
    };
    let mut unknown = Vec::new();
    let result: Result<ObjectMeta, _> = {
        let mut record = |p: serde_ignored::Path<'_>| unknown.push(segs_of_ignored(&p));
        let de = serde_ignored::Deserializer::new(value, &mut record);
        serde_path_to_error::deserialize(de)
    };
    let meta = match result {
        Ok(meta) => meta,
        Err(e) => {
            let mut path = vec![Seg::Key("metadata".into())];
            path.extend(segs_of_error(e.path()));
            problems.push(Problem::new(format_path(&path), e.inner().to_string()));
            return None;
        }
    };
    for u in unknown {
        let mut path = vec![Seg::Key("metadata".into())];
        path.extend(u);
        problems.push(Problem::new(
            format_path(&path),
            "unknown field of Kubernetes object metadata; remove it (known ones include `name`, \
             `namespace`, `labels`, `annotations`)",
        ));
    }
    let before = problems.len();
    match meta.name.as_deref() {
        None => problems.push(Problem::new(
            "metadata.name",
            "missing; every InputPipeline needs a name, e.g. `name: imagenet-train` \
             (lowercase letters, digits, `-` and `.`)",
        )),
        Some(name) => {
            if let Err(why) = check_dns_subdomain(name) {
                problems.push(Problem::new("metadata.name", format!("`{name}` is not a valid name: {why}")));
            }
        }
    }
    if let Some(ns) = meta.namespace.as_deref()
        && let Err(why) = check_dns_label(ns)
    {
        problems.push(Problem::new("metadata.namespace", format!("`{ns}` is not a valid namespace: {why}")));
    }
    (problems.len() == before).then_some(meta)
}

/// Checks an RFC 1123 DNS subdomain: at most 253 characters of lowercase letters, digits, `-`
/// and `.`, each dot-separated part starting and ending with a letter or digit.
pub fn check_dns_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > 253 {
        return Err(format!("it has {} characters; the limit is 253", name.len()));
    }
    if let Some(c) =
        name.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        let suggestion: String = name
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c == '_' || c == ' ' { '-' } else { c })
            .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.')
            .collect();
        let hint = if suggestion != name && check_dns_subdomain(&suggestion).is_ok() {
            format!("; try `{suggestion}`")
        } else {
            String::new()
        };
        return Err(format!("it contains `{c}`; use only lowercase letters, digits, `-` and `.`{hint}"));
    }
    for part in name.split('.') {
        let ok = part.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && part.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok {
            return Err(
                "it must start and end with a letter or digit, and so must each part between dots".into()
            );
        }
    }
    Ok(())
}

/// Checks an RFC 1123 DNS label (a namespace): at most 63 lowercase letters, digits and `-`,
/// starting and ending with a letter or digit.
pub fn check_dns_label(name: &str) -> Result<(), String> {
    if name.contains('.') {
        return Err("it contains `.`; use only lowercase letters, digits and `-`".into());
    }
    if name.len() > 63 {
        return Err(format!("it has {} characters; the limit is 63", name.len()));
    }
    check_dns_subdomain(name)
}

// ---------------------------------------------------------------------------------------------
// spec: typed decoding that reports every unknown field, type error and missing field

/// The structural schema of `spec`, from the CRD: field names, required fields, descriptions.
static SPEC_SCHEMA: LazyLock<Json> = LazyLock::new(|| {
    use kube::CustomResourceExt;
    let crd = InputPipeline::crd();
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|s| s.pointer("/properties/spec").cloned())
        .unwrap_or(Json::Null)
});

/// The schema of the field at `path` (relative to `spec`).
fn schema_at(path: &[Seg]) -> Option<&'static Json> {
    let mut schema: &Json = &SPEC_SCHEMA;
    for seg in path {
        schema = match seg {
            Seg::Key(k) => schema.get("properties")?.get(k)?,
            Seg::Index(_) => schema.get("items")?,
        };
    }
    Some(schema)
}

fn is_required(path: &[Seg]) -> bool {
    let Some((Seg::Key(last), parent)) = path.split_last() else { return true };
    schema_at(parent)
        .and_then(|s| s.get("required"))
        .and_then(Json::as_array)
        .is_some_and(|r| r.iter().any(|v| v.as_str() == Some(last)))
}

/// A minimal value that the schema accepts, standing in for a broken or missing one so that
/// decoding can go on and find the next problem.
fn placeholder(schema: Option<&Json>) -> Json {
    let Some(schema) = schema else { return Json::Null };
    if schema.get("x-kubernetes-int-or-string").is_some() {
        return Json::from(0);
    }
    match schema.get("type").and_then(Json::as_str) {
        Some("object") => {
            let mut out = Map::new();
            for name in schema.get("required").and_then(Json::as_array).into_iter().flatten() {
                if let Some(name) = name.as_str() {
                    let sub = schema.get("properties").and_then(|p| p.get(name));
                    out.insert(name.to_string(), placeholder(sub));
                }
            }
            Json::Object(out)
        }
        Some("array") => Json::Array(Vec::new()),
        Some("string") => schema
            .get("enum")
            .and_then(Json::as_array)
            .and_then(|e| e.first())
            .cloned()
            .unwrap_or_else(|| Json::String(String::new())),
        Some("integer") => {
            Json::from(schema.get("minimum").and_then(Json::as_f64).unwrap_or(0.0).max(0.0) as u64)
        }
        Some("number") => Json::from(schema.get("minimum").and_then(Json::as_f64).unwrap_or(0.0)),
        Some("boolean") => Json::Bool(false),
        _ => Json::Null,
    }
}

/// The first sentence of a field's description, for messages.
fn short_description(path: &[Seg]) -> Option<String> {
    let text = schema_at(path)?.get("description")?.as_str()?;
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut end = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find(". ") {
        let at = from + i;
        if !(text[..at].ends_with("e.g") || text[..at].ends_with("i.e")) {
            end = at + 1;
            break;
        }
        from = at + 2;
    }
    Some(text[..end].to_string())
}

fn spec_path(path: &[Seg]) -> String {
    let mut full = vec![Seg::Key("spec".into())];
    full.extend_from_slice(path);
    format_path(&full)
}

fn unknown_field(full_path: &[Seg], known: &[&str]) -> Problem {
    let name = match full_path.last() {
        Some(Seg::Key(k)) => k.clone(),
        Some(Seg::Index(i)) => format!("[{i}]"),
        None => String::new(),
    };
    let mut message = format!("unknown field `{name}`{}", did_you_mean(&name, known));
    if known.is_empty() {
        message.push_str("; remove it");
    } else {
        message.push_str(&format!("; expected one of {}", backticked(known)));
    }
    Problem::new(format_path(full_path), message)
}

fn segs_of_ignored(path: &serde_ignored::Path<'_>) -> Vec<Seg> {
    match path {
        serde_ignored::Path::Root => Vec::new(),
        serde_ignored::Path::Seq { parent, index } => {
            let mut v = segs_of_ignored(parent);
            v.push(Seg::Index(*index));
            v
        }
        serde_ignored::Path::Map { parent, key } => {
            let mut v = segs_of_ignored(parent);
            v.push(Seg::Key(key.clone()));
            v
        }
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => segs_of_ignored(parent),
    }
}

fn segs_of_error(path: &serde_path_to_error::Path) -> Vec<Seg> {
    let mut out = Vec::new();
    for seg in path.iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => out.push(Seg::Index(*index)),
            serde_path_to_error::Segment::Map { key } => out.push(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Enum { variant } => out.push(Seg::Key(variant.clone())),
            serde_path_to_error::Segment::Unknown => break,
        }
    }
    out
}

fn starts_with(path: &[Seg], prefix: &[Seg]) -> bool {
    path.len() >= prefix.len() && path[..prefix.len()] == *prefix
}

/// `missing field `x`` → `x`.
fn missing_field_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

fn get_mut<'a>(value: &'a mut Json, path: &[Seg]) -> Option<&'a mut Json> {
    let mut node = value;
    for seg in path {
        node = match seg {
            Seg::Key(k) => node.as_object_mut()?.get_mut(k)?,
            Seg::Index(i) => node.as_array_mut()?.get_mut(*i)?,
        };
    }
    Some(node)
}

/// Sets (or, with `None`, removes) the value at `path`; false when the path does not exist.
fn replace(value: &mut Json, path: &[Seg], with: Option<Json>) -> bool {
    let Some((last, parent)) = path.split_last() else { return false };
    let Some(parent) = get_mut(value, parent) else { return false };
    match (last, parent, with) {
        (Seg::Key(k), Json::Object(map), Some(v)) => {
            map.insert(k.clone(), v);
            true
        }
        (Seg::Key(k), Json::Object(map), None) => map.remove(k).is_some(),
        (Seg::Index(i), Json::Array(items), with) => match items.get_mut(*i) {
            Some(slot) => {
                *slot = with.unwrap_or(Json::Null);
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// A clearer wording of some serde messages.
fn explain(path: &[Seg], message: String) -> String {
    if message.contains("untagged enum ByteSize") {
        return format!("must be a byte count: {}", crate::quantity::BYTES_FORM);
    }
    if path == [Seg::Key("cache".into()), Seg::Key("ttl".into())] && message.starts_with("invalid type") {
        return format!("{message}; write a duration: {}", crate::quantity::DURATION_FORM);
    }
    if message.contains("expected struct StageSpec") {
        return format!(
            "{message}: a stage is a mapping with `op` and the operator's fields, e.g. `- op: image.decode` \
             or `- {{op: image.resize, size: 256}}`"
        );
    }
    if message.starts_with("invalid value: integer `-") {
        return format!("{message}: it cannot be negative");
    }
    if let Some(name) = message.strip_prefix("invalid type: null, expected ") {
        return format!("is empty (null); expected {name}: give it a value or remove the line");
    }
    message
}

/// Finds lists where the schema wants a mapping (serde would read a list into a struct by
/// position, silently): each is a problem, and is replaced by a placeholder.
fn lists_for_mappings(
    value: &Json,
    schema: Option<&Json>,
    path: &mut Vec<Seg>,
    found: &mut Vec<(Vec<Seg>, Problem)>,
) {
    let Some(schema) = schema else { return };
    match value {
        Json::Array(items) => {
            if schema.get("type").and_then(Json::as_str) == Some("object") {
                let fields = schema
                    .get("required")
                    .and_then(Json::as_array)
                    .map(|r| r.iter().filter_map(Json::as_str).map(|f| format!("`{f}`")).collect::<Vec<_>>())
                    .unwrap_or_default();
                let with =
                    if fields.is_empty() { String::new() } else { format!(" with {}", fields.join(", ")) };
                found.push((
                    path.clone(),
                    Problem::new(spec_path(path), format!("must be a mapping{with}, not a list")),
                ));
                return;
            }
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                lists_for_mappings(item, schema.get("items"), path, found);
                path.pop();
            }
        }
        Json::Object(map) => {
            for (key, item) in map {
                path.push(Seg::Key(key.clone()));
                lists_for_mappings(item, schema.get("properties").and_then(|p| p.get(key)), path, found);
                path.pop();
            }
        }
        _ => {}
    }
}

fn decode_spec(value: &Json, base_dir: &Path, problems: &mut Vec<Problem>) -> Option<InputPipelineSpec> {
    if !value.is_object() {
        problems.push(Problem::new(
            "spec",
            format!("must be a mapping with `source`, `stages` and `batch`; found {}", json_kind(value)),
        ));
        return None;
    }
    let mut work = value.clone();
    // Paths (under `spec`) replaced by placeholders: problems under them are consequences.
    let mut tainted: Vec<Vec<Seg>> = Vec::new();
    let mut lists = Vec::new();
    lists_for_mappings(value, Some(&SPEC_SCHEMA), &mut Vec::new(), &mut lists);
    for (path, problem) in lists {
        problems.push(problem);
        replace(&mut work, &path, Some(placeholder(schema_at(&path))));
        tainted.push(path);
    }
    let mut seen: HashSet<(Vec<Seg>, String)> = HashSet::new();
    let mut clean = tainted.is_empty();
    let mut decoded = None;
    for _ in 0..256 {
        let mut unknown = Vec::new();
        let result: Result<InputPipelineSpec, _> = {
            let mut record = |p: serde_ignored::Path<'_>| unknown.push(segs_of_ignored(&p));
            let de = serde_ignored::Deserializer::new(&work, &mut record);
            serde_path_to_error::deserialize(de)
        };
        match result {
            Ok(spec) => {
                for u in unknown {
                    let known: Vec<&str> = u
                        .split_last()
                        .and_then(|(_, parent)| schema_at(parent))
                        .and_then(|s| s.get("properties"))
                        .and_then(Json::as_object)
                        .map(|m| m.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    let mut full = vec![Seg::Key("spec".into())];
                    full.extend(u);
                    problems.push(unknown_field(&full, &known));
                    clean = false;
                }
                decoded = Some(spec);
                break;
            }
            Err(e) => {
                clean = false;
                let at = segs_of_error(e.path());
                let message = e.inner().to_string();
                if !seen.insert((at.clone(), message.clone())) {
                    break;
                }
                let (field, fix) = match missing_field_name(&message) {
                    Some(name) => {
                        let mut field = at.clone();
                        field.push(Seg::Key(name.clone()));
                        let what = short_description(&field)
                            .map(|d| format!(" — {}", d.trim_end_matches('.')))
                            .unwrap_or_default();
                        let problem =
                            Problem::new(spec_path(&field), format!("missing required field `{name}`{what}"));
                        (field.clone(), (problem, Some(placeholder(schema_at(&field)))))
                    }
                    None => {
                        let problem = Problem::new(spec_path(&at), explain(&at, message));
                        let with = if is_required(&at) { Some(placeholder(schema_at(&at))) } else { None };
                        (at.clone(), (problem, with))
                    }
                };
                let (problem, with) = fix;
                if !tainted.iter().any(|t| starts_with(&field, t)) {
                    problems.push(problem);
                }
                if field.is_empty() || !replace(&mut work, &field, with) {
                    break;
                }
                tainted.push(field);
            }
        }
    }
    let mut spec = decoded?;
    if let Some(source) = spec.source.as_mut() {
        source.url = resolve_url(&source.url, base_dir);
    }
    for mixed in &mut spec.sources {
        mixed.source.url = resolve_url(&mixed.source.url, base_dir);
    }
    if let Some(cache) = spec.cache.as_mut()
        && let Some(store) = cache.store.as_mut()
    {
        *store = resolve_url(store, base_dir);
    }
    // Validation problems that may follow from a placeholder: under a replaced field, under the
    // object that holds a replaced field (its other fields may be checked against it), or naming a
    // replaced field in the message.
    let mut under: Vec<String> = Vec::new();
    let mut named: Vec<String> = Vec::new();
    for t in &tainted {
        under.push(spec_path(t));
        named.push(spec_path(t));
        if t.len() >= 2 && matches!(t.last(), Some(Seg::Key(_))) {
            under.push(spec_path(&t[..t.len() - 1]));
        }
    }
    let within = |path: &str, prefix: &str| {
        path == prefix || path.strip_prefix(prefix).is_some_and(|r| r.starts_with(['.', '[']))
    };
    for p in validate(&spec) {
        let consequence = under.iter().any(|t| within(&p.path, t))
            || named.iter().any(|t| {
                p.message.match_indices(t.as_str()).any(|(i, _)| {
                    !p.message[i + t.len()..]
                        .starts_with(|c: char| c.is_alphanumeric() || c == '[' || c == '.')
                })
            });
        if !consequence {
            problems.push(p);
            clean = false;
        }
    }
    clean.then_some(spec)
}
