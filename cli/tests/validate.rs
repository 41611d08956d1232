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
        let stdout = text(&out.stdout);
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some(format!("{}: ok", file.display()).as_str()));
        // Notes (what was checked of the Python stages) are indented.
        assert!(lines.all(|l| l.starts_with("  ")), "{stdout}");
    }
}

/// A Python with NumPy for the checks below: `GRANARY_PYTHON` (scripts/test sets it). Outside CI
/// without one, the test is skipped with a message.
fn python() -> Option<String> {
    match std::env::var("GRANARY_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var("CI").as_deref() == Ok("true") => panic!("GRANARY_PYTHON is not set"),
        _ => {
            eprintln!("skipped: GRANARY_PYTHON is not set");
            None
        }
    }
}

#[test]
fn python_functions_are_imported_and_checked() {
    let Some(python) = python() else { return };
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs/good/python-map.yaml");
    let out = granary(&["validate".as_ref(), good.as_os_str(), "--python".as_ref(), python.as_ref()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("functions import and fit their stages in Python 3."), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(good.with_file_name("python_stage.py"), dir.path().join("python_stage.py")).unwrap();
    let text_of = |function: &str, args: &str| {
        std::fs::read_to_string(&good).unwrap().replace(
            "function: python_stage:brighten\n      args: {factor: 1.2}",
            &format!("function: {function}\n      args: {args}"),
        )
    };
    for (name, function, args, expected) in [
        ("missing.yaml", "python_stage:missing", "{}", "spec.stages[2].function: `python_stage` ("),
        ("module.yaml", "nowhere:brighten", "{}", "spec.stages[2].function: cannot import `nowhere`"),
        ("args.yaml", "python_stage:brighten", "{strength: 2}", "unexpected keyword argument 'strength'"),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, text_of(function, args)).unwrap();
        let out = granary(&["validate".as_ref(), file.as_os_str(), "--python".as_ref(), python.as_ref()]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{name}: {stdout}");
        assert!(stdout.contains(expected), "{name}: {stdout}");
    }

    // No Python: valid, with a note that the functions were not checked.
    let out = Command::new(env!("CARGO_BIN_EXE_granary"))
        .args(["validate".as_ref(), good.as_os_str()])
        .env("GRANARY_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("functions were not checked: cannot start Python /nonexistent/python3"),
        "{stdout}"
    );
}

#[test]
fn python_filter_functions_are_imported_and_checked_as_maps_are() {
    let Some(python) = python() else { return };
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs/good/filters.yaml");
    let out = granary(&["validate".as_ref(), good.as_os_str(), "--python".as_ref(), python.as_ref()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("functions import and fit their stages in Python 3."), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(good.with_file_name("python_stage.py"), dir.path().join("python_stage.py")).unwrap();
    for (name, function, expected) in [
        ("missing.yaml", "python_stage:missing", "spec.stages[3].function: `python_stage` ("),
        ("args.yaml", "python_stage:brighten_all", "unexpected keyword argument 'threshold'"),
    ] {
        let file = dir.path().join(name);
        let manifest = std::fs::read_to_string(&good)
            .unwrap()
            .replace("function: python_stage:bright_enough", &format!("function: {function}"));
        std::fs::write(&file, manifest).unwrap();
        let out = granary(&["validate".as_ref(), file.as_os_str(), "--python".as_ref(), python.as_ref()]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{name}: {stdout}");
        assert!(stdout.contains(expected), "{name}: {stdout}");
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
