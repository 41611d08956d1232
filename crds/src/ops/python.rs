//! User code: stages that call a Python function the user wrote, to transform elements
//! (`python.map`) or to keep or drop them (`python.filter`).

use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `python.map`: calls a Python function on every element (or on groups of elements) and keeps
/// what it returns.
///
/// The function is `fn(element, **args)` where `element` is a dict of field name → value:
/// NumPy arrays for tensors (a decoded image is height × width × 3 `uint8`), `str` for text,
/// `bytes` for bytes, NumPy scalars for scalars. It returns a dict, the element's new fields:
/// it may add, replace or drop fields. A function that takes a parameter `rng` gets a
/// `numpy.random.Generator` seeded from (seed, epoch, split, element), so a recomputed split gives
/// the same output; one that takes `key` gets the element's key.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PythonMap {
    /// The function, as `package.module:name`, importable in the workers' Python environment.
    /// The manifest's folder is importable, so `augment:jitter` finds `augment.py` beside it.
    pub function: String,
    /// `false` (default) passes one element at a time; `true` passes up to `spec.batch.size`
    /// elements at once, each field stacked along a new leading axis (lists for text and bytes),
    /// and expects the same back.
    #[serde(default)]
    pub batched: bool,
    /// Keyword arguments for the function, as JSON values.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schemars(with = "std::collections::BTreeMap<String, serde_json::Value>")]
    pub args: serde_json::Map<String, serde_json::Value>,
    /// `true` declares that the output depends only on the input (no `rng`, no clock, no state),
    /// which lets the cache hold this stage's output. Default `false`. A batched function must
    /// also compute each element's output from that element alone.
    #[serde(default)]
    pub deterministic: bool,
    /// The fields the function reads, when it declares them. With `writes` also given, the
    /// optimizer may move other stages across this one (a filter that tests none of `writes`
    /// runs before it) and reads only the fields the pipeline uses. Unset: the function may read
    /// any field, and nothing moves across it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<Vec<String>>,
    /// The fields the function adds, replaces or drops, when it declares them (see `reads`).
    /// The worker checks the declaration where it can: a field the function adds or drops that
    /// is not in `writes` fails the element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<Vec<String>>,
}

/// `python.filter`: calls a Python function on every element (or on groups of elements) and
/// keeps the elements for which it returns a truthy value; the stages after it do not see the
/// others.
///
/// The function is `fn(element, **args)`, called as `python.map` calls its function (a dict of
/// field name → value; `rng` and `key` when it takes them), and returns a truthy value to keep
/// the element; batched, it returns one boolean per element of the group (a sequence or a 1-D
/// array of the group's length). The elements kept go on unchanged.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PythonFilter {
    /// The function, as `package.module:name`, importable in the workers' Python environment.
    /// The manifest's folder is importable, so `quality:sharp_enough` finds `quality.py` beside
    /// it.
    pub function: String,
    /// `false` (default) passes one element at a time and expects a truthy value back; `true`
    /// passes up to `spec.batch.size` elements at once, each field stacked along a new leading
    /// axis (lists for text and bytes), and expects one boolean per element.
    #[serde(default)]
    pub batched: bool,
    /// Keyword arguments for the function, as JSON values.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schemars(with = "std::collections::BTreeMap<String, serde_json::Value>")]
    pub args: serde_json::Map<String, serde_json::Value>,
    /// `true` declares that the decision depends only on the element (no `rng`, no clock, no
    /// state). Default `false`. A filter ends the deterministic prefix either way, since it
    /// changes the element count.
    #[serde(default)]
    pub deterministic: bool,
    /// The fields the function reads, when it declares them: the optimizer may then run the
    /// filter before stages that write none of them, so that the elements it drops are never
    /// computed. Unset: the function may read any field, and the filter stays where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<Vec<String>>,
}

/// Parameters Granary passes itself, which `args` may not name.
pub const RESERVED_ARGS: [&str; 2] = ["rng", "key"];

/// What a Python stage does with the function's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonRole {
    /// `python.map`: the result is the element's new fields.
    Map,
    /// `python.filter`: the result says whether the element is kept.
    Filter,
}

/// What the worker needs of any Python stage, map or filter: the fields they share.
#[derive(Clone, Debug, PartialEq)]
pub struct PythonCall {
    /// `module:name`.
    pub function: String,
    /// Whether it takes groups of elements.
    pub batched: bool,
    /// Keyword arguments.
    pub args: serde_json::Map<String, serde_json::Value>,
    /// Map or filter.
    pub role: PythonRole,
    /// For a map that declares them: the only fields it may add or remove.
    pub writes: Option<Vec<String>>,
}

impl PythonMap {
    /// The `op` name: `python.map`.
    pub const OP: &str = "python.map";

    /// The module and the attribute of `function`, when it has the `module:name` form.
    pub fn target(&self) -> Option<(&str, &str)> {
        target_of(&self.function)
    }

    /// The call the worker makes.
    pub fn call(&self) -> PythonCall {
        PythonCall {
            function: self.function.clone(),
            batched: self.batched,
            args: self.args.clone(),
            role: PythonRole::Map,
            writes: self.writes.clone(),
        }
    }

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_call(&self.function, &self.args, path, problems);
        check_fields(self.reads.as_deref(), &format!("{path}.reads"), problems);
        check_fields(self.writes.as_deref(), &format!("{path}.writes"), problems);
        if self.reads.is_some() != self.writes.is_some() {
            let (given, missing) =
                if self.reads.is_some() { ("reads", "writes") } else { ("writes", "reads") };
            problems.push(Problem::new(
                format!("{path}.{missing}"),
                format!(
                    "must be given with `{given}`: the optimizer moves stages across a Python map only \
                     when it knows both what it reads and what it writes (an empty list is allowed)"
                ),
            ));
        }
    }
}

impl PythonFilter {
    /// The `op` name: `python.filter`.
    pub const OP: &str = "python.filter";

    /// The module and the attribute of `function`, when it has the `module:name` form.
    pub fn target(&self) -> Option<(&str, &str)> {
        target_of(&self.function)
    }

    /// The call the worker makes.
    pub fn call(&self) -> PythonCall {
        PythonCall {
            function: self.function.clone(),
            batched: self.batched,
            args: self.args.clone(),
            role: PythonRole::Filter,
            writes: None,
        }
    }

    pub(super) fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        check_call(&self.function, &self.args, path, problems);
        check_fields(self.reads.as_deref(), &format!("{path}.reads"), problems);
    }
}

/// Checks a declared field list at `path`: names not empty, none twice.
fn check_fields(fields: Option<&[String]>, path: &str, problems: &mut Vec<Problem>) {
    for (i, f) in fields.unwrap_or_default().iter().enumerate() {
        if f.is_empty() {
            problems.push(Problem::new(format!("{path}[{i}]"), "must not be empty; name a field"));
        } else if fields.unwrap_or_default()[..i].contains(f) {
            problems.push(Problem::new(format!("{path}[{i}]"), format!("field `{f}` is listed twice")));
        }
    }
}

/// The module and the attribute of `function`, when it has the `module:name` form.
fn target_of(function: &str) -> Option<(&str, &str)> {
    let (module, name) = function.split_once(':')?;
    let dotted = |s: &str| !s.is_empty() && s.split('.').all(is_identifier);
    (dotted(module) && dotted(name)).then_some((module, name))
}

/// Checks the `function` and `args` of a Python stage at `path`.
fn check_call(
    function: &str,
    args: &serde_json::Map<String, serde_json::Value>,
    path: &str,
    problems: &mut Vec<Problem>,
) {
    if target_of(function).is_none() {
        problems.push(Problem::new(
            format!("{path}.function"),
            format!(
                "is `{function}`; write `package.module:function`, e.g. `augment:jitter` for the function \
                 `jitter` in `augment.py` beside the manifest"
            ),
        ));
    }
    for name in args.keys() {
        if RESERVED_ARGS.contains(&name.as_str()) {
            problems.push(Problem::new(
                format!("{path}.args.{name}"),
                format!("`{name}` is passed by Granary itself; rename this argument"),
            ));
        } else if !is_identifier(name) {
            problems.push(Problem::new(
                format!("{path}.args.{name}"),
                "is not a Python identifier, so it cannot be a keyword argument; rename it",
            ));
        }
    }
}

/// Whether `s` is a Python identifier (ASCII letters, digits and `_`, not starting with a digit;
/// non-ASCII letters are accepted as Python does).
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(function: &str) -> PythonMap {
        PythonMap {
            function: function.into(),
            batched: false,
            args: Default::default(),
            deterministic: false,
            reads: None,
            writes: None,
        }
    }

    #[test]
    fn targets_need_a_module_and_a_name() {
        assert_eq!(map("pkg.mod:fn").target(), Some(("pkg.mod", "fn")));
        assert_eq!(map("augment:Jitter.apply").target(), Some(("augment", "Jitter.apply")));
        for bad in ["augment", "augment:", ":fn", "a-b:fn", "a..b:fn", "1a:fn", "a:b:c"] {
            assert_eq!(map(bad).target(), None, "{bad}");
        }
    }

    #[test]
    fn reserved_and_malformed_args_are_named() {
        let mut m = map("a:b");
        m.args.insert("rng".into(), 1.into());
        m.args.insert("bad name".into(), 1.into());
        m.args.insert("strength".into(), 0.5.into());
        let mut problems = Vec::new();
        m.check("spec.stages[1]", &mut problems);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["spec.stages[1].args.bad name", "spec.stages[1].args.rng"]);
    }

    #[test]
    fn a_filter_checks_its_function_as_a_map_does() {
        let mut f = PythonFilter {
            function: "quality:keep".into(),
            batched: true,
            args: Default::default(),
            deterministic: false,
            reads: None,
        };
        assert_eq!(f.target(), Some(("quality", "keep")));
        assert_eq!(f.call().role, PythonRole::Filter);
        assert_eq!(map("a:b").call().role, PythonRole::Map);
        f.function = "quality".into();
        f.args.insert("key".into(), 1.into());
        let mut problems = Vec::new();
        f.check("s", &mut problems);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["s.function", "s.args.key"]);
    }
}
