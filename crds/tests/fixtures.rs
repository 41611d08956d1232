//! Runs every spec fixture under `cli/tests/specs/` through `parse_manifest`: each bad one must
//! be rejected with a problem naming the field (or YAML line) its `# expect:` line gives, each good
//! one (and every `examples/*.yaml`) must parse, and nothing may panic, also on mangled input.

use granary_crds::{Manifest, Problems, load_manifest, parse_manifest};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn specs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/tests/specs")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn expectation(text: &str, path: &Path) -> String {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{}: first line must be `# expect: FIELD_PATH`", path.display()))
        .to_string()
}

fn load(path: &Path) -> Result<Manifest, Problems> {
    catch_unwind(AssertUnwindSafe(|| load_manifest(path, &[])))
        .unwrap_or_else(|_| panic!("{}: parse_manifest panicked", path.display()))
}

#[test]
fn bad_specs_are_rejected_naming_the_field() {
    let files = yaml_files(&specs_dir().join("bad"));
    assert!(files.len() >= 30, "expected at least 30 bad fixtures, found {}", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let expect = expectation(&text, path);
        match load(path) {
            Ok(_) => failures.push(format!("{}: accepted, expected a problem at `{expect}`", path.display())),
            Err(problems) => {
                assert!(!problems.0.is_empty(), "{}: Err without problems", path.display());
                for p in &problems.0 {
                    assert!(
                        !p.path.is_empty() && !p.message.is_empty(),
                        "{}: empty problem {p:?}",
                        path.display()
                    );
                }
                let hit =
                    problems.0.iter().any(|p| p.path.starts_with(&expect) || p.to_string().contains(&expect));
                if !hit {
                    failures.push(format!("{}: expected `{expect}`, got:\n{problems}", path.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn good_specs_and_examples_parse() {
    let mut files = yaml_files(&specs_dir().join("good"));
    assert!(!files.is_empty());
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    if examples.is_dir() {
        files.extend(yaml_files(&examples));
    }
    for path in &files {
        if let Err(problems) = load(path) {
            panic!("{}: rejected:\n{problems}", path.display());
        }
    }
}

#[test]
fn imagenet_spec_reads_as_written() {
    let path = specs_dir().join("good/imagenet-resnet50.yaml");
    let manifest = load(&path).unwrap();
    let spec = &manifest.pipeline.spec;
    assert_eq!(manifest.pipeline.metadata.name.as_deref(), Some("imagenet-resnet50"));
    assert_eq!(spec.batch.size, 128);
    assert_eq!(spec.stages.len(), 4);
    assert_eq!(spec.epochs, 90);
    let dir = std::path::absolute(specs_dir().join("good")).unwrap();
    let url = spec.source.as_ref().unwrap().url.as_str();
    assert!(url.starts_with("file:///"), "{url}");
    assert!(url.ends_with("/good/data/imagenet/train/"), "{url}");
    assert!(!url.contains("/../"), "{url}");
    assert!(manifest.base_dir.ends_with("good"), "{}", manifest.base_dir.display());
    assert!(dir.is_absolute());
    let ops: Vec<_> = spec.stages.iter().map(|s| granary_crds::OpConfig::parse(s, "s").unwrap()).collect();
    match &ops[3] {
        granary_crds::OpConfig::ImageNormalize(n) => {
            assert_eq!(n.mean3(), [0.485, 0.456, 0.406]);
            assert_eq!(n.std3(), [0.229, 0.224, 0.225]);
        }
        other => panic!("stage 3 is {other:?}"),
    }
    let cache = spec.cache.as_ref().unwrap();
    assert_eq!(cache.max_bytes.as_ref().unwrap().bytes(), Ok(500 << 30));
}

/// Truncations and line deletions of the good specs: each must give Ok or Err, never a panic.
#[test]
fn mangled_specs_never_panic() {
    let base = Path::new("/tmp");
    for path in yaml_files(&specs_dir().join("good")) {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut variants: Vec<String> = Vec::new();
        for (i, _) in text.char_indices().step_by(7) {
            variants.push(text[..i].to_string());
        }
        let lines: Vec<&str> = text.lines().collect();
        for skip in 0..lines.len() {
            let kept: Vec<&str> =
                lines.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, l)| *l).collect();
            variants.push(kept.join("\n"));
            // The same line with a stray value type.
            let mut changed = lines.clone();
            let replaced = match lines[skip].split_once(": ") {
                Some((k, _)) => format!("{k}: [1, {{a: b}}]"),
                None => continue,
            };
            changed[skip] = &replaced;
            variants.push(changed.join("\n"));
        }
        for v in &variants {
            let r = catch_unwind(AssertUnwindSafe(|| parse_manifest(v, base, &[])));
            assert!(r.is_ok(), "{}: panicked on:\n{v}", path.display());
        }
    }
}
