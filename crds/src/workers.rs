//! `spec.workers` and `spec.python`: how a pipeline's worker pods are made, beyond the chart's
//! defaults.

use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The pipeline's worker pods.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkersSpec {
    /// Container image of this pipeline's workers, instead of the chart's. For `python.map`
    /// stages whose code is a package, build one `FROM` Granary's Python image with the package
    /// installed (examples/python-stage/Dockerfile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
}

/// Where the workers find the code of `python.map` stages, besides their image.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PythonSpec {
    /// A ConfigMap in the pipeline's namespace whose keys are Python files (`augment.py: |`):
    /// mounted into the worker pods and importable there, so `function: augment:jitter` finds
    /// `jitter` in its `augment.py`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map: Option<String>,
}

impl WorkersSpec {
    pub(crate) fn check(&self, problems: &mut Vec<Problem>) {
        if let Some(image) = &self.image
            && (image.trim().is_empty() || image.chars().any(char::is_whitespace))
        {
            problems.push(Problem::new(
                "spec.workers.image",
                format!("is `{image}`; give an image reference such as `registry.example.com/team/granary-augment:1.2`"),
            ));
        }
    }
}

impl PythonSpec {
    pub(crate) fn check(&self, problems: &mut Vec<Problem>) {
        if let Some(name) = &self.config_map
            && !is_dns_subdomain(name)
        {
            problems.push(Problem::new(
                "spec.python.configMap",
                format!(
                    "is `{name}`; a ConfigMap name is lowercase letters, digits, `-` and `.`, starting and ending \
                     with a letter or digit, at most 253 characters"
                ),
            ));
        }
    }
}

/// Whether `s` is a DNS-1123 subdomain, the form of ConfigMap names.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_map_names_and_images_are_checked() {
        for (name, ok) in
            [("augment", true), ("team.augment-v2", true), ("Augment", false), ("-a", false), ("", false)]
        {
            let mut problems = Vec::new();
            PythonSpec { config_map: Some(name.into()) }.check(&mut problems);
            assert_eq!(problems.is_empty(), ok, "{name}");
        }
        let mut problems = Vec::new();
        WorkersSpec { image: Some("a b".into()) }.check(&mut problems);
        assert_eq!(problems[0].path, "spec.workers.image");
    }
}
