//! `format: files`: one object per sample, grouped into splits of `filesPerSplit`, with labels
//! from an optional JSONL file.

use super::read_ahead::{self, ReadAhead};
use super::{Emit, Object, SourceError, Split, SplitKind, get_bytes, get_listed, relative_key};
use crate::element::{Element, Value};
use crate::store::{self, Located};
use crate::tensor::Tensor;
use granary_crds::SourceSpec;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// The field a sample's bytes go to, by file extension.
pub(crate) fn field_for_extension(ext: &str) -> &str {
    match ext {
        "jpg" | "jpeg" | "png" | "webp" => "image",
        "txt" | "text" => "text",
        "cls" | "cls2" | "label" => "label",
        "" => "data",
        other => other,
    }
}

/// Lists `objects` into splits of [`SourceSpec::files_per_split`] samples, in listing order.
/// The batch size does not size them (`_batch_size` is unused), so a pipeline's splits, and the
/// cache entries that hold one split each, are the same at every batch size.
pub(super) async fn splits(
    located: &Located,
    spec: &SourceSpec,
    objects: Vec<ObjectMeta>,
    _batch_size: usize,
) -> Result<Vec<Split>, SourceError> {
    let labels = match &spec.labels {
        Some(labels) => Some(load_labels(located, labels).await?),
        None => None,
    };
    let mut samples = Vec::with_capacity(objects.len());
    for o in objects {
        let label = match &labels {
            Some((labels_location, folder, table)) => {
                if o.location == *labels_location {
                    continue;
                }
                let rel = relative_key(folder, &o.location);
                match table.get(&rel) {
                    Some(label) => Some(*label),
                    None => {
                        return Err(SourceError::data(
                            o.location.to_string(),
                            format!(
                                "has no record `{{\"file\": \"{rel}\", ...}}` in the labels file `{labels_location}`; add one, or move the object out of the source prefix"
                            ),
                        ));
                    }
                }
            }
            None => None,
        };
        samples.push((Object { location: o.location, size: o.size }, label));
    }
    if samples.is_empty() {
        return Err(SourceError::Empty { url: located.url.to_string(), format: "files" });
    }
    Ok(samples
        .chunks(spec.files_per_split())
        .enumerate()
        .map(|(i, chunk)| Split { id: i as u64, kind: SplitKind::Files(chunk.to_vec()), input: 0 })
        .collect())
}

/// Loads `{"file", "label"}` records; returns the labels object, its folder and the table.
async fn load_labels(
    located: &Located,
    labels: &str,
) -> Result<(StorePath, StorePath, HashMap<String, i64>), SourceError> {
    let (store, location) = if labels.contains("://") {
        let l = store::open(labels)?;
        (l.store, l.path)
    } else {
        (Arc::clone(&located.store), store::join(&located.path, labels))
    };
    let bytes = get_bytes(store, location.clone()).await.map_err(|e| match e {
        SourceError::Io { source: object_store::Error::NotFound { .. }, .. } => SourceError::data(
            "spec.source.labels",
            format!(
                "`{location}` does not exist; give the labels file's path relative to spec.source.url, \
                 or its URL"
            ),
        ),
        other => other,
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| SourceError::data(location.to_string(), "spec.source.labels: not UTF-8 text"))?;
    let mut table = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{location}:{}", n + 1);
        let record: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| SourceError::data(at(), format!("spec.source.labels: not a JSON object: {e}")))?;
        let file = record.get("file").and_then(|f| f.as_str());
        let label = record.get("label").and_then(|l| l.as_i64());
        match (file, label) {
            (Some(file), Some(label)) => {
                table.insert(file.trim_start_matches("./").to_string(), label);
            }
            _ => {
                return Err(SourceError::data(
                    at(),
                    "spec.source.labels: each record needs a string `file` and an integer `label`, e.g. {\"file\": \"train/0001.jpg\", \"label\": 3}",
                ));
            }
        }
    }
    let folder = StorePath::from_iter(
        location.parts().collect::<Vec<_>>().split_last().map(|(_, rest)| rest.to_vec()).unwrap_or_default(),
    );
    Ok((location, folder, table))
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    samples: &[(Object, Option<i64>)],
    read_ahead: &ReadAhead,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let mut pending = VecDeque::with_capacity(read_ahead::START);
    // Listed bytes of the reads in `pending`.
    let mut in_flight = 0u64;
    let mut next = samples.iter().peekable();
    let spawn =
        |s: &(Object, Option<i64>)| rt.spawn(get_listed(Arc::clone(store), s.0.location.clone(), s.0.size));
    let mut first = true;
    loop {
        // Top the reads up to the depth, within the byte bound (a lone read always starts).
        let depth = read_ahead.depth();
        while pending.len() < depth
            && let Some(s) =
                next.next_if(|s| pending.is_empty() || in_flight + s.0.size <= read_ahead::MOST_BYTES)
        {
            in_flight += s.0.size;
            pending.push_back((s, spawn(s)));
        }
        let Some((sample, handle)) = pending.pop_front() else { break };
        in_flight -= sample.0.size;
        let (started, ready) = (Instant::now(), handle.is_finished());
        let bytes = rt.block_on(handle).map_err(|e| {
            SourceError::data(sample.0.location.to_string(), format!("read task failed: {e}"))
        })??;
        // Nothing could have read a split's first sample earlier: only later waits say the reads
        // fall behind (taking a finished read is no wait, however long it takes).
        let waited = if first || ready { Duration::ZERO } else { started.elapsed() };
        first = false;
        let (object, label) = sample;
        let ext = object.location.extension().unwrap_or("").to_ascii_lowercase();
        let mut element = Element::new(relative_key(root, &object.location));
        element.set(field_for_extension(&ext), Value::Bytes(bytes));
        if let Some(label) = label {
            element.set("label", Value::Tensor(Tensor::scalar_i64(*label)));
        }
        let handing = Instant::now();
        let go_on = emit(element);
        read_ahead.took(waited, handing.elapsed());
        if !go_on {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_store::cache::Throttle;
    use granary_store::delayed::Delayed;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    /// A split's samples, as the listing gives them.
    type Samples = Vec<(Object, Option<i64>)>;

    /// `n` small objects in a store that takes `latency` to answer each read.
    fn distant_store(
        n: usize,
        latency: Duration,
        rt: &tokio::runtime::Runtime,
    ) -> (Arc<dyn ObjectStore>, Samples) {
        let store = InMemory::new();
        let mut samples = Vec::new();
        for i in 0..n {
            let location = StorePath::from(format!("data/{i:04}.bin"));
            let body = format!("sample {i}").into_bytes();
            let size = body.len() as u64;
            rt.block_on(store.put(&location, body.into())).unwrap();
            samples.push((Object { location, size }, Some(i as i64)));
        }
        let throttle = Throttle { per_call_ms: latency.as_millis() as u64, ..Throttle::default() };
        (Arc::new(Delayed::new(Arc::new(store), throttle)), samples)
    }

    fn read_all(tuned: bool) -> (Vec<(String, Vec<u8>)>, usize) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (store, samples) = distant_store(320, Duration::from_millis(5), &rt);
        let read_ahead = ReadAhead::new(tuned);
        let mut got = Vec::new();
        let root = StorePath::from("data");
        read(&store, &root, &samples, &read_ahead, rt.handle(), &mut |element: Element| {
            let Some(Value::Bytes(bytes)) = element.get("bin") else { panic!("no `bin` field") };
            got.push((element.key.clone(), bytes.to_vec()));
            true
        })
        .unwrap();
        (got, read_ahead.depth())
    }

    #[test]
    fn reads_that_fall_behind_a_distant_store_go_deeper_and_keep_their_order() {
        let (tuned, depth) = read_all(true);
        // The consumer takes every element at once, so the reader spends its time waiting on the
        // store: the depth doubles window after window.
        assert!(depth >= 4 * read_ahead::START, "depth {depth}");
        let (fixed, fixed_depth) = read_all(false);
        assert_eq!(fixed_depth, read_ahead::START);
        assert_eq!(tuned, fixed, "the depth changes when reads start, not what they give");
        let expected: Vec<(String, Vec<u8>)> =
            (0..320).map(|i| (format!("{i:04}.bin"), format!("sample {i}").into_bytes())).collect();
        assert_eq!(tuned, expected);
    }
}
