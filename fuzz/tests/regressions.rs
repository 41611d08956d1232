//! Every committed fuzz input, replayed through its target in the normal (uninstrumented)
//! build: the seed corpora (`corpus/<target>/`) and every input that once crashed a target
//! (`regressions/<target>/`). A target that panics on one fails this test, naming the file.

use std::path::{Path, PathBuf};

/// The files under `dir/<target>/` for every target, with the target's function; a folder
/// named for no target is an error (a renamed target would silently lose its inputs).
fn inputs(dir: &str) -> Vec<(PathBuf, granary_fuzz::Target)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found = Vec::new();
    let Ok(folders) = std::fs::read_dir(&root) else { return found };
    for folder in folders {
        let folder = folder.unwrap().path();
        let name = folder.file_name().unwrap().to_string_lossy().into_owned();
        let Some((_, target)) = granary_fuzz::TARGETS.iter().find(|(n, _)| *n == name) else {
            panic!("{} is named for no fuzz target; targets: {:?}", folder.display(), target_names());
        };
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&folder).unwrap().map(|f| f.unwrap().path()).collect();
        files.sort();
        found.extend(files.into_iter().filter(|f| f.is_file()).map(|f| (f, *target)));
    }
    found
}

fn target_names() -> Vec<&'static str> {
    granary_fuzz::TARGETS.iter().map(|(n, _)| *n).collect()
}

fn replay(dir: &str) -> usize {
    let inputs = inputs(dir);
    for (path, target) in &inputs {
        let data = std::fs::read(path).unwrap();
        if std::panic::catch_unwind(|| target(&data)).is_err() {
            panic!("{} fails its fuzz target", path.display());
        }
    }
    inputs.len()
}

#[test]
fn every_seed_input_runs_clean() {
    let n = replay("corpus");
    // Every target has seeds.
    for name in target_names() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(name);
        let seeds = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(seeds > 0, "{} has no seed inputs", dir.display());
    }
    assert!(n >= granary_fuzz::TARGETS.len());
}

#[test]
fn every_input_that_once_crashed_runs_clean() {
    replay("regressions");
}
