//! The `namespace` and `pipeline` labels of a pipeline's series.

/// The namespace a pipeline registered without one (by `granary run`) is reported under.
pub const LOCAL_NAMESPACE: &str = "local";

/// `(namespace, pipeline)` labels for a pipeline id: the operator registers `namespace/name`;
/// an id without a slash (`granary run`) is in the namespace `local`.
pub fn pipeline_labels(id: &str) -> (&str, &str) {
    match id.split_once('/') {
        Some((namespace, name)) => (namespace, name),
        None => (LOCAL_NAMESPACE, id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_into_namespace_and_name() {
        assert_eq!(pipeline_labels("ml/imagenet"), ("ml", "imagenet"));
        assert_eq!(pipeline_labels("imagenet"), ("local", "imagenet"));
    }
}
