//! `granary cache ls|inspect|rm` on a `file://` cache written with the library: the table and JSON
//! listings, inspecting by prefix, removing, and exit status 2 for bad input.

mod support;

use std::process::Output;
use support::text;

use granary_store::cache::{CacheStore, EntryInfo, FORMAT_VERSION, Fingerprint};
use serde_json::Value;

/// Two entries share their first 8 digits, so 6- or 8-digit prefixes are ambiguous.
const A: &str = "abcdef0100000000000000000000000000000000000000000000000000000001";
const B: &str = "abcdef0200000000000000000000000000000000000000000000000000000002";
/// An entry without `entry.json`.
const C: &str = "c0ffee0000000000000000000000000000000000000000000000000000000003";

/// A tempdir holding a cache with entries A (info, 2 of 4 splits, an interrupted writer's chunk),
/// B (info, 1 split) and C (1 split, no info), and its URL.
fn fixture() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}/cache/", dir.path().display());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let cache = CacheStore::open(&url).expect("open");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        for (fp, pipeline, splits) in [(A, Some("train"), 2u64), (B, Some("eval"), 1), (C, None, 1)] {
            let fp = Fingerprint::parse(fp).unwrap();
            if let Some(pipeline) = pipeline {
                let info = EntryInfo {
                    format_version: FORMAT_VERSION,
                    fingerprint: fp.to_string(),
                    pipeline: pipeline.into(),
                    source_url: "file:///data/train/".into(),
                    boundary: 2,
                    stage: "resize".into(),
                    stages: vec!["decode_image".into(), "resize".into()],
                    splits_total: 4,
                    created_unix_s: now - 7200,
                    last_used_unix_s: now - 300,
                };
                cache.put_entry_info(&info).await.unwrap();
            }
            for split in 0..splits {
                let mut w = cache.split_writer(&fp, split, "worker-0").with_chunk_limits(usize::MAX, 10);
                for i in 0..25u32 {
                    w.push(&i.to_le_bytes().repeat(i as usize)).await.unwrap();
                }
                w.finish().await.unwrap();
            }
        }
        let mut left = cache
            .split_writer(&Fingerprint::parse(A).unwrap(), 2, "crashed")
            .with_chunk_limits(usize::MAX, 1);
        left.push(b"orphan").await.unwrap();
        drop(left);
    });
    (dir, url)
}

fn granary(args: &[&str]) -> Output {
    support::granary("cache", args)
}

fn succeed(args: &[&str]) -> String {
    support::succeed("cache", args)
}

/// Runs a command that must fail with status 2 and returns its stderr.
fn bad_input(args: &[&str]) -> String {
    let out = granary(args);
    assert_eq!(out.status.code(), Some(2), "granary cache {args:?}\nstderr:\n{}", text(&out.stderr));
    text(&out.stderr)
}

#[test]
fn ls_prints_a_table_and_json() {
    let (_dir, url) = fixture();
    let table = succeed(&["ls", &url]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for column in ["FINGERPRINT", "PIPELINE", "STAGE", "SPLITS", "SIZE", "LAST USED"] {
        assert!(lines[0].contains(column), "{table}");
    }
    let row_a = lines.iter().find(|l| l.starts_with(&A[..12])).expect("row of A");
    assert!(!row_a.contains(&A[..13]), "12 digits only: {row_a}");
    for cell in ["train", "resize", "2/4", "5m ago"] {
        assert!(row_a.contains(cell), "`{cell}` missing from {row_a}");
    }
    let row_c = lines.iter().find(|l| l.starts_with(&C[..12])).expect("row of C");
    assert!(row_c.contains("1/?"), "{row_c}");

    let json: Value = serde_json::from_str(&succeed(&["ls", &url, "--json"])).expect("JSON");
    let entries = json.as_array().expect("array");
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["fingerprint"], A);
    assert_eq!(entries[0]["splits"], 2);
    assert_eq!(entries[0]["info"]["pipeline"], "train");
    assert!(entries[2]["info"].is_null());
    assert!(entries[0]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn inspect_resolves_prefixes() {
    let (_dir, url) = fixture();
    let report = succeed(&["inspect", &url, "ABCDEF01"]);
    for needle in [
        A,
        "train",
        "resize (boundary 2: decode_image → resize)",
        "2 published of 4",
        "unpublished  1 object",
    ] {
        assert!(report.contains(needle), "`{needle}` missing from\n{report}");
    }
    assert!(report.contains("SPLIT") && report.contains("worker-0"), "{report}");

    let json: Value = serde_json::from_str(&succeed(&["inspect", &url, &C[..6], "--json"])).expect("JSON");
    assert_eq!(json["fingerprint"], C);
    assert!(json["info"].is_null());
    assert_eq!(json["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(json["manifests"][0]["elements"], 25);
    assert_eq!(json["unpublishedObjects"], 0);
}

#[test]
fn bad_input_exits_with_status_2() {
    let (_dir, url) = fixture();
    assert!(bad_input(&["inspect", &url, "abcdef"]).contains("ambiguous"));
    assert!(bad_input(&["inspect", &url, "abcde"]).contains("6 to 64 hex digits"));
    assert!(bad_input(&["inspect", &url, "xyzxyzxyz"]).contains("not a fingerprint"));
    assert!(bad_input(&["rm", &url, "123456"]).contains("no cache entry"));
    assert!(bad_input(&["ls", "not a url"]).contains("not a URL"));
    bad_input(&["rm", &url]);
    bad_input(&["rm", &url, "--all", &A[..8]]);
    // Nothing was removed by the failed commands.
    assert_eq!(succeed(&["ls", &url]).lines().count(), 4);
}

#[test]
fn rm_removes_entries_and_says_so() {
    let (_dir, url) = fixture();
    let out = succeed(&["rm", &url, &A[..8], B]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.contains(&format!("removed {A} (10 objects)")), "{out}");
    assert!(out.contains(&format!("removed {B} (5 objects)")), "{out}");
    let left = succeed(&["ls", &url]);
    assert_eq!(left.lines().count(), 2, "{left}");
    assert!(left.contains(&C[..12]));

    let out = succeed(&["rm", &url, "--all"]);
    assert_eq!(out.trim(), format!("removed {C} (4 objects)"));
    assert!(succeed(&["ls", &url]).contains("no cache entries"));
    assert_eq!(
        serde_json::from_str::<Value>(&succeed(&["ls", &url, "--json"])).unwrap(),
        Value::Array(vec![])
    );
}
