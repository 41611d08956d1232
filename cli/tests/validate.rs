//! Runs the `granary` binary: `granary validate` on every spec fixture and `granary crd`.
//!
//! Each `tests/specs/bad/*.yaml` starts with `# expect: TEXT`; validating it must fail, and one of
//! the `FIELD_PATH: message` lines must contain TEXT. Every `tests/specs/good/*.yaml` must pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn granary(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_granary")).args(args).output().expect("running granary")
}

fn specs(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bad_specs_fail_naming_the_field() {
    let files = specs("bad");
    assert!(files.len() >= 30, "only {} bad fixtures", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let content = std::fs::read_to_string(file).unwrap();
        let expect = content.lines().next().and_then(|l| l.strip_prefix("# expect: ")).unwrap().to_string();
        let out = granary(&["validate".as_ref(), file.as_os_str()]);
        let stdout = text(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        let header = format!("{}: invalid (", file.display());
        let ok = out.status.code() == Some(2)
            && lines.first().is_some_and(|l| l.starts_with(&header))
            && lines[1..].iter().any(|l| l.contains(&expect))
            && lines[1..]
                .iter()
                .all(|l| l.split_once(": ").is_some_and(|(path, msg)| !path.is_empty() && !msg.is_empty()));
        if !ok {
            failures.push(format!(
                "{}: expected exit 2 and a line containing `{expect}`; got {:?}\nstdout:\n{stdout}\nstderr:\n{}",
                file.display(),
                out.status.code(),
                text(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn good_specs_pass() {
    for file in specs("good") {
        let out = granary(&["validate".as_ref(), file.as_os_str()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}:\n{}{}",
            file.display(),
            text(&out.stdout),
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), format!("{}: ok\n", file.display()));
    }
}

#[test]
fn several_files_report_each_and_fail_if_any_fails() {
    let good = specs("good");
    let bad = specs("bad");
    let out = granary(&["validate".as_ref(), good[0].as_os_str(), bad[0].as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(&format!("{}: ok\n{}: invalid (", good[0].display(), bad[0].display())),
        "{stdout}"
    );
}

#[test]
fn unreadable_file_exits_2() {
    let out = granary(&["validate".as_ref(), "/nonexistent/pipeline.yaml".as_ref()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/pipeline.yaml"));
}

#[test]
fn crd_prints_a_yaml_crd() {
    let out = granary(&["crd".as_ref()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let crd: serde_json::Value = serde_norway::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["spec"]["group"], "granary.dev");
    assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
}
