//! Projection pushdown: a source read with a [`Projection`] gives the elements it gives without
//! one, restricted to the projected fields, in the same splits, order and keys (Parquet, JSONL
//! and CSV); formats that ignore the projection give every field.
//!
//! `projection_speed` (ignored by default) prints how much faster a projected Parquet read is
//! than a full one, both measured in the same run:
//! `cargo test -p granary-worker --test projection -- --ignored --nocapture`.

use arrow_array::builder::{BinaryBuilder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use granary_crds::SourceSpec;
use granary_worker::source::{Projection, Source, Split};
use granary_worker::{Element, Value};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn spec(dir: &Path, format: &str) -> SourceSpec {
    let url = format!("file://{}/", dir.display());
    serde_json::from_value(serde_json::json!({"url": url, "format": format})).unwrap()
}

/// The source's splits, and every element split by split in listing order.
fn read_all(spec: &SourceSpec, projection: Option<Projection>) -> (Vec<Split>, Vec<Element>) {
    let rt = runtime();
    let source = rt.block_on(Source::open(spec, 8)).unwrap().with_projection(projection);
    let mut out = Vec::new();
    for split in source.splits() {
        source
            .read_split(split, rt.handle(), &mut |e| {
                out.push(e);
                true
            })
            .unwrap();
    }
    (source.splits().to_vec(), out)
}

/// `elements` with only the fields `projection` names.
fn restricted(elements: &[Element], projection: &Projection) -> Vec<Element> {
    elements
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.fields.retain(|(name, _)| projection.contains(name));
            e
        })
        .collect()
}

fn field_names(e: &Element) -> Vec<&str> {
    e.fields.iter().map(|(n, _)| n.as_str()).collect()
}

/// Reads `spec` in full and under each of `projections`, and checks each projected read against
/// the full one restricted. Returns the full elements.
fn check_projections(spec: &SourceSpec, projections: &[&[&str]]) -> Vec<Element> {
    let (splits, full) = read_all(spec, None);
    assert!(!full.is_empty());
    for names in projections {
        let projection = Projection::new(names.iter().copied());
        let (projected_splits, projected) = read_all(spec, Some(projection.clone()));
        assert_eq!(projected_splits, splits, "{names:?}: the splits changed");
        let keys: Vec<&str> = projected.iter().map(|e| e.key.as_str()).collect();
        let full_keys: Vec<&str> = full.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, full_keys, "{names:?}: the elements or their order changed");
        assert_eq!(projected, restricted(&full, &projection), "{names:?}");
    }
    full
}

/// A string of `len` bytes that compresses poorly, different for each `seed`.
fn filler(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// Writes `rows` rows in groups of `group` rows: `id` (int64), `label` (int64, null every
/// seventh row), `text` (utf8), `tokens` (list of int64), and `big` columns of `big_len` bytes.
fn write_parquet(path: &Path, rows: usize, group: usize, big: usize, big_len: usize) {
    let mut columns: Vec<(String, ArrayRef)> = Vec::new();
    let (mut id, mut label, mut text) = (Int64Builder::new(), Int64Builder::new(), StringBuilder::new());
    let mut tokens = ListBuilder::new(Int64Builder::new());
    for r in 0..rows {
        id.append_value(r as i64);
        label.append_option((r % 7 != 0).then_some((r % 10) as i64));
        text.append_value(format!("row {r}"));
        tokens.values().append_slice(&[r as i64, 2 * r as i64]);
        tokens.append(true);
    }
    columns.push(("id".into(), Arc::new(id.finish())));
    columns.push(("label".into(), Arc::new(label.finish())));
    columns.push(("text".into(), Arc::new(text.finish())));
    columns.push(("tokens".into(), Arc::new(tokens.finish())));
    for b in 0..big {
        let mut blob = BinaryBuilder::new();
        for r in 0..rows {
            blob.append_value(filler((b * rows + r) as u64, big_len));
        }
        columns.push((format!("big{b}"), Arc::new(blob.finish())));
    }
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(group)).build();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

#[test]
fn parquet_reads_only_the_projected_columns() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("a.parquet"), 50, 16, 2, 4096);
    write_parquet(&dir.path().join("b.parquet"), 9, 4, 1, 100);
    let spec = spec(dir.path(), "parquet");
    let full = check_projections(
        &spec,
        &[&["label"], &["tokens", "text"], &["big1", "id"], &["label", "absent"], &["absent"], &[]],
    );
    assert_eq!(full.len(), 59);
    assert_eq!(field_names(&full[1]), ["id", "label", "text", "tokens", "big0", "big1"]);
    let (_, labels) = read_all(&spec, Some(Projection::new(["label"])));
    assert!(labels[0].fields.is_empty(), "a null label is left out, as without a projection");
    assert_eq!(labels[1].get("label"), full[1].get("label"));
    let (_, none) = read_all(&spec, Some(Projection::default()));
    assert!(none.iter().all(|e| e.fields.is_empty()));
}

#[test]
fn jsonl_builds_only_the_projected_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = String::new();
    for i in 0..20 {
        let line = serde_json::json!({
            "text": format!("line {i}"),
            "label": i % 3,
            "big": filler(i, 3000),
            "nested": {"list": [i, {"deep": [1, 2, 3]}], "s": "x"},
            "tokens": [i, i + 1],
            "maybe": if i % 4 == 0 { serde_json::Value::Null } else { serde_json::json!(i) },
        });
        a.push_str(&line.to_string());
        a.push('\n');
        if i % 5 == 0 {
            a.push_str("   \n");
        }
    }
    std::fs::write(dir.path().join("a.jsonl"), a).unwrap();
    std::fs::write(
        dir.path().join("b.ndjson"),
        "{\"label\": 9, \"te\\u0078t\": \"escaped\"}\n{\"big\": \"only\"}\n",
    )
    .unwrap();
    let spec = spec(dir.path(), "jsonl");
    let full = check_projections(
        &spec,
        &[&["text", "label"], &["nested", "maybe"], &["tokens"], &["label", "absent"], &["absent"], &[]],
    );
    assert_eq!(full.len(), 22);
    assert_eq!(full[20].get("text"), Some(&Value::Text("escaped".into())));
    let (_, projected) = read_all(&spec, Some(Projection::new(["text"])));
    assert_eq!(field_names(&projected[0]), ["text"]);
    assert_eq!(projected[20].get("text"), Some(&Value::Text("escaped".into())));
    assert!(projected[21].fields.is_empty());
}

#[test]
fn jsonl_lines_that_are_not_objects_fail_with_a_projection_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"text\": \"ok\"}\n[1, 2]\n").unwrap();
    let rt = runtime();
    let spec = spec(dir.path(), "jsonl");
    let source =
        rt.block_on(Source::open(&spec, 8)).unwrap().with_projection(Some(Projection::new(["text"])));
    let mut seen = 0;
    let error = source.read_split(&source.splits()[0], rt.handle(), &mut |_| {
        seen += 1;
        true
    });
    let message = error.unwrap_err().to_string();
    assert!(message.contains("a.jsonl:2") && message.contains("must be a JSON object"), "{message}");
    assert_eq!(seen, 1);
}

#[test]
fn csv_keeps_only_the_projected_columns() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = String::from("id,text,big,label\n");
    for i in 0..30 {
        a.push_str(&format!("{i},\"row, {i}\",{},{}\n", filler(i, 2000), i % 4));
        if i == 10 {
            a.push('\n');
        }
    }
    std::fs::write(dir.path().join("a.csv"), a).unwrap();
    std::fs::write(dir.path().join("b.tsv"), "label\ttext\n1\tx\n2\ty\n").unwrap();
    let spec = spec(dir.path(), "csv");
    let full =
        check_projections(&spec, &[&["label"], &["text", "id"], &["label", "absent"], &["absent"], &[]]);
    assert_eq!(full.len(), 32);
    assert_eq!(field_names(&full[0]), ["id", "text", "big", "label"]);
}

#[test]
fn clearing_the_projection_reads_every_field_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{\"a\": 1, \"b\": 2}\n").unwrap();
    let rt = runtime();
    let mut source = rt.block_on(Source::open(&spec(dir.path(), "jsonl"), 8)).unwrap();
    assert!(source.projection().is_none());
    source.set_projection(Some(Projection::new(["a"])));
    assert_eq!(source.projection().map(|p| p.fields().collect::<Vec<_>>()), Some(vec!["a"]));
    source.set_projection(None);
    let mut fields = Vec::new();
    source
        .read_split(&source.splits()[0], rt.handle(), &mut |e| {
            fields = e.fields.iter().map(|(n, _)| n.clone()).collect();
            true
        })
        .unwrap();
    assert_eq!(fields, ["a", "b"]);
}

/// The fastest of `runs` full reads of every split.
fn fastest_read(spec: &SourceSpec, projection: Option<&Projection>, runs: usize) -> (Duration, usize) {
    let rt = runtime();
    let source = rt.block_on(Source::open(spec, 8)).unwrap().with_projection(projection.cloned());
    let mut best = Duration::MAX;
    let mut count = 0;
    for _ in 0..runs {
        count = 0;
        let start = Instant::now();
        for split in source.splits() {
            source
                .read_split(split, rt.handle(), &mut |e| {
                    count += e.fields.len();
                    true
                })
                .unwrap();
        }
        best = best.min(start.elapsed());
    }
    (best, count)
}

/// Prints full and projected read times of a Parquet file (one small column used of four big
/// ones) and of a JSONL file, measured in the same run. No timing is asserted.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn projection_speed() {
    let dir = tempfile::tempdir().unwrap();
    let parquet_dir = dir.path().join("parquet");
    std::fs::create_dir(&parquet_dir).unwrap();
    write_parquet(&parquet_dir.join("a.parquet"), 16_384, 4096, 4, 1024);
    let jsonl_dir = dir.path().join("jsonl");
    std::fs::create_dir(&jsonl_dir).unwrap();
    let mut lines = String::new();
    for i in 0..16_384u64 {
        let big: Vec<String> = (0..4).map(|b| filler(i * 4 + b, 1024)).collect();
        let line = serde_json::json!({"label": i % 10, "big0": big[0], "big1": big[1], "big2": big[2],
            "big3": big[3], "tokens": (0..64).collect::<Vec<u64>>()});
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    std::fs::write(jsonl_dir.join("a.jsonl"), lines).unwrap();
    let label = Projection::new(["label"]);
    for (name, dir) in [("parquet", &parquet_dir), ("jsonl", &jsonl_dir)] {
        let spec = spec(dir, name);
        let (full, full_fields) = fastest_read(&spec, None, 5);
        let (projected, projected_fields) = fastest_read(&spec, Some(&label), 5);
        println!(
            "{name}: 16384 rows, `label` of 4 x 1 KiB columns and more: full {full:?} ({full_fields} fields), \
             projected {projected:?} ({projected_fields} fields): {:.1}x faster",
            full.as_secs_f64() / projected.as_secs_f64()
        );
    }
}
