//! `format: jsonl`: one JSON object per line; a file is a split. Lines are streamed.

use super::{Emit, Object, SourceError, blocking_reader, relative_key, values};
use crate::element::Element;
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use std::io::BufRead;
use std::sync::Arc;
use tokio::runtime::Handle;

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    object: &Object,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let file_key = relative_key(root, &object.location);
    let reader = std::io::BufReader::with_capacity(1 << 16, blocking_reader(store, &object.location, rt)?);
    for (n, line) in reader.lines().enumerate() {
        let at = || format!("{}:{}", object.location, n + 1);
        let line = line.map_err(|e| SourceError::data(at(), format!("cannot read line: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| SourceError::data(at(), format!("not valid JSON: {e}")))?;
        let serde_json::Value::Object(object) = value else {
            return Err(SourceError::data(
                at(),
                "each line must be a JSON object such as {\"text\": \"...\"}",
            ));
        };
        let mut element = Element::new(format!("{file_key}:{}", n + 1));
        values::json_object_into(&mut element, &object);
        if !emit(element) {
            return Ok(());
        }
    }
    Ok(())
}
