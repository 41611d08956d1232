//! The chunk object format: a 24-byte header, then the payload.
//!
//! ```text
//! offset  size  field
//!      0     4  magic `GRC1`
//!      4     1  codec: 0 none, 1 zstd
//!      5     3  zero padding
//!      8     4  records (u32 LE)
//!     12     4  raw_len: length of the encoded records before compression (u32 LE)
//!     16     4  payload_len (u32 LE)
//!     20     4  crc32 of the payload (u32 LE)
//!     24     …  payload = codec(records), records = each `u32 LE length` + bytes
//! ```
//!
//! The writer compresses with zstd level 1 and keeps the records uncompressed when that does not
//! make them smaller. [`decode`] checks everything against the header and the manifest's
//! [`ChunkMeta`] and never panics, whatever the bytes.

use std::io::Read;

use bytes::Bytes;

use super::ChunkMeta;

/// The first four bytes of every chunk object.
pub const MAGIC: [u8; 4] = *b"GRC1";
/// Size of the chunk header.
pub const HEADER_LEN: usize = 24;
/// Codec byte: the payload is the encoded records as they are.
pub const CODEC_NONE: u8 = 0;
/// Codec byte: the payload is a zstd frame of the encoded records.
pub const CODEC_ZSTD: u8 = 1;
/// zstd level the writer uses.
const ZSTD_LEVEL: i32 = 1;

/// Records collected for one chunk, encoded as `u32 LE length + bytes` each.
#[derive(Debug, Default)]
pub(crate) struct ChunkBuffer {
    raw: Vec<u8>,
    records: u32,
}

/// A chunk object ready to be stored, and what its [`ChunkMeta`] needs.
#[derive(Debug)]
pub(crate) struct EncodedChunk {
    /// Header and payload.
    pub bytes: Vec<u8>,
    /// Number of records.
    pub records: u32,
    /// Length of the encoded records.
    pub raw_len: u32,
    /// crc32 of the payload.
    pub crc32: u32,
}

impl ChunkBuffer {
    /// Appends `record`, or says why it does not fit a chunk.
    pub fn push(&mut self, record: &[u8]) -> Result<(), String> {
        let len = u32::try_from(record.len()).ok();
        let fits = self.raw.len().checked_add(4 + record.len()).is_some_and(|n| u32::try_from(n).is_ok());
        let (Some(len), true, Some(records)) = (len, fits, self.records.checked_add(1)) else {
            return Err(format!(
                "a record of {} bytes does not fit a cache chunk ({} bytes and {} records buffered; a \
                 chunk holds at most 4 GiB)",
                record.len(),
                self.raw.len(),
                self.records
            ));
        };
        self.raw.extend_from_slice(&len.to_le_bytes());
        self.raw.extend_from_slice(record);
        self.records = records;
        Ok(())
    }

    /// Bytes of encoded records buffered.
    pub fn raw_len(&self) -> usize {
        self.raw.len()
    }

    /// Records buffered.
    pub fn records(&self) -> u32 {
        self.records
    }

    /// Encodes the buffered records as a chunk object and empties the buffer.
    pub fn take_encoded(&mut self) -> Result<EncodedChunk, String> {
        let raw = std::mem::take(&mut self.raw);
        let records = std::mem::take(&mut self.records);
        encode(&raw, records)
    }
}

/// Encodes `raw` (`records` encoded records) as a chunk object.
fn encode(raw: &[u8], records: u32) -> Result<EncodedChunk, String> {
    let raw_len =
        u32::try_from(raw.len()).map_err(|_| format!("{} bytes is too large for a chunk", raw.len()))?;
    let compressed =
        zstd::bulk::compress(raw, ZSTD_LEVEL).map_err(|e| format!("zstd compression failed: {e}"))?;
    let (codec, payload) =
        if compressed.len() < raw.len() { (CODEC_ZSTD, compressed.as_slice()) } else { (CODEC_NONE, raw) };
    let payload_len = u32::try_from(payload.len()).map_err(|_| "chunk payload too large".to_string())?;
    let crc32 = crc32fast::hash(payload);
    let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&[codec, 0, 0, 0]);
    bytes.extend_from_slice(&records.to_le_bytes());
    bytes.extend_from_slice(&raw_len.to_le_bytes());
    bytes.extend_from_slice(&payload_len.to_le_bytes());
    bytes.extend_from_slice(&crc32.to_le_bytes());
    bytes.extend_from_slice(payload);
    Ok(EncodedChunk { bytes, records, raw_len, crc32 })
}

/// Reads the little-endian u32 at `offset` of `header` (which is [`HEADER_LEN`] long).
fn u32_at(header: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&header[offset..offset + 4]);
    u32::from_le_bytes(word)
}

/// Decodes chunk object `object`, checking it against `meta` (size, record count, raw length,
/// crc) and against itself (magic, codec, padding, payload length, crc, decoded length, record
/// framing). Returns the records, or the reason the object is corrupt.
pub(crate) fn decode(object: Bytes, meta: &ChunkMeta) -> Result<Vec<Bytes>, String> {
    let size = object.len() as u64;
    if size != meta.stored_bytes {
        return Err(format!("object is {size} bytes, the manifest says {}", meta.stored_bytes));
    }
    if object.len() < HEADER_LEN {
        return Err(format!("object is {size} bytes, shorter than the {HEADER_LEN}-byte chunk header"));
    }
    let header = &object[..HEADER_LEN];
    if header[..4] != MAGIC {
        return Err(format!("bad magic {:?} (expected `GRC1`)", String::from_utf8_lossy(&header[..4])));
    }
    let codec = header[4];
    if codec != CODEC_NONE && codec != CODEC_ZSTD {
        return Err(format!("unknown codec {codec}"));
    }
    if header[5..8] != [0, 0, 0] {
        return Err("nonzero header padding".into());
    }
    let records = u32_at(header, 8);
    let raw_len = u32_at(header, 12);
    let payload_len = u32_at(header, 16);
    let crc = u32_at(header, 20);
    let payload = object.slice(HEADER_LEN..);
    if payload.len() as u64 != u64::from(payload_len) {
        return Err(format!("header says {payload_len} payload bytes, the object has {}", payload.len()));
    }
    if u64::from(records) != meta.elements {
        return Err(format!("header says {records} records, the manifest says {}", meta.elements));
    }
    if u64::from(raw_len) != meta.raw_bytes {
        return Err(format!("header says {raw_len} raw bytes, the manifest says {}", meta.raw_bytes));
    }
    if crc != meta.crc32 {
        return Err(format!("header crc32 {crc:08x} differs from the manifest's {:08x}", meta.crc32));
    }
    let actual = crc32fast::hash(&payload);
    if actual != crc {
        return Err(format!("payload crc32 is {actual:08x}, expected {crc:08x}"));
    }
    let raw = match codec {
        CODEC_ZSTD => decompress(&payload, raw_len)?,
        _ => payload,
    };
    if raw.len() as u64 != u64::from(raw_len) {
        return Err(format!("payload decodes to {} bytes, the header says {raw_len}", raw.len()));
    }
    split_records(raw, records)
}

/// Decompresses a zstd payload, reading at most one byte more than `raw_len` so that a lying
/// header cannot make it allocate more than the data really holds.
fn decompress(payload: &[u8], raw_len: u32) -> Result<Bytes, String> {
    let decoder = zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(|e| format!("zstd payload does not decode: {e}"))?;
    let mut raw = Vec::with_capacity((raw_len as usize).min(8 << 20));
    decoder
        .take(u64::from(raw_len) + 1)
        .read_to_end(&mut raw)
        .map_err(|e| format!("zstd payload does not decode: {e}"))?;
    Ok(Bytes::from(raw))
}

/// Splits encoded records, which must be exactly `records` of them and nothing more.
fn split_records(raw: Bytes, records: u32) -> Result<Vec<Bytes>, String> {
    let mut out = Vec::with_capacity((records as usize).min(1 << 16));
    let mut at = 0usize;
    while at < raw.len() {
        if out.len() as u64 >= u64::from(records) {
            return Err(format!("{} trailing bytes after {records} records", raw.len() - at));
        }
        let Some(len_bytes) = raw.get(at..at + 4) else {
            return Err(format!("record {} has a truncated length prefix", out.len()));
        };
        let len = u32_at_slice(len_bytes) as usize;
        let start = at + 4;
        let Some(end) = start.checked_add(len).filter(|&end| end <= raw.len()) else {
            return Err(format!(
                "record {} claims {len} bytes, only {} remain",
                out.len(),
                raw.len() - start
            ));
        };
        out.push(raw.slice(start..end));
        at = end;
    }
    if out.len() as u64 != u64::from(records) {
        return Err(format!("payload holds {} records, the header says {records}", out.len()));
    }
    Ok(out)
}

fn u32_at_slice(four: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(four);
    u32::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(records: &[Vec<u8>]) -> (Bytes, ChunkMeta) {
        let mut buffer = ChunkBuffer::default();
        for r in records {
            buffer.push(r).unwrap();
        }
        let raw_len = buffer.raw_len();
        let encoded = buffer.take_encoded().unwrap();
        assert_eq!(buffer.raw_len(), 0);
        assert_eq!(encoded.raw_len as usize, raw_len);
        let meta = ChunkMeta {
            object: "w/chunk-00000.grc".into(),
            first: 0,
            elements: u64::from(encoded.records),
            stored_bytes: encoded.bytes.len() as u64,
            raw_bytes: u64::from(encoded.raw_len),
            crc32: encoded.crc32,
        };
        (Bytes::from(encoded.bytes), meta)
    }

    fn compressible() -> Vec<Vec<u8>> {
        (0..50u8).map(|i| vec![i; usize::from(i) * 3]).collect()
    }

    #[test]
    fn roundtrips_compressed_and_plain() {
        let records = compressible();
        let (bytes, meta) = chunk(&records);
        assert_eq!(bytes[4], CODEC_ZSTD);
        assert_eq!(decode(bytes, &meta).unwrap(), records);
        // Incompressible data stays plain.
        let noise: Vec<Vec<u8>> =
            vec![(0..64u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()];
        let (bytes, meta) = chunk(&noise);
        assert_eq!(bytes[4], CODEC_NONE);
        assert_eq!(decode(bytes, &meta).unwrap(), noise);
        // Empty records and an empty chunk.
        let empties = vec![Vec::new(), Vec::new()];
        let (bytes, meta) = chunk(&empties);
        assert_eq!(decode(bytes, &meta).unwrap(), empties);
        let (bytes, meta) = chunk(&[]);
        assert_eq!(decode(bytes, &meta).unwrap(), Vec::<Bytes>::new());
    }

    #[test]
    fn every_single_byte_change_and_truncation_is_detected() {
        for records in [compressible(), vec![b"plain".to_vec()]] {
            let (bytes, meta) = chunk(&records);
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut bad = bytes.to_vec();
                    bad[i] ^= 1 << bit;
                    assert!(decode(Bytes::from(bad), &meta).is_err(), "flip of bit {bit} of byte {i}");
                }
            }
            for len in 0..bytes.len() {
                let mut short_meta = meta.clone();
                short_meta.stored_bytes = len as u64;
                assert!(decode(bytes.slice(..len), &short_meta).is_err(), "truncated to {len}");
            }
        }
    }

    #[test]
    fn reasons_are_specific() {
        let (bytes, meta) = chunk(&compressible());
        let mut m = meta.clone();
        m.elements += 1;
        assert!(decode(bytes.clone(), &m).unwrap_err().contains("records"));
        let mut m = meta.clone();
        m.stored_bytes += 1;
        assert!(decode(bytes.clone(), &m).unwrap_err().contains("the manifest says"));
        let mut bad = bytes.to_vec();
        bad[0] = b'X';
        assert!(decode(Bytes::from(bad), &meta).unwrap_err().contains("magic"));
        let mut bad = bytes.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        assert!(decode(Bytes::from(bad), &meta).unwrap_err().contains("crc32"));
    }

    #[test]
    fn rejects_oversized_records_without_buffering_them() {
        let mut buffer = ChunkBuffer { raw: Vec::new(), records: u32::MAX };
        assert!(buffer.push(b"x").unwrap_err().contains("does not fit"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512),
                                       elements in 0u64..8, raw in 0u64..1024, crc in any::<u32>()) {
            let meta = ChunkMeta {
                object: "w/chunk-00000.grc".into(),
                first: 0,
                elements,
                stored_bytes: data.len() as u64,
                raw_bytes: raw,
                crc32: crc,
            };
            let _ = decode(Bytes::from(data), &meta);
        }

        #[test]
        fn consistent_forgeries_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..256),
                                            codec in 0u8..2, records in 0u32..6, raw_len in 0u32..2048) {
            // A header that agrees with the manifest and the crc, over arbitrary payload bytes: the
            // decoder must still fail cleanly or return exactly `records` records.
            let crc32 = crc32fast::hash(&payload);
            let mut object = MAGIC.to_vec();
            object.extend_from_slice(&[codec, 0, 0, 0]);
            object.extend_from_slice(&records.to_le_bytes());
            object.extend_from_slice(&raw_len.to_le_bytes());
            object.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            object.extend_from_slice(&crc32.to_le_bytes());
            object.extend_from_slice(&payload);
            let meta = ChunkMeta {
                object: "w/chunk-00000.grc".into(),
                first: 0,
                elements: u64::from(records),
                stored_bytes: object.len() as u64,
                raw_bytes: u64::from(raw_len),
                crc32,
            };
            if let Ok(out) = decode(Bytes::from(object), &meta) {
                prop_assert_eq!(out.len(), records as usize);
            }
        }

        #[test]
        fn roundtrips_arbitrary_records(records in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let (bytes, meta) = chunk(&records);
            prop_assert_eq!(decode(bytes, &meta).unwrap(), records);
        }
    }
}
