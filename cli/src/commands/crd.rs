//! `granary crd`: the `InputPipeline` CustomResourceDefinition as YAML.

use anyhow::Context;
use granary_crds::InputPipeline;
use kube::CustomResourceExt;

/// The `InputPipeline` CRD (`inputpipelines.granary.dev`) as a YAML document, ready for
/// `kubectl apply -f -` or the Helm chart's `crds/` folder.
pub fn crd() -> anyhow::Result<String> {
    serde_norway::to_string(&InputPipeline::crd()).context("serializing the InputPipeline CRD as YAML")
}
