//! Where a cache entry's objects live under the cache root (object names only; the formats are in
//! [`super::manifest`] and [`super::chunk`]):
//!
//! ```text
//! <fp>/entry.json                                        EntryInfo
//! <fp>/splits/<split:08>/manifest.json                   SplitManifest, written last
//! <fp>/splits/<split:08>/<writer>/chunk-<i:05>.grc       chunks, visible only through a manifest
//! .probe/<random>                                        CacheStore::probe's scratch object
//! ```

use object_store::path::Path;

use super::Fingerprint;

/// Name of an entry's info object.
pub(crate) const ENTRY_INFO: &str = "entry.json";
/// Name of the folder holding an entry's splits.
pub(crate) const SPLITS: &str = "splits";
/// Name of a split's manifest object.
pub(crate) const MANIFEST: &str = "manifest.json";
/// Folder of the store probe's scratch objects.
pub(crate) const PROBE: &str = ".probe";
/// Longest writer folder name.
const MAX_WRITER_SEGMENT: usize = 100;

/// `<root>/<fp>`.
pub(crate) fn entry_dir(root: &Path, fp: &Fingerprint) -> Path {
    root.clone().join(fp.as_str())
}

/// `<root>/<fp>/entry.json`.
pub(crate) fn entry_info(root: &Path, fp: &Fingerprint) -> Path {
    entry_dir(root, fp).join(ENTRY_INFO)
}

/// `<root>/<fp>/splits`.
pub(crate) fn splits_dir(root: &Path, fp: &Fingerprint) -> Path {
    entry_dir(root, fp).join(SPLITS)
}

/// `<root>/<fp>/splits/<split:08>`.
pub(crate) fn split_dir(root: &Path, fp: &Fingerprint, split: u64) -> Path {
    splits_dir(root, fp).join(format!("{split:08}"))
}

/// `<root>/<fp>/splits/<split:08>/manifest.json`.
pub(crate) fn manifest(root: &Path, fp: &Fingerprint, split: u64) -> Path {
    split_dir(root, fp, split).join(MANIFEST)
}

/// The name, relative to the split folder, of chunk `index` of the writer whose folder is
/// `writer_segment`.
pub(crate) fn chunk_name(writer_segment: &str, index: usize) -> String {
    format!("{writer_segment}/chunk-{index:05}.grc")
}

/// The object of chunk name `object` in `split_dir`, or why the name is not a chunk name.
pub(crate) fn chunk_path(split_dir: &Path, object: &str) -> Result<Path, String> {
    let [writer, file] = chunk_parts(object)?;
    Ok(split_dir.clone().join(writer).join(file))
}

/// The writer folder and file name of chunk name `object`, or why it is not one: exactly
/// `<writer>/chunk-<digits>.grc`, the writer made of `[A-Za-z0-9._-]` and not starting with a dot.
pub(crate) fn chunk_parts(object: &str) -> Result<[&str; 2], String> {
    let bad = || format!("`{object}` is not a chunk name (<writer>/chunk-<n>.grc)");
    let (writer, file) = object.split_once('/').ok_or_else(bad)?;
    let digits = file.strip_prefix("chunk-").and_then(|f| f.strip_suffix(".grc")).ok_or_else(bad)?;
    let writer_ok = !writer.is_empty()
        && !writer.starts_with('.')
        && writer.len() <= MAX_WRITER_SEGMENT
        && writer.chars().all(is_segment_char);
    if !writer_ok || digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    Ok([writer, file])
}

fn is_segment_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The folder name for writer `writer_id`: its characters outside `[A-Za-z0-9._-]` replaced by
/// `_`, prefixed with `w-` when empty, starting with a dot or naming the manifest, and cut to 100
/// characters.
pub(crate) fn writer_segment(writer_id: &str) -> String {
    let mut segment: String = writer_id
        .chars()
        .map(|c| if is_segment_char(c) { c } else { '_' })
        .take(MAX_WRITER_SEGMENT)
        .collect();
    if segment.is_empty() || segment.starts_with('.') || segment == MANIFEST {
        segment.insert_str(0, "w-");
        segment.truncate(MAX_WRITER_SEGMENT);
    }
    segment
}

/// The split a split folder name `segment` stands for: decimal digits, at least 8 of them.
pub(crate) fn parse_split_segment(segment: &str) -> Option<u64> {
    if segment.len() < 8 || !segment.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok()
}

/// What an object found under an entry's folder is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EntryObject {
    /// `entry.json`.
    Info,
    /// A split's `manifest.json`.
    Manifest(u64),
    /// Something else in a split's folder: a chunk (`object` relative to the split folder) or a
    /// stray object.
    InSplit {
        /// The split.
        split: u64,
        /// Name relative to the split folder.
        object: String,
    },
    /// Anything else.
    Other,
}

/// Classifies `location`, an object under `entry_dir`.
pub(crate) fn classify(entry_dir: &Path, location: &Path) -> EntryObject {
    let Some(rest) = location.prefix_match(entry_dir) else {
        return EntryObject::Other;
    };
    let parts: Vec<String> = rest.map(|p| p.as_ref().to_string()).collect();
    match parts.as_slice() {
        [info] if info == ENTRY_INFO => EntryObject::Info,
        [splits, split, rest @ ..] if splits == SPLITS && !rest.is_empty() => {
            let Some(split) = parse_split_segment(split) else {
                return EntryObject::Other;
            };
            if rest.len() == 1 && rest[0] == MANIFEST {
                EntryObject::Manifest(split)
            } else {
                EntryObject::InSplit { split, object: rest.join("/") }
            }
        }
        _ => EntryObject::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp() -> Fingerprint {
        Fingerprint::parse(&"ab".repeat(32)).unwrap()
    }

    #[test]
    fn builds_the_documented_paths() {
        let root = Path::from("cache/root");
        let fp = fp();
        assert_eq!(entry_info(&root, &fp).as_ref(), format!("cache/root/{fp}/entry.json"));
        assert_eq!(
            manifest(&root, &fp, 7).as_ref(),
            format!("cache/root/{fp}/splits/00000007/manifest.json")
        );
        let dir = split_dir(&Path::default(), &fp, 123_456_789);
        assert_eq!(dir.as_ref(), format!("{fp}/splits/123456789"));
        let chunk = chunk_path(&dir, &chunk_name("w1", 3)).unwrap();
        assert_eq!(chunk.as_ref(), format!("{fp}/splits/123456789/w1/chunk-00003.grc"));
    }

    #[test]
    fn sanitizes_writer_ids() {
        assert_eq!(writer_segment("worker-0.lease_3"), "worker-0.lease_3");
        assert_eq!(writer_segment("a/b c"), "a_b_c");
        assert_eq!(writer_segment(""), "w-");
        assert_eq!(writer_segment(".."), "w-..");
        assert_eq!(writer_segment("manifest.json"), "w-manifest.json");
        assert_eq!(writer_segment(&"x".repeat(500)).len(), MAX_WRITER_SEGMENT);
        for id in ["", "..", "a/b", "manifest.json", "ünï", &".".repeat(200)] {
            assert!(chunk_parts(&chunk_name(&writer_segment(id), 0)).is_ok(), "{id}");
        }
    }

    #[test]
    fn rejects_bad_chunk_names() {
        for bad in [
            "chunk-00001.grc",
            "../chunk-1.grc",
            "a/b/chunk-1.grc",
            "w/chunk-.grc",
            "w/chunk-1x.grc",
            ".w/chunk-1.grc",
            "/chunk-1.grc",
        ] {
            assert!(chunk_parts(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn classifies_entry_objects() {
        let root = Path::from("r");
        let fp = fp();
        let dir = entry_dir(&root, &fp);
        assert_eq!(classify(&dir, &entry_info(&root, &fp)), EntryObject::Info);
        assert_eq!(classify(&dir, &manifest(&root, &fp, 2)), EntryObject::Manifest(2));
        let chunk = chunk_path(&split_dir(&root, &fp, 2), "w/chunk-00000.grc").unwrap();
        assert_eq!(
            classify(&dir, &chunk),
            EntryObject::InSplit { split: 2, object: "w/chunk-00000.grc".into() }
        );
        assert_eq!(classify(&dir, &Path::from("r/other")), EntryObject::Other);
        assert_eq!(
            classify(&dir, &dir.clone().join("splits").join("x").join("manifest.json")),
            EntryObject::Other
        );
        assert_eq!(parse_split_segment("00000012"), Some(12));
        assert_eq!(parse_split_segment("12"), None);
    }
}
