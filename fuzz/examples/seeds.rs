//! Writes the seed corpora, `fuzz/corpus/<target>/`: small, valid inputs of each format, from
//! which the fuzzers start. Run `cargo run -p granary-fuzz --example seeds` after changing a
//! target's input layout, and commit the result.

use granary_fuzz::TARGETS;
use granary_proto::v1 as pb;
use granary_store::cache::{ChunkMeta, SplitManifest};
use granary_worker::source::tfrecord::example::{
    BytesList, Example, Feature, FeatureKind, Features, Int64List,
};
use granary_worker::source::tfrecord::record::write_record;
use image::{ExtendedColorType, ImageEncoder};
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let all: Vec<(&str, Seeds)> = vec![
        ("manifest", manifests()),
        ("dispatcher_requests", dispatcher_requests()),
        ("worker_requests", worker_requests()),
        ("image_decode", images()),
        ("source_webdataset", webdataset()),
        ("source_tfrecord", tfrecord()),
        ("source_jsonl", jsonl()),
        ("source_csv", csv()),
        ("source_parquet", parquet()),
        ("cache", cache()),
    ];
    assert_eq!(all.len(), TARGETS.len(), "a target has no seeds");
    for (target, seeds) in all {
        let dir: PathBuf = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

fn framed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u16).to_le_bytes());
    out.extend(bytes);
}

fn manifests() -> Seeds {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seeds: Seeds = Vec::new();
    for name in ["imagenet-resnet50.yaml", "bert-tokenize.yaml", "parquet-features.yaml"] {
        seeds.push((name, std::fs::read(examples.join(name)).unwrap()));
    }
    seeds.push((
        "overrides.yaml",
        b"#set spec.batch.size=4\n#set spec.stages[1].size=32\napiVersion: granary.dev/v1alpha1\n\
          kind: InputPipeline\nmetadata: {name: p, namespace: ml}\nspec:\n  source: {url: \"file:data/\", \
          format: webdataset}\n  stages:\n  - {op: image.decode}\n  - {op: image.center_crop, size: 16}\n  \
          - {op: image.normalize, dtype: uint8}\n  batch: {size: 8, dropRemainder: true}\n  \
          shuffle: {buffer: 64, seed: 3}\n  epochs: 2\n"
            .to_vec(),
    ));
    seeds.push((
        "mixed.yaml",
        b"apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: mix}\nspec:\n  \
          sources:\n  - {source: {url: \"s3://b/a/\", format: jsonl}, weight: 2}\n  \
          - {source: {url: \"s3://b/c/\", format: tfrecord}, weight: 1}\n  \
          stages: [{op: text.tokenize, field: text, tokenizer: {kind: bytes}, maxLength: 8}]\n  \
          batch: {size: 4}\n"
            .to_vec(),
    ));
    seeds
}

fn dispatcher_requests() -> Seeds {
    const FILL: u8 = 0x80;
    let message = |kind: u8, m: &dyn Fn() -> Vec<u8>| {
        let mut out = vec![kind];
        framed(&mut out, &m());
        out
    };
    let worker = pb::RegisterWorkerRequest {
        address: "127.0.0.1:1".into(),
        worker_id: "w".into(),
        cores: 2,
        ..Default::default()
    };
    let client = pb::RegisterClientRequest { num_consumers: 2, ..Default::default() };
    let mut lease_cycle = Vec::new();
    lease_cycle.extend(message(2 | FILL, &|| worker.encode_to_vec()));
    lease_cycle.extend(message(9 | FILL, &|| client.encode_to_vec()));
    for _ in 0..2 {
        lease_cycle.extend(message(4 | FILL, &|| pb::LeaseSplitRequest::default().encode_to_vec()));
        lease_cycle.extend(message(7 | FILL, &|| {
            pb::CountSplitRequest { elements: 4, ..Default::default() }.encode_to_vec()
        }));
        lease_cycle.extend(message(6 | FILL, &|| {
            pb::CompleteSplitRequest { elements: 4, ..Default::default() }.encode_to_vec()
        }));
    }
    lease_cycle.extend(message(3 | FILL, &|| pb::WorkerHeartbeatRequest::default().encode_to_vec()));
    lease_cycle.extend(message(8 | FILL, &|| {
        pb::ReturnLeaseRequest { error: "bad".into(), ..Default::default() }.encode_to_vec()
    }));

    let mut consumer = Vec::new();
    consumer.extend(message(9 | FILL, &|| client.encode_to_vec()));
    consumer.extend(message(10 | FILL, &|| {
        pb::ClientHeartbeatRequest { delivered: 3, ..Default::default() }.encode_to_vec()
    }));
    consumer.extend(message(11 | FILL, &|| {
        pb::GetEpochPlanRequest { epoch: 0, ..Default::default() }.encode_to_vec()
    }));
    consumer.extend(message(12 | FILL, &|| {
        pb::RequestReplayRequest { splits: vec![0, 1], ..Default::default() }.encode_to_vec()
    }));
    consumer.extend(message(13, &|| pb::ListWorkersRequest { pipeline: "p".into() }.encode_to_vec()));
    consumer.extend(message(1, &|| pb::GetPipelineRequest { name: "p".into() }.encode_to_vec()));

    let mut every_kind = Vec::new();
    for kind in 0..15u8 {
        every_kind.extend(message(kind | FILL, &Vec::new));
    }
    let register = message(FILL, &|| {
        pb::RegisterPipelineRequest { name: "q".into(), ..Default::default() }.encode_to_vec()
    });
    vec![
        ("lease-cycle", lease_cycle),
        ("consumer", consumer),
        ("every-kind", every_kind),
        ("register", register),
    ]
}

fn worker_requests() -> Seeds {
    let request = pb::StreamBatchesRequest {
        pipeline: "p".into(),
        job: "j".into(),
        consumer_index: 1,
        client_id: "c".into(),
        capability: String::new(),
    };
    let manifest = br#"{"apiVersion":"granary.dev/v1alpha1","kind":"InputPipeline","metadata":{"name":"p"},"spec":{"source":{"url":"file:///d/","format":"files"},"stages":[{"op":"image.decode"},{"op":"image.center_crop","size":8}],"batch":{"size":2}}}"#;
    let mut seeds = Vec::new();
    for (name, setup) in [("open", 0u8), ("signed", 1 | 2 | 4 | 8), ("unsigned", 1 | 2), ("unregistered", 1)]
    {
        let mut out = vec![setup];
        framed(&mut out, manifest);
        framed(&mut out, &request.encode_to_vec());
        framed(
            &mut out,
            &pb::StreamBatchesRequest { pipeline: "q".into(), ..request.clone() }.encode_to_vec(),
        );
        seeds.push((name, out));
    }
    seeds
}

/// A `height × width` RGB test pattern.
fn pattern(height: u32, width: u32) -> Vec<u8> {
    (0..height * width).flat_map(|i| [(i * 7) as u8, (i / width * 9) as u8, (i % width * 5) as u8]).collect()
}

fn jpeg(height: u32, width: u32) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
        .write_image(&pattern(height, width), width, height, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn images() -> Seeds {
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&pattern(12, 10), 10, 12, ExtendedColorType::Rgb8)
        .unwrap();
    let mut png16 = Vec::new();
    let gray16: Vec<u8> = (0..8 * 8u16).flat_map(|v| (v * 1000).to_ne_bytes()).collect();
    image::codecs::png::PngEncoder::new(&mut png16)
        .write_image(&gray16, 8, 8, ExtendedColorType::L16)
        .unwrap();
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
        .write_image(&pattern(9, 11), 11, 9, ExtendedColorType::Rgb8)
        .unwrap();
    // Parameters: seed, scale (high bit: a mismatched header), window left, top, width, height.
    let params = |seed: u8, num: u8, window: [u16; 4]| {
        let mut out = vec![seed, num];
        for w in window {
            out.extend(w.to_le_bytes());
        }
        out
    };
    vec![
        ("jpeg-whole", [params(1, 8, [0, 0, 48, 32]), jpeg(32, 48)].concat()),
        ("jpeg-window", [params(2, 4, [8, 3, 12, 9]), jpeg(32, 48)].concat()),
        ("jpeg-mismatch", [params(16, 0x88, [0, 0, 48, 32]), jpeg(32, 48)].concat()),
        ("png", [params(3, 8, [0, 0, 10, 12]), png].concat()),
        ("png-gray16", [params(4, 8, [0, 0, 8, 8]), png16].concat()),
        ("webp", [params(5, 8, [0, 0, 11, 9]), webp].concat()),
    ]
}

fn webdataset() -> Seeds {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("a/0001.jpg", jpeg(8, 8)),
        ("a/0001.cls", b"3".to_vec()),
        ("a/0002.jpg", jpeg(8, 8)),
        ("a/0002.json", br#"{"label": 1}"#.to_vec()),
        ("a/0002.txt", b"two".to_vec()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, data.as_slice()).unwrap();
    }
    vec![("shard.tar", builder.into_inner().unwrap())]
}

fn tfrecord() -> Seeds {
    let example = |label: i64, text: &[u8]| {
        let mut feature = std::collections::BTreeMap::new();
        feature.insert(
            "label".to_string(),
            Feature { kind: Some(FeatureKind::Int64List(Int64List { value: vec![label] })) },
        );
        feature.insert(
            "text".to_string(),
            Feature {
                kind: Some(FeatureKind::BytesList(BytesList {
                    value: vec![bytes::Bytes::copy_from_slice(text)],
                })),
            },
        );
        Example { features: Some(Features { feature }) }.encode_to_vec()
    };
    let mut plain = Vec::new();
    write_record(&mut plain, &example(1, b"one"));
    write_record(&mut plain, &example(2, b"two"));
    let gz = gzip_stored(&plain);
    vec![("two.tfrecord", plain), ("two.tfrecord.gz", gz)]
}

/// `bytes` as a gzip member of one stored (uncompressed) deflate block: valid gzip without a
/// compressor; `bytes` must be under 64 KiB.
fn gzip_stored(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.push(1); // final block, stored
    let len = bytes.len() as u16;
    out.extend(len.to_le_bytes());
    out.extend((!len).to_le_bytes());
    out.extend(bytes);
    out.extend(crc32fast::hash(bytes).to_le_bytes());
    out.extend((bytes.len() as u32).to_le_bytes());
    out
}

fn jsonl() -> Seeds {
    vec![
        ("rows.jsonl", b"{\"text\": \"a\", \"label\": 1, \"x\": [1.5, 2]}\n{\"text\": \"b\", \"label\": 2, \"x\": [3, 4]}\n".to_vec()),
        ("nested.jsonl", b"{\"a\": {\"b\": [true, null, \"c\"]}, \"n\": -7}\n\n{\"a\": 1}\r\n".to_vec()),
    ]
}

fn csv() -> Seeds {
    vec![
        (
            "rows.csv",
            b"text,label,score\na,1,0.5\n\"b, quoted\",2,-3e2\n\"c \"\"x\"\"\",007,n/a\r\n".to_vec(),
        ),
        ("rows.tsv", b"id\tcaption\n1\ta cat\n\n2\t\n".to_vec()),
    ]
}

fn parquet() -> Seeds {
    use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
    let batch = RecordBatch::try_from_iter([
        ("label", Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef),
        ("text", Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef),
        ("bytes", Arc::new(BinaryArray::from(vec![&b"x"[..], b"yy", b"", b"z"])) as ArrayRef),
    ])
    .unwrap();
    let props =
        parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(2)).build();
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    vec![("two-groups.parquet", out)]
}

fn cache() -> Seeds {
    let records: [&[u8]; 3] = [b"first record", &[0u8; 300], b"third"];
    let (chunk, meta) = granary_store::cache::fuzzing::encode_chunk(&records).unwrap();
    let (small, _) = granary_store::cache::fuzzing::encode_chunk(&[b"a", b"b"]).unwrap();
    let manifest = SplitManifest {
        format_version: 1,
        fingerprint: "ab".repeat(32),
        split: 7,
        elements: 5,
        chunks: vec![
            ChunkMeta { object: "w1/chunk-00000.grc".into(), first: 0, ..meta.clone() },
            ChunkMeta { object: "w1/chunk-00001.grc".into(), first: 3, elements: 2, ..meta },
        ],
        writer: "w1".into(),
        written_unix_s: 1_700_000_000,
    };
    let mut framed_records = vec![3u8];
    for r in records {
        framed(&mut framed_records, r);
    }
    let mut json = vec![0u8];
    json.write_all(&serde_json::to_vec(&manifest).unwrap()).unwrap();
    vec![
        ("manifest", json),
        ("chunk-zstd", [&[1u8][..], &chunk].concat()),
        ("chunk-plain", [&[2u8][..], &small].concat()),
        ("records", framed_records),
    ]
}
