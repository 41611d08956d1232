//! `parse_manifest` and `load_manifest`: paths, messages, overrides, URL resolution, order.

use granary_crds::manifest::resolve_url;
use granary_crds::{Problem, Problems, load_manifest, parse_manifest};
use std::path::Path;

const GOOD: &str = "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata:
  name: test
spec:
  source:
    url: file:data/train/
    format: files
  stages:
    - op: image.decode
    - op: image.resize
      size: 256
    - op: image.center_crop
      size: 224
  batch:
    size: 32
";

fn base() -> &'static Path {
    Path::new("/srv/pipelines")
}

fn problems(text: &str, overrides: &[&str]) -> Vec<Problem> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    match parse_manifest(text, base(), &overrides) {
        Ok(m) => panic!("accepted: {:?}", m.pipeline.spec),
        Err(Problems(p)) => p,
    }
}

fn find<'a>(problems: &'a [Problem], path: &str) -> &'a Problem {
    problems
        .iter()
        .find(|p| p.path == path)
        .unwrap_or_else(|| panic!("no problem at `{path}` in {problems:#?}"))
}

#[test]
fn good_manifest_parses_and_resolves_relative_urls() {
    let m = parse_manifest(GOOD, base(), &[]).unwrap();
    assert_eq!(m.pipeline.spec.source.as_ref().unwrap().url, "file:///srv/pipelines/data/train/");
    assert_eq!(m.base_dir, base());
    assert_eq!(m.pipeline.metadata.name.as_deref(), Some("test"));
    assert_eq!(m.pipeline.spec.epochs, 1);
}

#[test]
fn url_resolution() {
    let b = base();
    assert_eq!(resolve_url("file:data/train/", b), "file:///srv/pipelines/data/train/");
    assert_eq!(resolve_url("file:../data/x.tar", b), "file:///srv/data/x.tar");
    assert_eq!(resolve_url("file:./a/./b/", b), "file:///srv/pipelines/a/b/");
    assert_eq!(resolve_url("data/train", b), "file:///srv/pipelines/data/train");
    assert_eq!(resolve_url("/abs/data/", b), "file:///abs/data/");
    assert_eq!(resolve_url("file:/abs/data/", b), "file:///abs/data/");
    assert_eq!(resolve_url("file:my data/", b), "file:///srv/pipelines/my%20data/");
    for unchanged in ["file:///x/", "s3://bucket/x/", "memory:///", "", "//host/x", "gs://b"] {
        assert_eq!(resolve_url(unchanged, b), unchanged);
    }
}

#[test]
fn cache_store_resolves_too() {
    let text = format!("{GOOD}  cache:\n    policy: auto\n    store: file:cache/\n");
    let m = parse_manifest(&text, base(), &[]).unwrap();
    assert_eq!(m.pipeline.spec.cache.unwrap().store.as_deref(), Some("file:///srv/pipelines/cache/"));
}

#[test]
fn type_error_names_the_full_path() {
    let p = problems(&GOOD.replace("size: 32", "size: x"), &[]);
    assert_eq!(p, vec![Problem::new("spec.batch.size", "invalid type: string \"x\", expected u32")]);
}

#[test]
fn missing_field_explains_the_field() {
    let p = problems(&GOOD.replace("    url: file:data/train/\n", ""), &[]);
    let url = find(&p, "spec.source.url");
    assert!(url.message.starts_with("missing required field `url`"), "{url}");
    assert!(url.message.contains("Object-store URL"), "{url}");
}

#[test]
fn every_unknown_field_is_reported_with_suggestions() {
    let text = GOOD
        .replace("  batch:\n    size: 32\n", "  batch:\n    size: 32\n    dropRemainer: true\n")
        .replace("    format: files\n", "    format: files\n    fromat: files\n")
        + "  shufle:\n    bufer: 3\n";
    let p = problems(&text, &[]);
    assert_eq!(p.len(), 3, "{p:#?}");
    let drop = find(&p, "spec.batch.dropRemainer");
    assert!(drop.message.contains("did you mean `dropRemainder`?"), "{drop}");
    assert!(drop.message.contains("expected one of `bucket`, `dropRemainder`, `pad`, `size`"), "{drop}");
    find(&p, "spec.source.fromat");
    let shuffle = find(&p, "spec.shufle");
    assert!(shuffle.message.contains("`shuffle`"), "{shuffle}");
    // Document order: source, batch, then the misspelt shuffle.
    let order: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(order, ["spec.source.fromat", "spec.batch.dropRemainer", "spec.shufle"]);
}

#[test]
fn unknown_field_inside_a_stage_names_the_field() {
    let p = problems(&GOOD.replace("      size: 256\n", "      sise: 256\n"), &[]);
    let sise = find(&p, "spec.stages[1].sise");
    assert!(sise.message.contains("did you mean `size`?"), "{sise}");
    find(&p, "spec.stages[1].size");
}

#[test]
fn several_type_errors_are_all_reported() {
    let text = GOOD.replace("size: 32", "size: -1").replace("format: files", "format: avro")
        + "  epochs: many\n  scaling:\n    policy: fxed\n";
    let p = problems(&text, &[]);
    for path in ["spec.batch.size", "spec.source.format", "spec.epochs", "spec.scaling.policy"] {
        find(&p, path);
    }
    assert_eq!(p.len(), 4, "{p:#?}");
}

#[test]
fn yaml_syntax_error_gives_line_and_column() {
    let p = problems("apiVersion: granary.dev/v1alpha1\nkind: [InputPipeline\nmetadata: {}\n", &[]);
    assert_eq!(p.len(), 1);
    assert!(p[0].path.starts_with("line "), "{}", p[0]);
    assert!(p[0].path.contains(", column "), "{}", p[0]);
    assert!(!p[0].message.contains(&format!(" at {}", p[0].path)), "{}", p[0]);
}

#[test]
fn header_checks() {
    let p =
        problems(&GOOD.replace("granary.dev/v1alpha1", "apps/v1").replace("name: test", "name: Test_1"), &[]);
    assert!(find(&p, "apiVersion").message.contains("granary.dev/v1alpha1"));
    let name = find(&p, "metadata.name");
    assert!(name.message.contains("test-1") || name.message.contains("lowercase"), "{name}");
    let p = problems(&GOOD.replace("kind: InputPipeline\n", ""), &[]);
    assert!(find(&p, "kind").message.contains("InputPipeline"));
    let long = "a".repeat(254);
    let p = problems(&GOOD.replace("name: test", &format!("name: {long}")), &[]);
    assert!(find(&p, "metadata.name").message.contains("253"));
}

#[test]
fn overrides_apply_before_validation() {
    let m = parse_manifest(
        GOOD,
        base(),
        &[
            "spec.batch.size=64".into(),
            "spec.stages[1].size=160".into(),
            "spec.source.url=s3://bucket/x/".into(),
            "spec.cache.store=file:cache/".into(),
            "spec.batch.dropRemainder=true".into(),
            "spec.shuffle={buffer: 10}".into(),
        ],
    )
    .unwrap();
    let spec = &m.pipeline.spec;
    assert_eq!(spec.batch.size, 64);
    assert!(spec.batch.drop_remainder);
    assert_eq!(spec.stages[1].params["size"], 160);
    assert_eq!(spec.source.as_ref().unwrap().url, "s3://bucket/x/");
    assert_eq!(spec.shuffle.as_ref().unwrap().buffer, 10);
    assert_eq!(spec.cache.as_ref().unwrap().store.as_deref(), Some("file:///srv/pipelines/cache/"));
}

#[test]
fn bad_overrides_name_the_flag() {
    let p = problems(
        GOOD,
        &[
            "spec.batch.size",
            "spec..x=1",
            "spec.stages[7].size=1",
            "spec.batch.size.x=1",
            "spec.stages.x=1",
            "spec.seed=[1",
        ],
    );
    let paths: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "--set spec.batch.size",
            "--set spec..x",
            "--set spec.stages[7].size",
            "--set spec.batch.size.x",
            "--set spec.stages.x",
            "--set spec.seed"
        ]
    );
    assert!(p[2].message.contains("out of range"), "{}", p[2]);
    assert!(p[2].message.contains("3 items"), "{}", p[2]);
}

#[test]
fn override_values_are_typed_as_yaml() {
    let p = problems(GOOD, &["spec.batch.size=abc"]);
    assert_eq!(p[0].path, "spec.batch.size");
    assert!(p[0].message.contains("string \"abc\""), "{}", p[0]);
}

#[test]
fn validation_problems_follow_decoding() {
    let text = GOOD.replace("size: 224", "size: 0").replace("file:data/train/", "ftp://x/y");
    let p = problems(&text, &[]);
    find(&p, "spec.stages[2].size");
    find(&p, "spec.source.url");
    // Document order: source first.
    assert_eq!(p[0].path, "spec.source.url");
}

#[test]
fn placeholders_do_not_cause_follow_up_problems() {
    // A broken `stages` list yields one problem, not also "must list at least one stage".
    let p = problems(&GOOD.replace("  stages:\n", "  stages: 5\n  old_stages:\n"), &[]);
    let stages: Vec<&Problem> = p.iter().filter(|p| p.path == "spec.stages").collect();
    assert_eq!(stages.len(), 1, "{p:#?}");
    // A missing batch yields one problem, not also `batch.size must be >= 1`.
    let p = problems(&GOOD.replace("  batch:\n    size: 32\n", ""), &[]);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].path, "spec.batch");
}

#[test]
fn non_mapping_documents() {
    for text in ["", "# only a comment\n", "- a\n- b\n", "just text\n", "~\n"] {
        let p = problems(text, &[]);
        assert_eq!(p.len(), 1, "{text:?}: {p:#?}");
        assert!(p[0].path.starts_with("line "), "{text:?}: {p:#?}");
    }
}

#[test]
fn yaml_merge_keys_and_anchors() {
    let text = "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {name: merge}
spec:
  source: {url: 'memory:///', format: files}
  stages:
    - &resize {op: image.decode}
  batch:
    <<: {size: 8}
    dropRemainder: true
";
    let m = parse_manifest(text, base(), &[]).unwrap();
    assert_eq!(m.pipeline.spec.batch.size, 8);
}

#[test]
fn status_in_a_manifest_is_ignored() {
    let text = format!("{GOOD}status:\n  phase: Running\n");
    parse_manifest(&text, base(), &[]).unwrap();
}

#[test]
fn unreadable_file_is_one_problem_at_its_path() {
    let path = Path::new("/nonexistent/granary/pipeline.yaml");
    let Err(Problems(p)) = load_manifest(path, &[]) else { panic!("accepted") };
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].path, path.display().to_string());
}

#[test]
fn load_manifest_resolves_from_the_file_folder() {
    let dir = std::env::temp_dir().join(format!("granary-crds-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let file = dir.join("sub/p.yaml");
    std::fs::write(&file, GOOD).unwrap();
    let m = load_manifest(&file, &[]).unwrap();
    let expected = url::Url::from_directory_path(dir.join("sub/data/train")).unwrap();
    assert_eq!(m.pipeline.spec.source.as_ref().unwrap().url, expected.as_str());
    assert_eq!(m.base_dir, dir.join("sub"));
    std::fs::remove_dir_all(&dir).unwrap();
}
