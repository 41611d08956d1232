//! `granary bench --compare-optimizer`: a pipeline with the optimizer on and off in one run, on
//! a few generated images, and `granary demo`'s sizes for benchmark data.

mod support;

use serde_json::Value;

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/optimizer/image-misordered.yaml");

#[test]
fn bench_compares_the_optimizer_on_and_off_and_reports_the_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    support::succeed(
        "demo",
        &["--no-run", "--images", "12", "--text-lines", "40", "--table-rows", "300", "--dir", &data],
    );
    let url = format!("spec.source.url=file://{data}/images/train/");
    let flags = ["--warmup", "1", "--batches", "2", "--threads", "1", "--set", "spec.batch.size=4"];
    let mut args = vec![MANIFEST, "--json", "--compare-optimizer", "--fast-only", "--set", &url];
    args.extend_from_slice(&flags);
    let out = support::succeed("bench", &args);
    let r: Value = serde_json::from_str(out.lines().last().expect("a JSON line")).expect("JSON");
    // The crop and the flip move before the uint8 HWC conversion, and each split is shuffled
    // as it is read: three rewrites.
    assert_eq!(r["rewrites"], 3, "{r}");
    for key in ["items_per_s", "unoptimized_items_per_s", "vs_unoptimized"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    // The median round of each side timed 2 batches of 4.
    assert_eq!(r["items"], 8, "{r}");

    let mut args = vec![MANIFEST, "--compare-optimizer", "--fast-only", "--set", &url];
    args.extend_from_slice(&flags);
    let text = support::succeed("bench", &args);
    assert!(
        text.contains("optimizer off") && text.contains("× off (medians of 3 alternating rounds"),
        "{text}"
    );

    // The demo wrote the sizes asked for.
    let rows = std::fs::read_dir(dir.path().join("text"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap().lines().count())
        .sum::<usize>();
    assert_eq!(rows, 40);
}
