//! The command-line tools the operator's tests check rendered objects with, found where
//! scripts/test installs them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// A tool: `$env`, else `installed` (relative to the repository root, where scripts/test puts
/// it), else `name` on PATH. Panics, naming scripts/test, when there is none.
pub fn tool(env: &str, installed: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.exists(),
            "{env}={} does not exist; run scripts/test, which installs it under target/tools",
            path.display()
        );
        return path;
    }
    let installed = root().join(installed);
    if installed.exists() {
        return installed;
    }
    if let Some(found) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
    {
        return found;
    }
    panic!(
        "{name} is missing: these tests need it. Run scripts/test, which installs it under \
         target/tools and exports {env}; or set {env} to its path."
    )
}

/// kubernetes-validate (the built-in kinds' JSON schemas per Kubernetes version).
pub fn kubernetes_validate_bin() -> PathBuf {
    tool("GRANARY_KUBERNETES_VALIDATE", "target/tools/venv/bin/kubernetes-validate", "kubernetes-validate")
}

/// Runs kubernetes-validate --strict on `file` (all of `count` documents) against `version`;
/// fails unless every document passed.
pub fn kubernetes_validate(file: &Path, count: usize, version: &str) {
    let out = Command::new(kubernetes_validate_bin())
        .args(["--strict", "--kubernetes-version", version])
        .arg(file)
        .output()
        .expect("kubernetes-validate runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let problems: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("INFO")).collect();
    let passed = stdout.lines().filter(|l| l.starts_with("INFO") && l.contains(" passed ")).count();
    assert!(
        out.status.success() && problems.is_empty() && passed == count,
        "kubernetes-validate against Kubernetes {version} ({}): {passed} of {count} objects passed; \
         problems:\n{}\n--- stderr\n{}",
        out.status,
        problems.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `docs` as one multi-document YAML file (JSON is YAML).
pub fn write_documents(file: &Path, docs: &[serde_json::Value]) {
    let text: Vec<String> = docs.iter().map(|d| serde_json::to_string(d).expect("JSON")).collect();
    std::fs::write(file, text.join("\n---\n") + "\n").expect("writing a temporary file");
}
