//! Counting a CSV file's rows by streaming it through fixed buffers with `csv-core`, the parser
//! the `csv` reader is built on, configured as reading configures it: quoting, blank lines and
//! the delimiter are handled alike, so the count is the one reading yields. Cells are parsed into a
//! scratch buffer and discarded, so a row of any length is counted in bounded memory. Each row's
//! cell count is checked against the header's, as reading checks it.

use super::ranged::{Deadline, RangedReader};
use crate::source::{Object, SourceError};
use csv_core::{ReadRecordResult, ReaderBuilder};
use object_store::ObjectStore;
use std::io::Read;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Bytes read, and cell bytes parsed, at a time.
const BUFFER: usize = 1 << 16;
/// Cell ends parsed at a time.
const ENDS: usize = 1 << 10;

/// The rows (after the header) of the CSV file `object`, whose cells `delimiter` separates.
pub fn count(
    store: &Arc<dyn ObjectStore>,
    object: &Object,
    delimiter: u8,
    rt: &Handle,
    deadline: Deadline,
) -> Result<u64, SourceError> {
    let reader = RangedReader::new(store, &object.location, object.size, rt, deadline);
    count_rows(reader, delimiter).map_err(|(line, message)| match line {
        Some(line) => SourceError::data(format!("{}:{line}", object.location), message),
        None => SourceError::data(object.location.to_string(), message),
    })
}

/// The rows of the CSV stream `input`; an error names the line it is on when it has one.
fn count_rows(mut input: impl Read, delimiter: u8) -> Result<u64, (Option<u64>, String)> {
    let mut parser = ReaderBuilder::new().delimiter(delimiter).build();
    let mut buffer = vec![0u8; BUFFER];
    let mut scratch = vec![0u8; BUFFER];
    let mut ends = [0usize; ENDS];
    let (mut start, mut filled, mut eof) = (0, 0, false);
    let mut header: Option<u64> = None;
    let (mut cells, mut rows, mut row_line) = (0u64, 0u64, 1u64);
    // Bounded: every pass consumes input, fills a buffer, or ends a record; the input is finite.
    loop {
        if start == filled && !eof {
            filled = input.read(&mut buffer).map_err(|e| (None, format!("cannot read: {e}")))?;
            start = 0;
            eof = filled == 0;
        }
        if cells == 0 {
            row_line = parser.line();
        }
        let (result, read, _, ended) = parser.read_record(&buffer[start..filled], &mut scratch, &mut ends);
        start += read;
        cells += ended as u64;
        match result {
            ReadRecordResult::InputEmpty if eof => return Ok(rows),
            ReadRecordResult::InputEmpty
            | ReadRecordResult::OutputFull
            | ReadRecordResult::OutputEndsFull => {}
            ReadRecordResult::Record => {
                match header {
                    None => header = Some(cells),
                    Some(expected) if expected != cells => {
                        return Err((
                            Some(row_line),
                            format!(
                                "the row has {cells} cells but the header has {expected}; every row needs one \
                                 cell per header column (quote cells that hold the delimiter, or set \
                                 spec.source.delimiter)"
                            ),
                        ));
                    }
                    Some(_) => rows += 1,
                }
                cells = 0;
            }
            ReadRecordResult::End => return Ok(rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as the `csv` reader reads them (as `source::csv` configures it).
    fn read_rows(text: &[u8], delimiter: u8) -> usize {
        let mut reader = ::csv::ReaderBuilder::new().delimiter(delimiter).has_headers(true).from_reader(text);
        reader.byte_records().inspect(|r| assert!(r.is_ok(), "{r:?}")).count()
    }

    /// Feeds `text` one byte per read, so that every state meets a buffer boundary.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else { return Ok(0) };
            let Some(slot) = buf.first_mut() else { return Ok(0) };
            *slot = *first;
            self.0 = rest;
            Ok(1)
        }
    }

    #[test]
    fn counts_what_the_csv_reader_reads() {
        let cases: [&[u8]; 7] = [
            b"a,b\n1,2\n3,4\n",
            b"a,b\n1,2\n3,4",
            b"a,b\r\n1,2\r\n\r\n\n3,4\r\n",
            b"\xef\xbb\xbfa,b\n\"x,\ny\",2\n\"\"\"q\"\"\",3\n",
            b"a,b\n",
            b"a,b",
            b"a\n\n\n",
        ];
        for text in cases {
            let expected = read_rows(text, b',') as u64;
            assert_eq!(count_rows(text, b',').unwrap(), expected, "{:?}", String::from_utf8_lossy(text));
            assert_eq!(
                count_rows(Trickle(text), b',').unwrap(),
                expected,
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
        assert_eq!(count_rows(&b"a\tb\n1\t2\n"[..], b'\t').unwrap(), 1);
        assert_eq!(count_rows(&b""[..], b',').unwrap(), 0);
    }

    #[test]
    fn a_row_with_a_missing_cell_names_its_line() {
        let (line, message) = count_rows(&b"a,b\n1,2\n3\n4,5\n"[..], b',').unwrap_err();
        assert_eq!(line, Some(3));
        assert!(message.contains("1 cells but the header has 2"), "{message}");
    }

    #[test]
    fn a_row_longer_than_every_buffer_is_counted() {
        let mut text = b"text,n\n\"".to_vec();
        text.extend(std::iter::repeat_n(b'x', 3 * BUFFER));
        text.extend_from_slice(b"\",1\n");
        let mut wide = b"x".to_vec();
        for _ in 0..3 * ENDS {
            wide.extend_from_slice(b",x");
        }
        wide.push(b'\n');
        let mut wide_file = wide.clone();
        wide_file.extend_from_slice(&wide);
        assert_eq!(count_rows(&text[..], b',').unwrap(), 1);
        assert_eq!(count_rows(&wide_file[..], b',').unwrap(), 1, "3,073 cells a row");
    }
}
