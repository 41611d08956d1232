//! Counting a JSONL file's elements by streaming it through a fixed buffer: a line is an element
//! when it holds a `{` (reading skips blank lines, and fails on any other line that is not a JSON
//! object, which must hold one), and a line whose first character is ASCII but not `{` or
//! whitespace fails at once, as reading it would. Nothing is parsed and no line is held.

use super::ranged::{Deadline, RangedReader};
use crate::source::{Object, SourceError};
use object_store::ObjectStore;
use std::io::Read;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Bytes read at a time.
const BUFFER: usize = 1 << 16;

/// Counts elements over a file's bytes, fed in pieces of any size.
#[derive(Debug, Default)]
pub struct LineCounter {
    /// Elements in the lines ended so far.
    elements: u64,
    /// Lines ended so far.
    lines: u64,
    /// Whether the current line has a character other than whitespace.
    started: bool,
    /// Whether it has a `{`.
    brace: bool,
}

/// What `str::trim` removes among ASCII bytes.
fn blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

impl LineCounter {
    /// Takes the next bytes of the file; an error names the (1-based) line that cannot be a JSON
    /// object.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), (u64, String)> {
        for &b in bytes {
            if b == b'\n' {
                self.end_line();
                continue;
            }
            if !self.started && !blank(b) {
                self.started = true;
                if b.is_ascii() && b != b'{' {
                    return Err((
                        self.lines + 1,
                        format!(
                            "each line must be a JSON object such as {{\"text\": \"...\"}}; this one starts with {:?}",
                            char::from(b)
                        ),
                    ));
                }
            }
            self.brace |= b == b'{';
        }
        Ok(())
    }

    fn end_line(&mut self) {
        self.elements += u64::from(self.brace);
        self.lines += 1;
        self.started = false;
        self.brace = false;
    }

    /// The count, the last line ended by the end of the file.
    pub fn finish(mut self) -> u64 {
        self.end_line();
        self.elements
    }
}

/// The elements of the JSONL file `object`.
pub fn count(
    store: &Arc<dyn ObjectStore>,
    object: &Object,
    rt: &Handle,
    deadline: Deadline,
) -> Result<u64, SourceError> {
    let mut reader = RangedReader::new(store, &object.location, object.size, rt, deadline);
    let mut buffer = vec![0u8; BUFFER];
    let mut counter = LineCounter::default();
    loop {
        let n = reader
            .read(&mut buffer)
            .map_err(|e| SourceError::data(object.location.to_string(), format!("cannot read: {e}")))?;
        if n == 0 {
            return Ok(counter.finish());
        }
        counter
            .feed(&buffer[..n])
            .map_err(|(line, message)| SourceError::data(format!("{}:{line}", object.location), message))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_of(text: &str, piece: usize) -> Result<u64, (u64, String)> {
        let mut counter = LineCounter::default();
        for chunk in text.as_bytes().chunks(piece.max(1)) {
            counter.feed(chunk)?;
        }
        Ok(counter.finish())
    }

    #[test]
    fn counts_object_lines_and_skips_blank_ones_in_any_pieces() {
        let text = "{\"a\": 1}\n\n  \t\n{\"b\": \"{\"}\r\n\u{a0}\n\x0b{\"c\": 3}\n{\"d\": 4}";
        for piece in [1, 2, 3, 7, 1000] {
            assert_eq!(count_of(text, piece), Ok(4), "pieces of {piece}");
        }
        assert_eq!(count_of("", 4), Ok(0));
        assert_eq!(count_of("\n\n", 4), Ok(0));
        assert_eq!(count_of("{}\n", 4), Ok(1), "a trailing newline ends the last line");
    }

    #[test]
    fn a_line_that_cannot_be_an_object_names_its_number() {
        let (line, message) = count_of("{\"a\": 1}\n\n[1, 2]\n", 5).unwrap_err();
        assert_eq!(line, 3);
        assert!(message.contains("JSON object") && message.contains("'['"), "{message}");
    }
}
