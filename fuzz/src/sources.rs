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

/// A CSV file, or a TSV file (tab-delimited) when its first line holds a tab: the delimiter
/// follows the name, as a worker's does.
pub fn source_csv(data: &[u8]) {
    let first_line = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let name = if first_line.contains(&b'\t') { "data.tsv" } else { "data.csv" };
    read("fuzz-csv", name, "csv", data);
}

/// A Parquet file: its footer is read when listing, then each row group.
pub fn source_parquet(data: &[u8]) {
    read("fuzz-parquet", "data.parquet", "parquet", data);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The elements of `data` put at `name` and read as `format`, through the same store and
    /// listing as the targets.
    fn elements(name: &str, format: &str, data: &'static [u8]) -> usize {
        let store = format!("fuzz-{format}-check");
        let memory = granary_worker::store::memory_store(&store);
        let location = StorePath::from(format!("in/{name}"));
        runtime().block_on(memory.put(&location, PutPayload::from(bytes::Bytes::from_static(data)))).unwrap();
        let spec: SourceSpec = serde_json::from_value(
            serde_json::json!({"url": format!("memory://{store}/in/"), "format": format}),
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
        seen
    }

    #[test]
    fn a_valid_file_of_each_text_format_is_read_to_its_end() {
        assert_eq!(elements("data.jsonl", "jsonl", b"{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3}\n"), 3);
        assert_eq!(elements("data.csv", "csv", b"a,b\n1,x\n2,\"y, z\"\n"), 2);
    }
}
