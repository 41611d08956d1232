//! The container images the chart names, as the repository's Dockerfile builds them (read, not
//! built: no container engine is needed): the default target stays the distroless image, the
//! `python` target is the Python-capable worker image the operator gives pipelines with
//! `python.map` stages, and examples/python-stage builds FROM the chart's default name for it.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the operator crate sits in the workspace").into()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The stages of a Dockerfile: `(base image, stage name, instructions after FROM)`, continuation
/// lines joined, comments dropped.
fn stages(dockerfile: &str) -> Vec<(String, String, Vec<String>)> {
    let joined = dockerfile.replace("\\\n", " ");
    let mut stages: Vec<(String, String, Vec<String>)> = Vec::new();
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words[0].eq_ignore_ascii_case("FROM") {
            let name = match words.as_slice() {
                [_, _, r#as, name] if r#as.eq_ignore_ascii_case("AS") => name.to_string(),
                _ => String::new(),
            };
            stages.push((words[1].to_string(), name, Vec::new()));
        } else if let Some(stage) = stages.last_mut() {
            stage.2.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    stages
}

/// The chart's appVersion, the default tag of both images.
fn app_version() -> String {
    let chart = read("charts/granary/Chart.yaml");
    let line = chart.lines().find_map(|l| l.strip_prefix("appVersion:")).expect("an appVersion");
    line.trim().trim_matches('"').to_string()
}

#[test]
fn the_default_target_is_the_distroless_image_and_python_is_a_target_before_it() {
    let stages = stages(&read("Dockerfile"));
    let (base, name, steps) = stages.last().expect("stages");
    assert_eq!((base.as_str(), name.as_str()), ("gcr.io/distroless/cc-debian12:nonroot", ""));
    assert!(steps.contains(&"USER 65532:65532".to_string()), "{steps:?}");

    let (base, _, steps) = stages.iter().find(|s| s.1 == "python").expect("a `python` target");
    assert!(base.starts_with("python:3.") && base.ends_with("-bookworm"), "Debian 12, as the build: {base}");
    let has = |prefix: &str| steps.iter().any(|s| s.starts_with(prefix));
    assert!(has("COPY --from=build /out/granary /usr/local/bin/granary"), "{steps:?}");
    assert!(has("ENV GRANARY_PYTHON=/usr/local/bin/python3"), "{steps:?}");
    assert_eq!(steps.iter().rfind(|s| s.starts_with("USER ")).map(String::as_str), Some("USER 65532:65532"));
    assert!(has(r#"ENTRYPOINT ["/usr/local/bin/granary"]"#), "{steps:?}");

    // NumPy: the version the python.map tests run.
    let pin = steps.iter().find_map(|s| s.strip_prefix("ARG NUMPY_VERSION=")).expect("ARG NUMPY_VERSION");
    let tested = read("worker/tests/fixtures/python/requirements.txt");
    assert!(
        tested.lines().any(|l| l.trim() == format!("numpy=={pin}")),
        "the tests pin another NumPy:\n{tested}"
    );
    assert!(has(r#"RUN pip install"#) && steps.iter().any(|s| s.contains(r#""numpy==${NUMPY_VERSION}""#)));
}

#[test]
fn the_python_stage_example_builds_from_the_charts_python_image() {
    let stages = stages(&read("examples/python-stage/Dockerfile"));
    assert_eq!(stages.len(), 1);
    let (base, _, steps) = &stages[0];
    let default =
        granary_operator::python::python_variant(&format!("ghcr.io/granary-dev/granary:{}", app_version()));
    assert_eq!(base, &default, "the example builds FROM the image the chart defaults to");
    assert_eq!(steps.last().map(String::as_str), Some("USER 65532:65532"), "back to the nonroot user");
    assert!(steps.iter().any(|s| s.starts_with("RUN pip install") && s.contains("/src/team-augment")));
}
