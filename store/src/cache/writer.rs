//! [`SplitWriter`]: writes one split of an entry as chunk objects, then publishes its manifest.

use bytes::Bytes;
use object_store::path::Path;

use super::chunk::ChunkBuffer;
use super::{CacheError, CacheStore, ChunkMeta, FORMAT_VERSION, Fingerprint, Put, SplitManifest};
use super::{layout, now_unix_s};

/// A chunk is stored once its encoded records reach this many bytes...
pub const CHUNK_MAX_RAW_BYTES: usize = 4 << 20;
/// ... or this many records.
pub const CHUNK_MAX_RECORDS: u32 = 4096;

/// Writes split `split` of entry `fp`: records are buffered and stored as chunk objects under
/// `<fp>/splits/<split:08>/<writer_id>/` as they fill; [`finish`](Self::finish) publishes the
/// manifest, [`abort`](Self::abort) deletes what was written.
///
/// `writer_id` should be unique per attempt (e.g. worker and lease), since a writer only ever
/// deletes the objects it wrote itself; characters outside `[A-Za-z0-9._-]` become `_` in the
/// folder name.
#[derive(Debug)]
pub struct SplitWriter {
    cache: CacheStore,
    fp: Fingerprint,
    split: u64,
    writer_id: String,
    segment: String,
    buffer: ChunkBuffer,
    chunks: Vec<ChunkMeta>,
    /// Names (relative to the split folder) of every chunk object this writer has tried to put, so
    /// that cleaning up removes partial attempts too.
    written: Vec<String>,
    /// Elements in stored chunks.
    flushed: u64,
    max_raw_bytes: usize,
    max_records: u32,
}

impl CacheStore {
    /// A writer for split `split` of entry `fp`; nothing is written before its first chunk fills.
    pub fn split_writer(&self, fp: &Fingerprint, split: u64, writer_id: &str) -> SplitWriter {
        SplitWriter {
            cache: self.clone(),
            fp: fp.clone(),
            split,
            writer_id: writer_id.to_string(),
            segment: layout::writer_segment(writer_id),
            buffer: ChunkBuffer::default(),
            chunks: Vec::new(),
            written: Vec::new(),
            flushed: 0,
            max_raw_bytes: CHUNK_MAX_RAW_BYTES,
            max_records: CHUNK_MAX_RECORDS,
        }
    }
}

impl SplitWriter {
    /// Stores chunks at `max_raw_bytes` encoded bytes or `max_records` records instead of the
    /// defaults ([`CHUNK_MAX_RAW_BYTES`], [`CHUNK_MAX_RECORDS`]); limits below 1 count as 1.
    pub fn with_chunk_limits(mut self, max_raw_bytes: usize, max_records: u32) -> SplitWriter {
        self.max_raw_bytes = max_raw_bytes.max(1);
        self.max_records = max_records.max(1);
        self
    }

    /// Appends a record; stores a chunk when the buffer is full.
    pub async fn push(&mut self, record: &[u8]) -> Result<(), CacheError> {
        self.buffer.push(record).map_err(CacheError::Format)?;
        if self.buffer.raw_len() >= self.max_raw_bytes || self.buffer.records() >= self.max_records {
            self.flush().await?;
        }
        Ok(())
    }

    /// Records pushed so far.
    pub fn elements(&self) -> u64 {
        self.flushed + u64::from(self.buffer.records())
    }

    /// Bytes of chunk objects stored so far.
    pub fn stored_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.stored_bytes).sum()
    }

    /// Stores the last chunk, then publishes the manifest unless another writer published this
    /// split first; in that case deletes this writer's chunks and returns the published manifest
    /// (verified like [`CacheStore::open_split`]). On any error this writer's chunks are deleted
    /// (best effort) before the error is returned.
    pub async fn finish(mut self) -> Result<SplitManifest, CacheError> {
        match self.publish().await {
            Ok(manifest) => Ok(manifest),
            Err(e) => {
                self.delete_own(&[]).await;
                Err(e)
            }
        }
    }

    /// Deletes every chunk this writer stored; errors are ignored (left-overs are unpublished
    /// objects, invisible to readers, removed with the entry).
    pub async fn abort(self) {
        self.delete_own(&[]).await;
    }

    /// The last chunk, then the manifest.
    async fn publish(&mut self) -> Result<SplitManifest, CacheError> {
        self.flush().await?;
        let manifest = SplitManifest {
            format_version: FORMAT_VERSION,
            fingerprint: self.fp.to_string(),
            split: self.split,
            elements: self.flushed,
            chunks: self.chunks.clone(),
            writer: self.writer_id.clone(),
            written_unix_s: now_unix_s(),
        };
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| CacheError::Format(format!("cannot encode the manifest: {e}")))?;
        let location = self.cache.manifest_location(&self.fp, self.split);
        match self.cache.put_if_absent(&location, Bytes::from(bytes)).await? {
            Put::Created => Ok(manifest),
            Put::Exists => {
                let theirs = self.cache.open_split(&self.fp, self.split).await;
                // Their manifest may name objects of ours when a writer id was reused: keep those.
                // When theirs cannot be read for a store error, keep everything rather than guess.
                match &theirs {
                    Ok(m) => {
                        self.delete_own(&m.chunks.iter().map(|c| c.object.clone()).collect::<Vec<_>>()).await
                    }
                    Err(e) if e.is_corrupt() => self.delete_own(&[]).await,
                    Err(_) => {}
                }
                self.written.clear();
                tracing::debug!(split = self.split, fp = %self.fp, "another writer published the split first");
                theirs
            }
        }
    }

    /// Stores the buffered records as the next chunk, if there are any.
    async fn flush(&mut self) -> Result<(), CacheError> {
        if self.buffer.records() == 0 {
            return Ok(());
        }
        let encoded = self.buffer.take_encoded().map_err(CacheError::Format)?;
        let object = layout::chunk_name(&self.segment, self.chunks.len());
        let dir = self.cache.split_location(&self.fp, self.split);
        let location = layout::chunk_path(&dir, &object).map_err(CacheError::Format)?;
        let meta = ChunkMeta {
            object,
            first: self.flushed,
            elements: u64::from(encoded.records),
            stored_bytes: encoded.bytes.len() as u64,
            raw_bytes: u64::from(encoded.raw_len),
            crc32: encoded.crc32,
        };
        self.written.push(meta.object.clone());
        self.cache.put_overwrite(&location, Bytes::from(encoded.bytes)).await?;
        self.flushed += meta.elements;
        self.chunks.push(meta);
        Ok(())
    }

    /// Deletes this writer's chunk objects except those named (relative to the split folder) in
    /// `keep`, ignoring errors.
    async fn delete_own(&self, keep: &[String]) {
        let dir = self.cache.split_location(&self.fp, self.split);
        let doomed: Vec<Path> = self
            .written
            .iter()
            .filter(|name| !keep.contains(name))
            .filter_map(|name| layout::chunk_path(&dir, name).ok())
            .collect();
        if let Err(e) = self.cache.delete_all(&dir, doomed).await {
            tracing::debug!(error = %e, "cannot delete a cache writer's chunks");
        }
    }
}
