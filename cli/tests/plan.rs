//! `granary plan`: the plans of the examples checked in under `docs/plans/` are what the command
//! prints today, and a mis-ordered spec is printed with its rewrites.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `granary plan FILE` run from the repository's root, so the header names the file as the
/// docs do.
fn plan(file: &str, set: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_granary"));
    command.current_dir(root()).arg("plan").arg(file);
    for s in set {
        command.args(["--set", s]);
    }
    let out = command.output().expect("running granary plan");
    assert!(out.status.success(), "granary plan {file}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The manifests whose plans are in `docs/plans/`: every example pipeline.
fn examples() -> Vec<String> {
    let mut files = Vec::new();
    for dir in ["examples", "examples/python-stage"] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if name.ends_with(".yaml") && text.contains("kind: InputPipeline") {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_checked_in_plans_of_the_examples_are_current() {
    let files = examples();
    assert!(files.len() >= 5, "examples found: {files:?}");
    let mut stale = Vec::new();
    for file in &files {
        let name = Path::new(file).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let doc = root().join("docs/plans").join(format!("{name}.txt"));
        let printed = plan(file, &[]);
        if std::fs::read_to_string(&doc).ok().as_deref() != Some(printed.as_str()) {
            stale.push(format!("{file} → docs/plans/{name}.txt"));
        }
    }
    assert!(
        stale.is_empty(),
        "stale plans: {stale:?}; regenerate from the repository's root with\n  for f in examples/*.yaml \
         examples/python-stage/*pipeline.yaml; do cargo run -q -p granary-cli -- plan $f > docs/plans/$(basename \
         $f .yaml).txt; done"
    );
}

#[test]
fn a_misordered_pipeline_is_printed_with_its_rewrites_and_optimize_false_turns_them_off() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("misordered.yaml");
    std::fs::write(
        &file,
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: misordered}\nspec:\n  source: {url: \
         'file:///data/', format: files}\n  batch: {size: 8}\n  stages:\n  - {op: image.decode}\n  - {op: \
         image.normalize, dtype: uint8}\n  - {op: image.random_resized_crop, size: 224}\n  - {op: image.flip}\n",
    )
    .expect("writing the manifest");
    let file = file.display().to_string();
    let on = plan(&file, &[]);
    assert!(
        on.contains(
            "moved spec.stages[2] `image.random_resized_crop` before spec.stages[1] `image.normalize`"
        ),
        "{on}"
    );
    assert!(on.contains("moved spec.stages[3] `image.flip` before spec.stages[1] `image.normalize`"), "{on}");
    assert!(on.contains("equivalence: exact"), "{on}");
    assert!(
        on.contains(
            "fused into one operator: spec.stages[0] image.decode → spec.stages[2] image.random_resized_crop → \
             spec.stages[3] image.flip → spec.stages[1] image.normalize"
        ),
        "{on}"
    );
    let off = plan(&file, &["spec.optimize=false"]);
    assert!(off.contains("optimizer: off"), "{off}");
    assert!(!off.contains("moved"), "{off}");
}
