//! The `tfrecord`, `csv` and `parquet` sources and WebP decoding, over local files.
//!
//! TFRecord parity: `fixtures/tfrecord/` holds files TensorFlow wrote and `expected.json`, what
//! `tf.data.TFRecordDataset` and `tf.train.Example` read from them (`generate.py` makes both);
//! Granary's reader must give the same records, feature for feature. Lossy WebP: `fixtures/webp/`
//! holds files and libwebp's decode of them (its own `generate.py`).

use bytes::Bytes;
use granary_crds::{InputPipelineSpec, SourceSpec};
use granary_worker::catalog;
use granary_worker::ops::image::decode::decode_rgb8;
use granary_worker::source::tfrecord::example::{
    BytesList, Example, Feature, FeatureKind, Features, Int64List,
};
use granary_worker::source::tfrecord::record::write_record;
use granary_worker::source::{Source, SourceError};
use granary_worker::{Element, Engine, EngineOptions, FieldName, Tensor, TensorData, Value};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn url_of(path: &Path) -> String {
    let mut url = format!("file://{}", path.display());
    if path.is_dir() {
        url.push('/');
    }
    url
}

/// A source spec from its manifest fields, e.g. `{"format": "csv", "delimiter": ";"}`.
fn source_spec(path: &Path, fields: serde_json::Value) -> SourceSpec {
    let mut value = serde_json::json!({"url": url_of(path)});
    if let (Some(map), Some(extra)) = (value.as_object_mut(), fields.as_object()) {
        map.extend(extra.clone());
    }
    serde_json::from_value(value).unwrap()
}

/// Every element of the source, split by split in listing order.
fn read_all(spec: &SourceSpec) -> Result<Vec<Element>, SourceError> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let source = rt.block_on(Source::open(spec, 8))?;
    let mut out = Vec::new();
    for split in source.splits() {
        source.read_split(split, rt.handle(), &mut |e| {
            out.push(e);
            true
        })?;
    }
    Ok(out)
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// The field(s) Granary should give for one feature as TensorFlow read it.
fn expected_fields(name: &str, feature: &serde_json::Value) -> Vec<(FieldName, Value)> {
    let values = feature["values"].as_array().unwrap();
    let shape = if values.len() == 1 { vec![] } else { vec![values.len()] };
    match feature["kind"].as_str().unwrap() {
        "int64_list" => {
            let v = values.iter().map(|x| x.as_i64().unwrap()).collect();
            vec![(name.into(), Value::Tensor(Tensor { shape, data: TensorData::I64(v) }))]
        }
        "float_list" => {
            let v = values.iter().map(|x| x.as_f64().unwrap() as f32).collect();
            vec![(name.into(), Value::Tensor(Tensor { shape, data: TensorData::F32(v) }))]
        }
        "bytes_list" => {
            let blobs: Vec<Value> =
                values.iter().map(|x| Value::Bytes(Bytes::from(hex(x.as_str().unwrap())))).collect();
            match blobs.len() {
                1 => vec![(name.into(), blobs[0].clone())],
                _ => blobs.into_iter().enumerate().map(|(i, v)| (format!("{name}/{i}").into(), v)).collect(),
            }
        }
        other => panic!("unknown kind {other}"),
    }
}

#[test]
fn tfrecord_reads_what_tensorflow_reads() {
    let dir = fixtures("tfrecord");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let files = expected["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    let mut pngs = 0;
    for file in files {
        let name = file["file"].as_str().unwrap();
        // The GZIP file without a `.gz` suffix needs the option; the others go by name.
        let fields = match name {
            "gzip-00000-of-00001" => serde_json::json!({"format": "tfrecord", "compression": "gzip"}),
            _ => serde_json::json!({"format": "tfrecord"}),
        };
        let got = read_all(&source_spec(&dir.join(name), fields)).unwrap();
        let records = file["records"].as_array().unwrap();
        assert_eq!(got.len(), records.len(), "{name}");
        for (i, (element, record)) in got.iter().zip(records).enumerate() {
            assert_eq!(element.key, format!("{name}#{i}"));
            let mut want = Vec::new();
            for (feature, value) in record.as_object().unwrap() {
                if value.is_null() {
                    continue; // a feature with no list set gives no field
                }
                want.extend(expected_fields(feature, value));
                if let Some(decoded) = value.get("decoded") {
                    // image.decode gives what tf.io.decode_png gives.
                    let Some(Value::Bytes(png)) = element.get(feature) else { panic!("{feature}") };
                    let (h, w, pixels) = decode_rgb8(png).unwrap();
                    let shape: Vec<usize> = decoded["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect();
                    assert_eq!(vec![h, w, 3], shape);
                    let tf: Vec<u8> = decoded["pixels"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u8)
                        .collect();
                    assert_eq!(pixels, tf, "{name} record {i}");
                    pngs += 1;
                }
            }
            want.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(element.fields, want, "{name} record {i}");
        }
    }
    assert!(pngs >= 3, "the fixtures hold PNG features");
}

/// Start offsets of the records of a plain TFRecord file, walked by their lengths.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        offsets.push(at);
        let mut length = [0u8; 8];
        length.copy_from_slice(&bytes[at..at + 8]);
        at += 16 + u64::from_le_bytes(length) as usize;
    }
    offsets
}

#[test]
fn a_corrupt_tfrecord_names_the_file_and_the_record_offset() {
    let original = std::fs::read(fixtures("tfrecord/plain.tfrecord")).unwrap();
    let offsets = record_offsets(&original);
    assert_eq!(offsets.len(), 4);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord");
    let read = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        read_all(&source_spec(&path, serde_json::json!({"format": "tfrecord"}))).unwrap_err().to_string()
    };
    let file = path.display().to_string();
    let file = file.trim_start_matches('/');

    // A flipped data byte of record 2: the data CRC.
    let mut bytes = original.clone();
    bytes[offsets[2] + 20] ^= 0x10;
    let err = read(&bytes);
    let at = format!("record 2 at byte offset {}", offsets[2]);
    assert!(err.contains(file) && err.contains(&at) && err.contains("CRC of the data"), "{err}");

    // A flipped length byte of record 1: the length CRC.
    let mut bytes = original.clone();
    bytes[offsets[1]] ^= 0x01;
    let err = read(&bytes);
    let at = format!("record 1 at byte offset {}", offsets[1]);
    assert!(err.contains(file) && err.contains(&at) && err.contains("CRC of the length"), "{err}");

    // A file cut inside record 3, anywhere.
    for cut in [offsets[3] + 5, offsets[3] + 12, offsets[3] + 40, original.len() - 1] {
        let err = read(&original[..cut]);
        let at = format!("record 3 at byte offset {}: truncated", offsets[3]);
        assert!(err.contains(file) && err.contains(&at), "{cut}: {err}");
    }

    // The planner counts from the record headers: a damaged header fails the count the same
    // way; damaged data is found by reading (above), not by counting, which skips it.
    let describe = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        catalog::describe(&pipeline(&path, serde_json::json!({"format": "tfrecord"})))
    };
    let mut bytes = original.clone();
    bytes[offsets[1]] ^= 0x01;
    let err = describe(&bytes).unwrap_err().to_string();
    assert!(err.contains(&format!("record 1 at byte offset {}", offsets[1])), "{err}");
    let err = describe(&original[..offsets[3] + 40]).unwrap_err().to_string();
    assert!(err.contains(&format!("record 3 at byte offset {}: truncated", offsets[3])), "{err}");
    let mut bytes = original.clone();
    bytes[offsets[0] + 13] ^= 0x80;
    let counted = describe(&bytes).unwrap();
    assert_eq!(counted.iter().map(|s| s.elements).sum::<u64>(), 4);
}

#[test]
fn a_damaged_gzip_tfrecord_is_an_error_not_a_panic() {
    let original = std::fs::read(fixtures("tfrecord/compressed.tfrecord.gz")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.tfrecord.gz");
    for cut in [5, 30, original.len() / 2, original.len() - 3] {
        std::fs::write(&path, &original[..cut]).unwrap();
        let err =
            read_all(&source_spec(&path, serde_json::json!({"format": "tfrecord"}))).unwrap_err().to_string();
        assert!(err.contains("bad.tfrecord.gz") && err.contains("of the decompressed data"), "{cut}: {err}");
    }
    // A plain file read as GZIP says what to set.
    let path = dir.path().join("plain.tfrecord");
    std::fs::copy(fixtures("tfrecord/plain.tfrecord"), &path).unwrap();
    let spec = source_spec(&path, serde_json::json!({"format": "tfrecord", "compression": "gzip"}));
    let err = read_all(&spec).unwrap_err().to_string();
    assert!(err.contains("compression: none"), "{err}");
}

/// A Parquet file of one INT64 column `x` holding 1, 2, 3 and 4, as the parquet crate writes it.
fn four_numbers() -> Vec<u8> {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    let column: ArrayRef = std::sync::Arc::new(Int64Array::from(vec![1, 2, 3, 4]));
    let batch = RecordBatch::try_from_iter([("x", column)]).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(Vec::new(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.into_inner().unwrap()
}

#[test]
fn a_parquet_page_header_that_would_keep_the_reader_skipping_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("numbers.parquet");
    let original = four_numbers();
    // Before the first page header's first field (the page type, id 1 by a delta of 1), a field
    // of id 0 that no version of the format has: a list of 2^31 - 1 booleans, in 8 bytes. The
    // parquet crate skips such a list one element at a time, taking no byte for each: minutes of
    // a worker's thread.
    assert_eq!(original[4], 0x15, "the page type first");
    let list = [0x09, 0x00, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];
    let bytes = [&original[..4], &list[..], &original[4..]].concat();
    std::fs::write(&path, &bytes).unwrap();
    let spec = source_spec(&path, serde_json::json!({"format": "parquet"}));
    let err = read_all(&spec).unwrap_err().to_string();
    assert!(err.contains("numbers.parquet") && err.contains("page 0") && err.contains("steps"), "{err}");
}

#[test]
fn a_parquet_file_whose_closing_bytes_are_wrong_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("numbers.parquet");
    let original = four_numbers();
    let n = original.len();
    let closing = |len: u32, magic: &[u8]| [&original[..n - 8], &len.to_le_bytes()[..], magic].concat();
    let len = u32::from_le_bytes(original[n - 8..n - 4].try_into().unwrap());
    let spec = source_spec(&path, serde_json::json!({"format": "parquet"}));
    for (why, bytes) in [
        ("shorter than the closing bytes", b"PAR1".to_vec()),
        ("a footer longer than the file", closing(n as u32, b"PAR1")),
        ("an empty footer", closing(0, b"PAR1")),
        ("no closing magic", closing(len, b"PAR2")),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let err = read_all(&spec).unwrap_err().to_string();
        eprintln!("{why}: {err}");
        assert!(
            err.contains("numbers.parquet") && err.contains("not a readable Parquet file"),
            "{why}: {err}"
        );
    }
    std::fs::write(&path, closing(len, b"PAR1")).unwrap();
    assert_eq!(read_all(&spec).unwrap().len(), 4, "the file as written reads");
}

#[test]
fn a_parquet_footer_that_would_keep_the_reader_skipping_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("numbers.parquet");
    let original = four_numbers();
    // At the start of the footer, a field of id 0 that no version of the format has: a list of
    // 2^31 - 1 booleans, in 8 bytes, which the parquet crate skips one element at a time, taking
    // no byte for each. The footer's length, before the closing `PAR1`, grows by 8.
    let n = original.len();
    let len = u32::from_le_bytes(original[n - 8..n - 4].try_into().unwrap());
    let footer_at = n - 8 - len as usize;
    let list = [0x09, 0x00, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];
    let bytes = [
        &original[..footer_at],
        &list[..],
        &original[footer_at..n - 8],
        &(len + 8).to_le_bytes()[..],
        b"PAR1",
    ]
    .concat();
    std::fs::write(&path, &bytes).unwrap();
    let spec = source_spec(&path, serde_json::json!({"format": "parquet"}));
    let err = read_all(&spec).unwrap_err().to_string();
    assert!(err.contains("numbers.parquet") && err.contains("footer") && err.contains("steps"), "{err}");
}

#[test]
fn a_parquet_dictionary_claiming_more_values_than_its_bytes_is_refused_before_decoding() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.parquet");
    let column: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a", "b", "a", "b"]));
    let batch = RecordBatch::try_from_iter([("text", column)]).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(Vec::new(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    let original = writer.into_inner().unwrap();
    let spec = source_spec(&path, serde_json::json!({"format": "parquet"}));
    std::fs::write(&path, &original).unwrap();
    assert_eq!(read_all(&spec).unwrap().len(), 4, "the file as written reads");

    // The column chunk starts after `PAR1` with its dictionary page: type 2 (`0x15 0x04`), the
    // sizes, then the dictionary page header (field 7, a struct) whose first field is the count
    // of values, 2 (zigzag 4). Claim 63 (the most one byte holds) in the page's 10 bytes.
    assert_eq!(original[4..6], [0x15, 0x04], "a dictionary page first");
    let at = (6..40)
        .find(|&i| matches!(original[i], 0x3c | 0x4c) && original[i + 1..i + 3] == [0x15, 0x04])
        .expect("the dictionary page header's count")
        + 2;
    let mut bytes = original.clone();
    bytes[at] = 0x7e;
    std::fs::write(&path, &bytes).unwrap();
    let err = read_all(&spec).unwrap_err().to_string();
    assert!(
        err.contains("words.parquet") && err.contains("dictionary page") && err.contains("claims 63 values"),
        "{err}"
    );
}

/// A pipeline spec over `path` with the given source fields, for the catalog.
fn pipeline(path: &Path, source: serde_json::Value) -> InputPipelineSpec {
    let spec = serde_json::json!({
        "source": source_spec(path, source),
        "stages": [{"op": "test.sleep", "ms": 0}],
        "batch": {"size": 4},
    });
    serde_json::from_value(spec).unwrap()
}

fn example(label: i64, image: Vec<u8>) -> Vec<u8> {
    let mut feature = BTreeMap::new();
    feature.insert(
        "label".to_string(),
        Feature { kind: Some(FeatureKind::Int64List(Int64List { value: vec![label] })) },
    );
    feature.insert(
        "image".to_string(),
        Feature { kind: Some(FeatureKind::BytesList(BytesList { value: vec![Bytes::from(image)] })) },
    );
    Example { features: Some(Features { feature }) }.encode_to_vec()
}

fn png(w: u32, h: u32, seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8 * 20 + seed, y as u8 * 30, seed]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
fn tfrecord_shards_are_listed_counted_and_run_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut label = 0;
    for (name, records) in [("train-00000-of-00002", 5), ("train-00001-of-00002", 3)] {
        let mut file = Vec::new();
        for _ in 0..records {
            write_record(&mut file, &example(label, png(6, 4, label as u8)));
            label += 1;
        }
        std::fs::write(dir.path().join(name), file).unwrap();
    }
    std::fs::write(dir.path().join("dataset_info.json"), "{}").unwrap();
    let facts = catalog::describe(&pipeline(dir.path(), serde_json::json!({"format": "tfrecord"}))).unwrap();
    let counts: Vec<u64> = facts.iter().map(|f| f.elements).collect();
    assert_eq!(counts, [5, 3]);

    let text = format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  \
         source: {{url: \"{}\", format: tfrecord}}\n  stages:\n    - {{op: table.select, columns: [image, label]}}\n    \
         - op: image.decode\n  batch: {{size: 3}}\n",
        url_of(dir.path())
    );
    let manifest = granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap();
    let engine = Engine::open(&manifest, EngineOptions { threads: 2, ..Default::default() }).unwrap();
    let batches = engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap();
    let mut keys: Vec<(String, i64)> = Vec::new();
    for b in &batches {
        assert_eq!(b.tensor("image").unwrap().shape[1..], [4, 6, 3]);
        let labels: &[i64] = bytemuck::cast_slice(&b.tensor("label").unwrap().data);
        keys.extend(b.keys.iter().cloned().zip(labels.iter().copied()));
    }
    keys.sort();
    let want: Vec<(String, i64)> = (0..8)
        .map(|l| {
            if l < 5 {
                (format!("train-00000-of-00002#{l}"), l)
            } else {
                (format!("train-00001-of-00002#{}", l - 5), l)
            }
        })
        .collect();
    assert_eq!(keys, want);
}

fn text(s: &str) -> Value {
    Value::Text(s.to_string())
}

fn int(v: i64) -> Value {
    Value::Tensor(Tensor::scalar_i64(v))
}

fn float(v: f64) -> Value {
    Value::Tensor(Tensor::scalar_f64(v))
}

#[test]
fn csv_rows_become_typed_elements() {
    let dir = tempfile::tempdir().unwrap();
    let csv = "\u{feff}id,label,score,caption\r\n\
               007,1,0.5,\"a, quoted \"\"caption\"\"\"\r\n\
               \r\n\
               x2,-4,1e2,\"two\nlines\"\r\n\
               x3,12345678901234,,plain\r\n";
    std::fs::write(dir.path().join("rows.csv"), csv).unwrap();
    let got = read_all(&source_spec(dir.path(), serde_json::json!({"format": "csv"}))).unwrap();
    fn fields(e: &Element) -> Vec<(&str, Value)> {
        e.fields.iter().map(|(n, v)| (n.as_str(), v.clone())).collect()
    }
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].key, "rows.csv#0");
    assert_eq!(
        fields(&got[0]),
        [
            ("id", text("007")),
            ("label", int(1)),
            ("score", float(0.5)),
            ("caption", text("a, quoted \"caption\""))
        ]
    );
    assert_eq!(got[1].key, "rows.csv#1");
    assert_eq!(
        fields(&got[1]),
        [("id", text("x2")), ("label", int(-4)), ("score", float(100.0)), ("caption", text("two\nlines"))]
    );
    assert_eq!(
        fields(&got[2]),
        [
            ("id", text("x3")),
            ("label", int(12_345_678_901_234)),
            ("score", text("")),
            ("caption", text("plain"))
        ]
    );
}

#[test]
fn csv_delimiters_and_tsv_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), "x;y\n1;\"2;3\"\n").unwrap();
    let got =
        read_all(&source_spec(dir.path(), serde_json::json!({"format": "csv", "delimiter": ";"}))).unwrap();
    assert_eq!(got[0].fields, [("x".into(), int(1)), ("y".into(), text("2;3"))]);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.tsv"), "x\ty\n1\ta,b\n").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a table").unwrap();
    let got = read_all(&source_spec(dir.path(), serde_json::json!({"format": "csv"}))).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, "b.tsv#0");
    assert_eq!(got[0].fields, [("x".into(), int(1)), ("y".into(), text("a,b"))]);
}

#[test]
fn csv_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.csv");
    let read = |content: &str| {
        std::fs::write(&path, content).unwrap();
        read_all(&source_spec(&path, serde_json::json!({"format": "csv"}))).unwrap_err().to_string()
    };
    let err = read("a,b\n1,2\n3\n");
    assert!(err.contains("bad.csv:3") && err.contains("1 cells but the header has 2"), "{err}");
    let err = read("a,a\n1,2\n");
    assert!(err.contains("bad.csv:1") && err.contains("`a` twice"), "{err}");
    let err = read("a,\n1,2\n");
    assert!(err.contains("column 2") && err.contains("no name"), "{err}");
    let err = {
        std::fs::write(&path, b"a,b\n1,\xff\xfe\n").unwrap();
        read_all(&source_spec(&path, serde_json::json!({"format": "csv"}))).unwrap_err().to_string()
    };
    assert!(err.contains("bad.csv:2") && err.contains("not UTF-8"), "{err}");

    // Counting reads every row, so the planner fails on the same row.
    std::fs::write(&path, "a,b\n1,2\n3\n").unwrap();
    let err = catalog::describe(&pipeline(&path, serde_json::json!({"format": "csv"}))).unwrap_err();
    assert!(err.to_string().contains("bad.csv:3"), "{err}");
    std::fs::write(&path, "a,b\n1,2\n\n3,4\n").unwrap();
    let facts = catalog::describe(&pipeline(&path, serde_json::json!({"format": "csv"}))).unwrap();
    assert_eq!(facts[0].elements, 2);
}

#[test]
fn csv_runs_through_the_engine_with_a_cast() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = String::from("label,x,id\n");
    for i in 0..10 {
        rows.push_str(&format!("{i},{}.5,0{i}\n", i * 2));
    }
    std::fs::write(dir.path().join("t.csv"), rows).unwrap();
    let text = format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  \
         source: {{url: \"{}\", format: csv}}\n  stages:\n    - {{op: table.cast, columns: {{id: int32, x: float32}}}}\n  \
         batch: {{size: 4}}\n",
        url_of(dir.path())
    );
    let manifest = granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap();
    let engine = Engine::open(&manifest, EngineOptions { threads: 1, ..Default::default() }).unwrap();
    let batches = engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap();
    let mut ids: Vec<i32> = Vec::new();
    let mut xs: Vec<f32> = Vec::new();
    for b in &batches {
        ids.extend_from_slice(bytemuck::cast_slice(&b.tensor("id").unwrap().data));
        xs.extend_from_slice(bytemuck::cast_slice(&b.tensor("x").unwrap().data));
    }
    ids.sort();
    xs.sort_by(f32::total_cmp);
    assert_eq!(ids, (0..10).collect::<Vec<i32>>());
    assert_eq!(xs, (0..10).map(|i| i as f32 * 2.0 + 0.5).collect::<Vec<f32>>());
}

#[test]
fn validate_names_the_source_fields() {
    let problems = |yaml_source: &str, stages: &str| {
        let text = format!(
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  \
             source: {yaml_source}\n  stages:\n{stages}  batch: {{size: 4}}\n"
        );
        match granary_crds::parse_manifest(&text, Path::new("/"), &[]) {
            Ok(_) => Vec::new(),
            Err(p) => p.0.into_iter().map(|p| format!("{}: {}", p.path, p.message)).collect::<Vec<_>>(),
        }
    };
    let table = "    - {op: table.cast, columns: {a: int64}}\n";
    let image = "    - op: image.decode\n";
    assert_eq!(
        problems("{url: s3://b/t/, format: tfrecord, compression: gzip}", table),
        Vec::<String>::new()
    );
    assert_eq!(problems("{url: s3://b/t/, format: tfrecord}", image), Vec::<String>::new());
    assert_eq!(problems("{url: s3://b/t/, format: csv, delimiter: \"\\t\"}", table), Vec::<String>::new());

    let p = problems("{url: s3://b/t/, format: csv, compression: gzip}", table);
    assert!(
        p.len() == 1 && p[0].starts_with("spec.source.compression: applies only to `format: tfrecord`"),
        "{p:?}"
    );
    let p = problems("{url: s3://b/t/, format: tfrecord, delimiter: \";\"}", table);
    assert!(
        p.len() == 1 && p[0].starts_with("spec.source.delimiter: applies only to `format: csv`"),
        "{p:?}"
    );
    let p = problems("{url: s3://b/t/, format: csv, delimiter: \"\\\"\"}", table);
    assert!(p.len() == 1 && p[0].starts_with("spec.source.delimiter: "), "{p:?}");
    let p = problems("{url: s3://b/t/, format: csv, delimiter: \";;\"}", table);
    assert!(!p.is_empty() && p.iter().all(|p| p.starts_with("spec.source.delimiter")), "{p:?}");
    let p = problems("{url: s3://b/t/, format: csv, compression: zstd}", table);
    assert!(!p.is_empty() && p[0].starts_with("spec.source.compression"), "{p:?}");
    let p = problems("{url: s3://b/t/, format: csv}", image);
    assert!(
        p.len() == 1
            && p[0].starts_with("spec.stages[0].op: `image.decode` does not fit spec.source.format `csv`"),
        "{p:?}"
    );
}

fn webp_lossless(pixels: &[u8], w: u32, h: u32, color: image::ExtendedColorType) -> Vec<u8> {
    use image::ImageEncoder;
    let mut out = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut out).write_image(pixels, w, h, color).unwrap();
    out
}

#[test]
fn webp_lossless_and_lossy_decode() {
    // Lossless, made here: exact.
    let rgb: Vec<u8> = (0..9 * 7 * 3).map(|i| (i * 37 % 256) as u8).collect();
    let (h, w, got) = decode_rgb8(&webp_lossless(&rgb, 9, 7, image::ExtendedColorType::Rgb8)).unwrap();
    assert_eq!((h, w), (7, 9));
    assert_eq!(got, rgb);

    // Lossy, made by libwebp: exactly as libwebp decodes it (alpha dropped).
    let dir = fixtures("webp");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    for name in ["lossy.webp", "lossy_alpha.webp"] {
        let want = &expected[name];
        let (h, w, got) = decode_rgb8(&std::fs::read(dir.join(name)).unwrap()).unwrap();
        assert_eq!((h as u64, w as u64), (want["height"].as_u64().unwrap(), want["width"].as_u64().unwrap()));
        let want: Vec<u8> =
            want["pixels"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u8).collect();
        assert_eq!(got, want, "{name}: differs from libwebp");
    }
}
