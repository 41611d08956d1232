//! The manifest parser and validator.

use std::path::Path;

/// Reads `data` as a manifest file, as `granary run` and the operator do: UTF-8 text, parsed,
/// `--set` overrides applied (each line `#set FIELD=VALUE` of the text is one), validated; a
/// manifest that passes must survive the JSON round trip the dispatcher makes and validate
/// again there.
pub fn manifest(data: &[u8]) {
    let Ok(text) = granary_crds::read::manifest_text(data.to_vec()) else { return };
    let overrides: Vec<String> =
        text.lines().filter_map(|l| l.strip_prefix("#set ")).take(16).map(str::to_string).collect();
    let Ok(manifest) = granary_crds::parse_manifest(&text, Path::new("/fuzz"), &overrides) else { return };
    let json = match serde_json::to_string(&manifest.pipeline) {
        Ok(json) => json,
        Err(e) => panic!("a valid manifest does not serialize: {e}"),
    };
    let again: granary_crds::InputPipeline = match serde_json::from_str(&json) {
        Ok(pipeline) => pipeline,
        Err(e) => panic!("a valid manifest's JSON does not parse back: {e}\n{json}"),
    };
    let problems = granary_crds::validate(&again.spec);
    assert!(problems.is_empty(), "a valid manifest's JSON round trip fails validation: {problems:?}\n{json}");
    let _ = granary_crds::part_bound::PartBound::of_manifest_json(&json);
}
