//! Counting a TFRecord file's records from their headers alone: a plain file seeks past every
//! record's data (a long gap is a new ranged read, so large records are never fetched), and a
//! GZIP-compressed one is decompressed through a fixed buffer and discarded. Memory is bounded by
//! the buffers, whatever the records' sizes; reading, which checks every data CRC, yields the same
//! count or fails.

use super::ranged::{Deadline, RangedReader};
use crate::source::tfrecord::record::{RecordError, RecordReader};
use crate::source::{Object, SourceError};
use object_store::ObjectStore;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::sync::Arc;
use tokio::runtime::Handle;

/// Bytes of compressed data read at a time.
const BUFFER: usize = 1 << 16;

/// The records of the TFRecord file `object`, GZIP-compressed when `gzip`.
pub fn count(
    store: &Arc<dyn ObjectStore>,
    object: &Object,
    gzip: bool,
    rt: &Handle,
    deadline: Deadline,
) -> Result<u64, SourceError> {
    let location = object.location.to_string();
    let bad = |e: RecordError| SourceError::data(location.clone(), e.to_string());
    let reader = RangedReader::new(store, &object.location, object.size, rt, deadline);
    let mut n = 0u64;
    if gzip {
        let decoder = flate2::bufread::MultiGzDecoder::new(BufReader::with_capacity(BUFFER, reader));
        let mut records = RecordReader::new(decoder, None, true);
        while records
            .skip_record(|r, bytes| std::io::copy(&mut r.take(bytes), &mut std::io::sink()))
            .map_err(bad)?
        {
            n += 1;
        }
    } else {
        let mut records = RecordReader::new(reader, Some(object.size), false);
        // The header was checked against the bytes left, so the seek stays inside the file.
        let seek = |r: &mut RangedReader<'_>, bytes: u64| -> std::io::Result<u64> {
            let by = i64::try_from(bytes).map_err(std::io::Error::other)?;
            r.seek(SeekFrom::Current(by))?;
            Ok(bytes)
        };
        while records.skip_record(seek).map_err(bad)? {
            n += 1;
        }
    }
    Ok(n)
}
