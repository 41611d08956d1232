//! Counting a WebDataset shard's samples from its tar headers alone: the tar reader seeks past
//! every member's body (rounded up to 512-byte blocks), so a shard of any member size is counted
//! reading little more than its headers, in memory bounded by [`MAX_HEADER_RUN`]. Samples are
//! grouped as `source::webdataset` reads them, so the count is the one reading yields.

use super::ranged::{Deadline, RangedReader};
use crate::source::files::field_for_extension;
use crate::source::webdataset::{MAX_MEMBER, split_member};
use crate::source::{Object, SourceError};
use object_store::ObjectStore;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::runtime::Handle;

/// The most bytes read between two seeks: a header with its GNU long name or PAX records, which
/// the tar reader holds in memory.
pub const MAX_HEADER_RUN: u64 = (1 << 20) + 512;

/// The samples of the shard `object`.
pub fn count(
    store: &Arc<dyn ObjectStore>,
    object: &Object,
    rt: &Handle,
    deadline: Deadline,
) -> Result<u64, SourceError> {
    let location = object.location.to_string();
    let bad =
        |e: std::io::Error| SourceError::data(location.clone(), format!("not a readable tar shard: {e}"));
    let reader =
        RangedReader::new(store, &object.location, object.size, rt, deadline).with_max_run(MAX_HEADER_RUN);
    let mut archive = tar::Archive::new(reader);
    let mut samples = 0u64;
    let mut current: Option<String> = None;
    let mut fields: HashSet<String> = HashSet::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
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
        // Reading would meet the end of the object inside this member.
        if entry.raw_file_position().saturating_add(entry.size()) > object.size {
            return Err(bad(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("member `{path}` ends past the end of the shard ({} bytes)", object.size),
            )));
        }
        let (sample, ext) = split_member(&path);
        if sample.starts_with('.') || sample.is_empty() {
            continue;
        }
        if current.as_deref() != Some(sample) {
            samples += 1;
            current = Some(sample.to_string());
            fields.clear();
        }
        let field = field_for_extension(&ext.to_ascii_lowercase()).to_string();
        if !fields.insert(field.clone()) {
            return Err(SourceError::data(at, format!("sample has two members for field `{field}`")));
        }
    }
    Ok(samples)
}
