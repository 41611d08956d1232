//! `format: webdataset`: tar shards whose members are grouped into samples by basename
//! (`dir/N.jpg` + `dir/N.cls` form sample `dir/N`), streamed without holding a shard in memory.

use super::files::field_for_extension;
use super::{Emit, Object, SourceError, blocking_reader, relative_key};
use crate::element::{Element, Value};
use crate::tensor::Tensor;
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use std::io::Read;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Largest tar member read into memory.
pub(crate) const MAX_MEMBER: u64 = 1 << 30;

/// Splits a member path into its sample key and extension: the key ends at the first `.` of the
/// file name (WebDataset's convention), so `a/b.seg.png` is sample `a/b`, extension `seg.png`.
pub fn split_member(path: &str) -> (&str, &str) {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    match path[name_start..].find('.') {
        Some(dot) => (&path[..name_start + dot], &path[name_start + dot + 1..]),
        None => (path, ""),
    }
}

/// Turns one member into a field of `element`.
fn add_member(element: &mut Element, ext: &str, data: Vec<u8>, at: &str) -> Result<(), SourceError> {
    let ext = ext.to_ascii_lowercase();
    let field = field_for_extension(&ext);
    let value = match field {
        "label" => {
            let text = std::str::from_utf8(&data).unwrap_or("").trim();
            let label: i64 = text.parse().map_err(|_| {
                SourceError::data(
                    at,
                    format!("`.{ext}` member must hold an integer label as text, found {text:?}"),
                )
            })?;
            Value::Tensor(Tensor::scalar_i64(label))
        }
        "text" => Value::Text(
            String::from_utf8(data).map_err(|_| SourceError::data(at, "`.txt` member is not UTF-8 text"))?,
        ),
        _ => Value::Bytes(data.into()),
    };
    if element.get(field).is_some() {
        return Err(SourceError::data(at, format!("sample has two members for field `{field}`")));
    }
    element.set(field, value);
    Ok(())
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    object: &Object,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let shard_key = relative_key(root, &object.location);
    let location = object.location.to_string();
    let bad =
        |e: std::io::Error| SourceError::data(location.clone(), format!("not a readable tar shard: {e}"));
    let mut archive = tar::Archive::new(blocking_reader(store, &object.location, rt)?);
    let mut current: Option<(String, Element)> = None;
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        let size = entry.header().size().map_err(bad)?;
        let at = format!("{location}/{path}");
        if size > MAX_MEMBER {
            return Err(SourceError::data(
                at,
                format!("member of {size} bytes is larger than the 1 GiB limit"),
            ));
        }
        // Reserved up to what the shard holds: a header may claim more than follows it.
        let mut data = Vec::with_capacity(size.min(object.size) as usize);
        entry.read_to_end(&mut data).map_err(bad)?;
        let (sample, ext) = split_member(&path);
        if sample.starts_with('.') || sample.is_empty() {
            continue;
        }
        if current.as_ref().is_none_or(|(name, _)| name != sample) {
            if let Some((_, done)) = current.take()
                && !emit(done)
            {
                return Ok(());
            }
            current = Some((sample.to_string(), Element::new(format!("{shard_key}/{sample}"))));
        }
        if let Some((_, element)) = current.as_mut() {
            add_member(element, ext, data, &at)?;
        }
    }
    if let Some((_, done)) = current {
        emit(done);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_split_at_first_dot_of_file_name() {
        assert_eq!(split_member("00000001.jpg"), ("00000001", "jpg"));
        assert_eq!(split_member("a.b/c.seg.png"), ("a.b/c", "seg.png"));
        assert_eq!(split_member("noext"), ("noext", ""));
    }
}
