//! Failures as a user meets them: each case runs the real `granary` binary and checks that it
//! exits with the status of the exit-code table, that its message carries the field or the fix
//! (key phrases), and that no clause of the message is said twice.
//!
//! Nothing here leaves the machine: cloud credential discovery sees no credentials from the
//! environment, `HOME` is an empty folder (no `~/.config/gcloud` file), and every instance-metadata
//! endpoint (`AWS_METADATA_ENDPOINT`, `GCE_METADATA_HOST`/`GCE_METADATA_IP`,
//! `AZURE_MSI_ENDPOINT`) is a closed port on 127.0.0.1.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A port nothing listens on: connections to it are refused at once.
const CLOSED: &str = "127.0.0.1:1";

/// One failure: how to cause it and what must be said.
struct Case {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdin: Option<Vec<u8>>,
    status: i32,
    phrases: Vec<&'static str>,
}

/// A manifest of `format` reading `url`, with `stages` (YAML flow list) and optional extra
/// source fields.
fn manifest(url: &str, format: &str, extra: &str, stages: &str) -> String {
    format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata:\n  name: failing\nspec:\n  \
         source: {{url: '{url}', format: {format}{extra}}}\n  stages: {stages}\n  batch: {{size: 2}}\n"
    )
}

fn image_manifest(url: &str) -> String {
    manifest(url, "files", "", "[{op: image.decode}]")
}

fn write(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `granary run --workers 0 FILE`: the pipeline in this process.
fn run(file: &str) -> Vec<String> {
    args(&["run", "--workers", "0", file])
}

fn cases(dir: &Path) -> Vec<Case> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.jpg"), b"not really a jpeg").unwrap();
    let data_url = format!("file://{}/", data.display());
    let tokenizer_stages =
        "[{op: table.select, columns: [text]}, {op: text.tokenize, tokenizer: missing/tokenizer.json}]";
    std::fs::write(data.join("t.jsonl"), "{\"text\": \"hello\"}\n").unwrap();
    vec![
        Case {
            name: "s3 without credentials",
            args: run(&write(dir, "s3.yaml", image_manifest("s3://granary-test-bucket/train/"))),
            env: vec![("AWS_REGION", "us-east-1".into())],
            stdin: None,
            status: 1,
            phrases: vec![
                "spec.source.url",
                "no S3 credentials",
                "AWS_ACCESS_KEY_ID",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_METADATA_ENDPOINT",
                CLOSED,
            ],
        },
        Case {
            name: "gs without credentials",
            args: run(&write(dir, "gs.yaml", image_manifest("gs://granary-test-bucket/train/"))),
            env: vec![],
            stdin: None,
            status: 1,
            phrases: vec![
                "spec.source.url",
                "no Google Cloud Storage credentials",
                "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_APPLICATION_CREDENTIALS",
                "application_default_credentials.json",
            ],
        },
        Case {
            name: "az without credentials",
            args: run(&write(dir, "az.yaml", image_manifest("az://container/train/"))),
            env: vec![("AZURE_STORAGE_ACCOUNT_NAME", "granarytest".into())],
            stdin: None,
            status: 1,
            phrases: vec![
                "spec.source.url",
                "no Azure credentials",
                "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_MSI_ENDPOINT",
            ],
        },
        Case {
            name: "az without an account",
            args: run(&write(dir, "az-account.yaml", image_manifest("az://container/train/"))),
            env: vec![],
            stdin: None,
            status: 1,
            phrases: vec!["spec.source.url", "no Azure storage account", "AZURE_STORAGE_ACCOUNT_NAME"],
        },
        Case {
            name: "unreachable endpoint",
            args: run(&write(dir, "endpoint.yaml", image_manifest("s3://granary-test-bucket/train/"))),
            env: vec![
                ("AWS_ACCESS_KEY_ID", "granary".into()),
                ("AWS_SECRET_ACCESS_KEY", "granary-secret".into()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ENDPOINT", format!("http://{CLOSED}")),
                ("AWS_ALLOW_HTTP", "true".into()),
            ],
            stdin: None,
            status: 1,
            phrases: vec!["listing", CLOSED, "Connection refused"],
        },
        Case {
            name: "missing source folder",
            args: run(&write(
                dir,
                "missing-source.yaml",
                image_manifest(&format!("file://{}/", dir.join("no-such-folder").display())),
            )),
            env: vec![],
            stdin: None,
            status: 1,
            phrases: vec!["spec.source.url", "no-such-folder", "check the URL"],
        },
        Case {
            name: "bad tokenizer path",
            args: run(&write(dir, "tokenizer.yaml", manifest(&data_url, "jsonl", "", tokenizer_stages))),
            env: vec![],
            stdin: None,
            status: 1,
            phrases: vec!["tokenizer", "missing/tokenizer.json"],
        },
        Case {
            name: "missing labels file",
            args: run(&write(
                dir,
                "labels.yaml",
                manifest(&data_url, "files", ", labels: no-labels.jsonl", "[{op: image.decode}]"),
            )),
            env: vec![],
            stdin: None,
            status: 1,
            phrases: vec![
                "spec.source.labels",
                "no-labels.jsonl",
                "does not exist",
                "relative to spec.source.url",
            ],
        },
        Case {
            name: "non-UTF-8 manifest",
            args: args(&["validate", &write(dir, "latin1.yaml", b"metadata:\n  name: caf\xe9\n")]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["latin1.yaml", "not UTF-8", "save the manifest as UTF-8"],
        },
        Case {
            name: "non-UTF-8 manifest on stdin",
            args: args(&["validate", "-"]),
            env: vec![],
            stdin: Some(b"kind: \xff\n".to_vec()),
            status: 2,
            phrases: vec!["not UTF-8"],
        },
        Case {
            name: "bad source URL (words)",
            args: args(&["validate", &write(dir, "words.yaml", image_manifest("my training data"))]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["spec.source.url", "my training data", "s3://bucket/prefix/", "%20"],
        },
        Case {
            name: "bad source URL (unknown scheme)",
            args: args(&["validate", &write(dir, "scheme.yaml", image_manifest("hdfs://namenode/train/"))]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["spec.source.url", "`hdfs:` is not supported", "s3://"],
        },
        Case {
            name: "unknown operator",
            args: args(&[
                "validate",
                &write(dir, "op.yaml", manifest(&data_url, "files", "", "[{op: image.decod}]")),
            ]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["spec.stages[0].op", "image.decod", "image.decode"],
        },
        Case {
            name: "bad flag value",
            args: args(&["run", "--threads", "many", "pipeline.yaml"]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["invalid value", "--threads"],
        },
        Case {
            name: "missing manifest (run)",
            args: args(&["run", &dir.join("absent.yaml").display().to_string()]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["absent.yaml", "no such file", "check the path"],
        },
        Case {
            name: "missing manifest (validate)",
            args: args(&["validate", &dir.join("absent.yaml").display().to_string()]),
            env: vec![],
            stdin: None,
            status: 2,
            phrases: vec!["absent.yaml", "no such file"],
        },
    ]
}

/// Runs `case` with no cloud settings but its own, `HOME` at `home`, and every metadata endpoint
/// on a closed loopback port.
fn execute(case: &Case, home: &Path) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_granary"));
    command.args(&case.args);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_ascii_uppercase();
        if ["AWS_", "GOOGLE_", "GCE_", "AZURE_"].iter().any(|p| key.starts_with(p)) {
            command.env_remove(&key);
        }
    }
    command
        .env("HOME", home)
        .env("GRANARY_LOG", "error")
        .env("AWS_METADATA_ENDPOINT", format!("http://{CLOSED}"))
        .env("GCE_METADATA_HOST", CLOSED)
        .env("GCE_METADATA_IP", CLOSED)
        .env("AZURE_MSI_ENDPOINT", format!("http://{CLOSED}/metadata/identity/oauth2/token"))
        .envs(case.env.iter().map(|(k, v)| (k, v)))
        .stdin(if case.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("running granary");
    if let Some(bytes) = &case.stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    child.wait_with_output().expect("granary's output")
}

/// The message's clauses: its text split at `: ` and `; `, trimmed, without the `error` lead.
fn clauses(message: &str) -> Vec<String> {
    message
        .split(['\n'])
        .flat_map(|line| line.split("; "))
        .flat_map(|part| part.split(": "))
        .map(|c| c.trim().trim_end_matches('.').to_string())
        .filter(|c| !c.is_empty() && c != "error")
        .collect()
}

#[test]
fn each_failure_says_its_cause_once_with_the_field_or_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let cases = cases(dir.path());
    assert!(cases.len() >= 12);
    let mut failures = Vec::new();
    for case in &cases {
        let out = execute(case, home.path());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // `validate` reports problems on stdout, everything else on stderr.
        let message = if stderr.trim().is_empty() { stdout.clone() } else { stderr.clone() };
        let mut wrong = Vec::new();
        if out.status.code() != Some(case.status) {
            wrong.push(format!("exit status {:?}, expected {}", out.status.code(), case.status));
        }
        for phrase in &case.phrases {
            if !message.contains(phrase) {
                wrong.push(format!("no `{phrase}`"));
            }
        }
        let mut seen = HashSet::new();
        for clause in clauses(&message) {
            if !seen.insert(clause.clone()) {
                wrong.push(format!("`{clause}` said twice"));
            }
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n  granary {}\n  stdout: {stdout}\n  stderr: {stderr}",
                case.name,
                wrong.join(", "),
                case.args.join(" ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn clauses_split_at_colons_and_semicolons() {
    assert_eq!(clauses("error: a: b; c\nd: a"), ["a", "b", "c", "d", "a"]);
}

/// Where the fixtures of the other tests are, to check `validate --json` against.
fn bad_spec() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs/bad/02-unknown-op.yaml")
}

#[test]
fn validate_json_prints_one_object_per_file() {
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs/good/minimal.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_granary"))
        .arg("validate")
        .arg("--json")
        .arg(&good)
        .arg(bad_spec())
        .arg("/nonexistent/pipeline.yaml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["file"], good.display().to_string());
    assert_eq!(lines[0]["valid"], true);
    assert_eq!(lines[0]["problems"], serde_json::json!([]));
    assert_eq!(lines[1]["valid"], false);
    assert!(lines[1]["problems"][0]["path"].as_str().unwrap().starts_with("spec.stages"), "{}", lines[1]);
    assert_eq!(lines[2]["valid"], false);
    assert_eq!(lines[2]["problems"][0]["path"], "/nonexistent/pipeline.yaml");
}

#[test]
fn validate_reads_standard_input() {
    let good =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/specs/good/minimal.yaml")).unwrap();
    let case = Case {
        name: "stdin",
        args: args(&["validate", "-"]),
        env: vec![],
        stdin: Some(good),
        status: 0,
        phrases: vec![],
    };
    let home = tempfile::tempdir().unwrap();
    let out = execute(&case, home.path());
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "-: ok\n");
}

#[test]
fn help_describes_the_tool_and_lists_the_exit_statuses() {
    let out = Command::new(env!("CARGO_BIN_EXE_granary")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.starts_with("Granary: ML input pipelines"), "{help}");
    for line in ["Exit status", "  0 ", "  1 ", "  2 ", "130", "143"] {
        assert!(help.contains(line), "`{line}` missing from:\n{help}");
    }
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_granary")).args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("granary") && script.contains("validate"), "{shell}:\n{script}");
    }
}
