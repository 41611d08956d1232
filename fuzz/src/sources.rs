//! The source readers: one object in a `memory://` store, listed and read as the worker does.

use crate::runtime::runtime;
use granary_crds::SourceSpec;
use granary_worker::source::Source;
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, PutPayload};

/// Splits read per input (a Parquet file may claim many row groups).
const MAX_SPLITS: usize = 256;
/// Elements taken per split before the reader is told to stop.
const MAX_ELEMENTS: usize = 100_000;

/// Puts `data` at `memory://<store>/in/<name>` (replacing the last input's), lists the source
/// of `format` there, and reads every split to its end or first error.
fn read(store: &str, name: &str, format: &str, data: &[u8]) {
    let memory = granary_worker::store::memory_store(store);
    let location = StorePath::from(format!("in/{name}"));
    let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
    if let Err(e) = runtime().block_on(memory.put(&location, payload)) {
        panic!("cannot write to the in-memory store: {e}");
    }
    let spec: SourceSpec = match serde_json::from_value(
        serde_json::json!({"url": format!("memory://{store}/in/"), "format": format}),
    ) {
        Ok(spec) => spec,
        Err(e) => panic!("the fuzz target's source spec is invalid: {e}"),
    };
    let Ok(source) = runtime().block_on(Source::open(&spec, 8)) else {
        let _ = runtime().block_on(memory.delete(&location));
        return;
    };
    for split in source.splits().iter().take(MAX_SPLITS) {
        let mut elements = 0usize;
        let _ = source.read_split(split, runtime().handle(), &mut |_| {
            elements += 1;
            elements < MAX_ELEMENTS
        });
    }
    // One object at a time: the next input's listing must not see this one.
    let _ = runtime().block_on(memory.delete(&location));
}

/// A WebDataset shard (tar).
pub fn source_webdataset(data: &[u8]) {
    read("fuzz-webdataset", "shard.tar", "webdataset", data);
}

/// A TFRecord file, GZIP-compressed when it starts like a gzip stream.
pub fn source_tfrecord(data: &[u8]) {
    let name = if data.starts_with(&[0x1f, 0x8b]) { "data.tfrecord.gz" } else { "data.tfrecord" };
    read("fuzz-tfrecord", name, "tfrecord", data);
}

/// A JSON Lines file.
pub fn source_jsonl(data: &[u8]) {
    read("fuzz-jsonl", "data.jsonl", "jsonl", data);
}

/// A Parquet file: its footer is read when listing, then each row group.
pub fn source_parquet(data: &[u8]) {
    read("fuzz-parquet", "data.parquet", "parquet", data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_jsonl_file_is_read_to_its_end() {
        // Through the same store and listing as the target, checked to yield its elements.
        let memory = granary_worker::store::memory_store("fuzz-jsonl-check");
        let location = StorePath::from("in/data.jsonl");
        let payload = PutPayload::from(bytes::Bytes::from_static(b"{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3}\n"));
        runtime().block_on(memory.put(&location, payload)).unwrap();
        let spec: SourceSpec = serde_json::from_value(
            serde_json::json!({"url": "memory://fuzz-jsonl-check/in/", "format": "jsonl"}),
        )
        .unwrap();
        let source = runtime().block_on(Source::open(&spec, 8)).unwrap();
        let mut seen = 0;
        for split in source.splits() {
            source
                .read_split(split, runtime().handle(), &mut |_| {
                    seen += 1;
                    true
                })
                .unwrap();
        }
        assert_eq!(seen, 3);
    }
}
