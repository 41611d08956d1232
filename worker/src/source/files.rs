//! `format: files`: one object per sample, grouped into splits of `filesPerSplit`, with labels
//! from an optional JSONL file.

use super::{Emit, Object, SourceError, Split, SplitKind, get_bytes, get_listed, relative_key};
use crate::element::{Element, Value};
use crate::store::{self, Located};
use crate::tensor::Tensor;
use granary_crds::SourceSpec;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::runtime::Handle;

/// Reads in flight at once per split: hides store latency for small files.
const READ_AHEAD: usize = 16;

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
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let mut pending = VecDeque::with_capacity(READ_AHEAD);
    let mut next = samples.iter();
    let spawn =
        |s: &(Object, Option<i64>)| rt.spawn(get_listed(Arc::clone(store), s.0.location.clone(), s.0.size));
    for s in next.by_ref().take(READ_AHEAD) {
        pending.push_back((s, spawn(s)));
    }
    while let Some((sample, handle)) = pending.pop_front() {
        let bytes = rt.block_on(handle).map_err(|e| {
            SourceError::data(sample.0.location.to_string(), format!("read task failed: {e}"))
        })??;
        if let Some(s) = next.next() {
            pending.push_back((s, spawn(s)));
        }
        let (object, label) = sample;
        let ext = object.location.extension().unwrap_or("").to_ascii_lowercase();
        let mut element = Element::new(relative_key(root, &object.location));
        element.set(field_for_extension(&ext), Value::Bytes(bytes));
        if let Some(label) = label {
            element.set("label", Value::Tensor(Tensor::scalar_i64(*label)));
        }
        if !emit(element) {
            return Ok(());
        }
    }
    Ok(())
}
