//! `spec.errors`: what an element that cannot be decoded or transformed does to its pipeline.

use crate::Problem;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What happens when a stage fails on one element (an undecodable image, a transform that
/// rejects its input). Errors reading the source (the store, a truncated object) are never
/// skipped: their split is retried, and fails the pipeline after 3 failed attempts.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.maxSkipped) || (has(self.policy) && self.policy == 'skip')",
        "message": "`maxSkipped` applies only to `policy: skip`; set `policy: skip` or remove `maxSkipped`"
    }
]))]
pub struct ErrorsSpec {
    /// `fail`: the element's split fails, is retried, and after 3 failed attempts the pipeline
    /// fails, naming the element and the error. `skip`: the element is dropped and counted
    /// (`status.skippedElements`, `granary_worker_elements_skipped_total`), and every other
    /// element is delivered. Defaults to `fail`.
    #[serde(default)]
    pub policy: ErrorPolicy,
    /// With `policy: skip`: the most elements the pipeline may skip, over all its epochs and
    /// jobs; one more fails it. Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_skipped: Option<u64>,
}

/// What a failing element does.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    /// Fail the element's split (retried, then the pipeline fails).
    #[default]
    Fail,
    /// Drop the element, count it, and go on.
    Skip,
}

impl ErrorsSpec {
    /// Whether failing elements are dropped rather than failing their split.
    pub fn skips(&self) -> bool {
        self.policy == ErrorPolicy::Skip
    }

    /// `maxSkipped`, when `total` skipped elements pass it under `policy: skip`: the pipeline
    /// fails. The one rule for the dispatcher and for a run in one process.
    pub fn exceeded_by(&self, total: u64) -> Option<u64> {
        self.max_skipped.filter(|&max| self.skips() && total > max)
    }

    /// `spec.errors` of a pipeline given as JSON (as the dispatcher keeps it); the default (`fail`)
    /// when it has none or cannot be read.
    pub fn of_manifest_json(json: &str) -> ErrorsSpec {
        #[derive(Deserialize)]
        struct Pipeline {
            #[serde(default)]
            spec: Spec,
        }
        #[derive(Default, Deserialize)]
        struct Spec {
            #[serde(default)]
            errors: Option<ErrorsSpec>,
        }
        serde_json::from_str::<Pipeline>(json).ok().and_then(|p| p.spec.errors).unwrap_or_default()
    }

    /// Problems with the combination of fields.
    pub(crate) fn check(&self, problems: &mut Vec<Problem>) {
        if self.max_skipped.is_some() && !self.skips() {
            problems.push(Problem::new(
                "spec.errors.maxSkipped",
                "applies only to `policy: skip` (with `fail` nothing is skipped); set \
                 `spec.errors.policy: skip` or remove `maxSkipped`",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_fail_and_json_without_errors_reads_as_it() {
        assert_eq!(ErrorsSpec::default().policy, ErrorPolicy::Fail);
        assert!(!ErrorsSpec::of_manifest_json("{}").skips());
        assert!(!ErrorsSpec::of_manifest_json("not json").skips());
        let json = r#"{"spec": {"errors": {"policy": "skip", "maxSkipped": 3}}}"#;
        let errors = ErrorsSpec::of_manifest_json(json);
        assert!(errors.skips());
        assert_eq!(errors.max_skipped, Some(3));
    }

    #[test]
    fn max_skipped_without_skip_is_a_problem_naming_the_fix() {
        let mut problems = Vec::new();
        ErrorsSpec { policy: ErrorPolicy::Fail, max_skipped: Some(1) }.check(&mut problems);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].path, "spec.errors.maxSkipped");
        assert!(problems[0].message.contains("policy: skip"), "{}", problems[0].message);
        let mut none = Vec::new();
        ErrorsSpec { policy: ErrorPolicy::Skip, max_skipped: Some(0) }.check(&mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn a_skip_total_past_max_skipped_is_exceeded_only_under_skip() {
        let skip = ErrorsSpec { policy: ErrorPolicy::Skip, max_skipped: Some(1) };
        assert_eq!(skip.exceeded_by(1), None);
        assert_eq!(skip.exceeded_by(2), Some(1));
        assert_eq!(ErrorsSpec { policy: ErrorPolicy::Skip, max_skipped: None }.exceeded_by(99), None);
        assert_eq!(ErrorsSpec { policy: ErrorPolicy::Fail, max_skipped: Some(0) }.exceeded_by(5), None);
    }
}
