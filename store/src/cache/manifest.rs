//! The JSON documents of a cache entry: [`EntryInfo`] (`<fp>/entry.json`) and [`SplitManifest`]
//! (`<fp>/splits/<split:08>/manifest.json`), and the checks a manifest read from the store must
//! pass before its chunks are trusted.

use serde::{Deserialize, Serialize};

use super::layout;
use super::{FORMAT_VERSION, Fingerprint};

/// What an entry holds and when it was last used; written once when the entry is created, then
/// only `last_used_unix_s` changes ([`CacheStore::touch`](super::CacheStore::touch)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The entry's fingerprint (64 hex digits).
    pub fingerprint: String,
    /// The pipeline that created the entry.
    pub pipeline: String,
    /// The source URL.
    pub source_url: String,
    /// Index of the stage boundary the entry caches: the output of the first `boundary` stages.
    pub boundary: usize,
    /// Name of the last cached stage (`source` for boundary 0).
    pub stage: String,
    /// Names of the cached stages, in order.
    pub stages: Vec<String>,
    /// Number of splits a complete entry has.
    pub splits_total: u64,
    /// When the entry was created (seconds since the Unix epoch).
    pub created_unix_s: u64,
    /// When a pipeline last read or wrote the entry (seconds since the Unix epoch).
    pub last_used_unix_s: u64,
}

/// One chunk object of a split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkMeta {
    /// Object name relative to the split folder: `<writer>/chunk-<i:05>.grc`.
    pub object: String,
    /// Index within the split of the chunk's first element.
    pub first: u64,
    /// Number of elements (records) in the chunk.
    pub elements: u64,
    /// Size of the chunk object in bytes, header included.
    pub stored_bytes: u64,
    /// Size of the encoded records before compression.
    pub raw_bytes: u64,
    /// crc32 of the chunk's payload (what follows the header).
    pub crc32: u32,
}

/// A published split: its chunks in element order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SplitManifest {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The entry's fingerprint (64 hex digits).
    pub fingerprint: String,
    /// The split.
    pub split: u64,
    /// Number of elements in the split.
    pub elements: u64,
    /// The chunks, in element order.
    pub chunks: Vec<ChunkMeta>,
    /// Id of the writer that published the split.
    pub writer: String,
    /// When the split was published (seconds since the Unix epoch).
    pub written_unix_s: u64,
}

impl SplitManifest {
    /// Total size of the split's chunk objects.
    pub fn stored_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.stored_bytes).sum()
    }

    /// Total size of the split's encoded records before compression.
    pub fn raw_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.raw_bytes).sum()
    }

    /// Parses a manifest read from `fp`'s split `split` and checks that it belongs there and is
    /// self-consistent. Returns the reason when it is not.
    pub(crate) fn parse_checked(bytes: &[u8], fp: &Fingerprint, split: u64) -> Result<SplitManifest, String> {
        let manifest: SplitManifest =
            serde_json::from_slice(bytes).map_err(|e| format!("not a split manifest: {e}"))?;
        manifest.check(fp, split)?;
        Ok(manifest)
    }

    /// The checks of [`parse_checked`](Self::parse_checked) on an already parsed manifest.
    pub(crate) fn check(&self, fp: &Fingerprint, split: u64) -> Result<(), String> {
        if self.format_version != FORMAT_VERSION {
            return Err(format!(
                "format version {} (this build reads version {FORMAT_VERSION})",
                self.format_version
            ));
        }
        if self.fingerprint != fp.as_str() {
            return Err(format!("manifest of entry {} found in entry {fp}", self.fingerprint));
        }
        if self.split != split {
            return Err(format!("manifest of split {} found in split {split}", self.split));
        }
        let mut next = 0u64;
        for (i, chunk) in self.chunks.iter().enumerate() {
            if chunk.first != next {
                return Err(format!("chunk {i} starts at element {} instead of {next}", chunk.first));
            }
            if chunk.elements == 0 {
                return Err(format!("chunk {i} has no elements"));
            }
            layout::chunk_parts(&chunk.object).map_err(|e| format!("chunk {i}: {e}"))?;
            next = next
                .checked_add(chunk.elements)
                .ok_or_else(|| format!("chunk {i}: element count overflows"))?;
        }
        if next != self.elements {
            return Err(format!("chunks hold {next} elements but the manifest says {}", self.elements));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(c: char) -> Fingerprint {
        Fingerprint::parse(&c.to_string().repeat(64)).unwrap()
    }

    fn manifest() -> SplitManifest {
        let chunk = |i: u64, first: u64, elements: u64| ChunkMeta {
            object: format!("w1/chunk-{i:05}.grc"),
            first,
            elements,
            stored_bytes: 100 + i,
            raw_bytes: 200,
            crc32: 7,
        };
        SplitManifest {
            format_version: FORMAT_VERSION,
            fingerprint: fp('a').to_string(),
            split: 3,
            elements: 15,
            chunks: vec![chunk(0, 0, 10), chunk(1, 10, 5)],
            writer: "w1".into(),
            written_unix_s: 1,
        }
    }

    #[test]
    fn roundtrips_and_checks() {
        let m = manifest();
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(String::from_utf8_lossy(&bytes).contains("\"storedBytes\""));
        assert_eq!(SplitManifest::parse_checked(&bytes, &fp('a'), 3).unwrap(), m);
        assert_eq!(m.stored_bytes(), 201);
        assert_eq!(m.raw_bytes(), 400);
    }

    #[test]
    fn rejects_foreign_and_inconsistent_manifests() {
        let m = manifest();
        let bytes = serde_json::to_vec(&m).unwrap();
        let why = |r: Result<SplitManifest, String>| r.unwrap_err();
        assert!(why(SplitManifest::parse_checked(&bytes, &fp('b'), 3)).contains("found in entry"));
        assert!(why(SplitManifest::parse_checked(&bytes, &fp('a'), 4)).contains("split 3 found in split 4"));
        assert!(why(SplitManifest::parse_checked(b"{", &fp('a'), 3)).contains("not a split manifest"));
        let mut bad = m.clone();
        bad.format_version = 99;
        assert!(bad.check(&fp('a'), 3).unwrap_err().contains("format version 99"));
        let mut bad = m.clone();
        bad.elements = 16;
        assert!(bad.check(&fp('a'), 3).unwrap_err().contains("hold 15 elements"));
        let mut bad = m.clone();
        bad.chunks[1].first = 9;
        assert!(bad.check(&fp('a'), 3).unwrap_err().contains("starts at element 9"));
        let mut bad = m.clone();
        bad.chunks[1].object = "../../x/chunk.grc".into();
        assert!(bad.check(&fp('a'), 3).is_err());
        let mut bad = m;
        bad.chunks[0].elements = u64::MAX;
        assert!(bad.check(&fp('a'), 3).is_err());
    }
}
