//! TFRecord framing, as TensorFlow writes it: each record is
//!
//! ```text
//! u64 length (little-endian)
//! u32 masked CRC32C of the 8 length bytes
//! length bytes of data
//! u32 masked CRC32C of the data
//! ```
//!
//! A masked CRC is `((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping). Both CRCs are checked
//! for every record; a bad one, or a file that ends inside a record, is a [`RecordError`] that
//! names the record's index and byte offset.

use std::io::{ErrorKind, Read};

/// The constant TensorFlow adds when it masks a CRC.
const MASK_DELTA: u32 = 0xa282_ead8;

/// Bytes of a record's header: the length and its CRC.
const HEADER: u64 = 12;

/// Bytes of a record's footer: the data's CRC.
const FOOTER: u64 = 4;

/// Bytes reserved up front for a record whose length could not be checked against the data
/// left (a compressed file): a longer record grows its buffer as its bytes arrive.
const UNCHECKED_RESERVE: u64 = 1 << 20;

/// The masked CRC32C of `data`, as TFRecord files store it.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Appends `data` to `out` as one TFRecord record (length, CRCs and all).
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let length = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// Where a record starts, for messages: its index in the file and its byte offset (in the
/// decompressed stream when the file is compressed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    /// Index of the record in the file, from 0.
    pub index: u64,
    /// Byte offset of the record's first header byte.
    pub offset: u64,
    /// Whether `offset` counts decompressed bytes.
    pub decompressed: bool,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "record {} at byte offset {}", self.index, self.offset)?;
        if self.decompressed {
            f.write_str(" of the decompressed data")?;
        }
        Ok(())
    }
}

/// A record that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file ends inside the record.
    #[error(
        "{at}: truncated: the file ends inside the record's {part} ({got} of {want} bytes); was it written completely?"
    )]
    Truncated {
        /// The record.
        at: At,
        /// Which part was cut: `header`, `data` or `data CRC`.
        part: &'static str,
        /// Bytes of that part that were there.
        got: u64,
        /// Bytes the part needs.
        want: u64,
    },
    /// The header gives a length longer than the bytes left in the file.
    #[error(
        "{at}: truncated: the record says it holds {length} bytes, but only {left} bytes follow its header; was it written completely?"
    )]
    TooLong {
        /// The record.
        at: At,
        /// The length the header gives.
        length: u64,
        /// Bytes after the header, the data's CRC included.
        left: u64,
    },
    /// The CRC of the length does not match.
    #[error(
        "{at}: corrupt: the CRC of the length does not match (stored {stored:#010x}, computed {computed:#010x}); the file is damaged or not a TFRecord file"
    )]
    LengthCrc {
        /// The record.
        at: At,
        /// The masked CRC in the file.
        stored: u32,
        /// The masked CRC of the length bytes.
        computed: u32,
    },
    /// The CRC of the data does not match.
    #[error(
        "{at}: corrupt: the CRC of the data does not match (stored {stored:#010x}, computed {computed:#010x}); the file is damaged"
    )]
    DataCrc {
        /// The record.
        at: At,
        /// The masked CRC in the file.
        stored: u32,
        /// The masked CRC of the data.
        computed: u32,
    },
    /// The underlying stream failed (the store, or a GZIP stream that is not one).
    #[error("{at}: cannot read: {source}")]
    Io {
        /// The record.
        at: At,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
}

/// One record's data and where it was.
#[derive(Debug)]
pub struct Record {
    /// Where the record starts.
    pub at: At,
    /// Its data, CRC checked.
    pub data: Vec<u8>,
}

/// Reads records one after another from a byte stream.
pub struct RecordReader<R> {
    inner: R,
    next: At,
    /// Bytes left in the stream when known (a plain file of known size): record lengths are
    /// checked against it before anything is allocated.
    left: Option<u64>,
}

impl<R: Read> RecordReader<R> {
    /// Reads records from `inner`. `size` is the stream's length when known (a plain file), to
    /// check each record's length against; `decompressed` says that offsets count decompressed
    /// bytes, for messages.
    pub fn new(inner: R, size: Option<u64>, decompressed: bool) -> RecordReader<R> {
        RecordReader { inner, next: At { index: 0, offset: 0, decompressed }, left: size }
    }

    /// Reads the next record's header: where the record starts and its data length, checked
    /// against the bytes left when they are known. `None` at the end of the stream.
    fn header(&mut self) -> Result<Option<(At, u64)>, RecordError> {
        let at = self.next;
        let mut header = [0u8; HEADER as usize];
        let got = read_full(&mut self.inner, &mut header).map_err(|source| RecordError::Io { at, source })?;
        if got == 0 {
            return Ok(None);
        }
        if got < header.len() {
            return Err(RecordError::Truncated { at, part: "header", got: got as u64, want: HEADER });
        }
        let (length_bytes, crc_bytes) = header.split_at(8);
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        let computed = masked_crc32c(length_bytes);
        if stored != computed {
            return Err(RecordError::LengthCrc { at, stored, computed });
        }
        let mut length = [0u8; 8];
        length.copy_from_slice(length_bytes);
        let length = u64::from_le_bytes(length);
        if let Some(left) = self.left {
            let left = left.saturating_sub(HEADER);
            if length.checked_add(FOOTER).is_none_or(|need| need > left) {
                return Err(RecordError::TooLong { at, length, left });
            }
        }
        Ok(Some((at, length)))
    }

    /// The record at `at` of `length` data bytes was read or skipped: the next one follows.
    fn advance(&mut self, at: At, length: u64) {
        let size = HEADER + length + FOOTER;
        self.left = self.left.map(|left| left.saturating_sub(size));
        self.next = At { index: at.index + 1, offset: at.offset + size, decompressed: at.decompressed };
    }

    /// Moves past the next record without holding its data, for counting records in memory
    /// bounded by a header: `skip` moves the stream forward by the given bytes (a seek on a plain
    /// file, a read-through on a compressed one) and returns how many it moved. The data's CRC is
    /// not checked; reading the record does. False at the end of the stream.
    pub fn skip_record(
        &mut self,
        skip: impl FnOnce(&mut R, u64) -> std::io::Result<u64>,
    ) -> Result<bool, RecordError> {
        let Some((at, length)) = self.header()? else { return Ok(false) };
        let want = length.saturating_add(FOOTER);
        let moved = skip(&mut self.inner, want).map_err(|source| RecordError::Io { at, source })?;
        if moved < length {
            return Err(RecordError::Truncated { at, part: "data", got: moved, want: length });
        }
        if moved < want {
            return Err(RecordError::Truncated { at, part: "data CRC", got: moved - length, want: FOOTER });
        }
        self.advance(at, length);
        Ok(true)
    }

    /// The next record, or `None` at the end of the stream.
    pub fn next_record(&mut self) -> Result<Option<Record>, RecordError> {
        let Some((at, length)) = self.header()? else { return Ok(None) };
        let io = |source| RecordError::Io { at, source };
        let reserve = match self.left {
            Some(_) => length,
            None => length.min(UNCHECKED_RESERVE),
        };
        let mut data = Vec::new();
        data.try_reserve_exact(usize::try_from(reserve).unwrap_or(usize::MAX)).map_err(|e| {
            io(std::io::Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot hold a record of {length} bytes: {e}"),
            ))
        })?;
        let got = (&mut self.inner).take(length).read_to_end(&mut data).map_err(io)? as u64;
        if got < length {
            return Err(RecordError::Truncated { at, part: "data", got, want: length });
        }
        let mut footer = [0u8; FOOTER as usize];
        let got = read_full(&mut self.inner, &mut footer).map_err(io)?;
        if got < footer.len() {
            return Err(RecordError::Truncated { at, part: "data CRC", got: got as u64, want: FOOTER });
        }
        let stored = u32::from_le_bytes(footer);
        let computed = masked_crc32c(&data);
        if stored != computed {
            return Err(RecordError::DataCrc { at, stored, computed });
        }
        self.advance(at, length);
        Ok(Some(Record { at, data }))
    }
}

/// Fills `buf` from `reader` until it is full or the stream ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(bytes: &[u8]) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut reader = RecordReader::new(bytes, Some(bytes.len() as u64), false);
        let mut out = Vec::new();
        while let Some(r) = reader.next_record()? {
            out.push(r.data);
        }
        Ok(out)
    }

    /// Moves a plain reader forward by reading through.
    fn read_through(reader: &mut &[u8], n: u64) -> std::io::Result<u64> {
        std::io::copy(&mut reader.take(n), &mut std::io::sink())
    }

    #[test]
    fn skipping_counts_what_reading_reads_and_finds_the_same_framing_errors() {
        let mut file = Vec::new();
        for data in [&b"first"[..], b"", b"third record"] {
            write_record(&mut file, data);
        }
        let count = |bytes: &[u8], size: Option<u64>| -> Result<u64, RecordError> {
            let mut reader = RecordReader::new(bytes, size, size.is_none());
            let mut n = 0;
            while reader.skip_record(read_through)? {
                n += 1;
            }
            Ok(n)
        };
        assert_eq!(count(&file, Some(file.len() as u64)).unwrap(), 3);
        assert_eq!(count(&file, None).unwrap(), 3, "a stream of unknown length");
        let mut bad = file.clone();
        bad[21] ^= 1;
        assert!(matches!(count(&bad, None), Err(RecordError::LengthCrc { at: At { index: 1, .. }, .. })));
        // Cut inside the last record's data: a known size says so from the header, a stream on
        // reaching its end.
        let cut = &file[..file.len() - 6];
        assert!(matches!(count(cut, Some(cut.len() as u64)), Err(RecordError::TooLong { .. })));
        let err = count(cut, None).unwrap_err();
        assert!(matches!(err, RecordError::Truncated { part: "data", got: 10, want: 12, .. }), "{err}");
        let cut = &file[..file.len() - 2];
        let err = count(cut, None).unwrap_err();
        assert!(matches!(err, RecordError::Truncated { part: "data CRC", got: 2, want: 4, .. }), "{err}");
        // A header claiming an enormous record allocates nothing.
        let mut huge = Vec::new();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        huge.extend_from_slice(&masked_crc32c(&u64::MAX.to_le_bytes()).to_le_bytes());
        assert!(matches!(count(&huge, None), Err(RecordError::Truncated { part: "data", got: 0, .. })));
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // The CRC32C check value of "123456789" is 0xe3069283; TensorFlow masks it.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn round_trips_and_reports_offsets() {
        let mut file = Vec::new();
        for data in [&b"first"[..], b"", b"third record"] {
            write_record(&mut file, data);
        }
        assert_eq!(records(&file).unwrap(), vec![b"first".to_vec(), Vec::new(), b"third record".to_vec()]);

        // Record 1 starts after record 0's 12 + 5 + 4 bytes.
        let mut bad = file.clone();
        bad[21] ^= 1;
        let err = records(&bad).unwrap_err();
        assert!(matches!(err, RecordError::LengthCrc { at: At { index: 1, offset: 21, .. }, .. }), "{err}");
        assert!(err.to_string().contains("record 1 at byte offset 21"), "{err}");

        let mut bad = file.clone();
        bad[12] ^= 0x40;
        let err = records(&bad).unwrap_err();
        assert!(matches!(err, RecordError::DataCrc { at: At { index: 0, offset: 0, .. }, .. }), "{err}");

        for cut in [1, 11, 12, 15, 20] {
            let err = records(&file[..cut]).unwrap_err();
            assert!(err.to_string().contains("record 0 at byte offset 0: truncated"), "{cut}: {err}");
        }
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut file = Vec::new();
        let length = (u64::MAX - 2).to_le_bytes();
        file.extend_from_slice(&length);
        file.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        file.extend_from_slice(b"tiny");
        let err = records(&file).unwrap_err();
        assert!(matches!(err, RecordError::TooLong { .. }), "{err}");
        // Without a known size the data runs out instead.
        let mut reader = RecordReader::new(&file[..], None, true);
        let err = reader.next_record().unwrap_err();
        assert!(matches!(err, RecordError::Truncated { part: "data", got: 4, .. }), "{err}");
        assert!(err.to_string().contains("of the decompressed data"), "{err}");
    }
}
