//! Thrift's compact protocol read step for step as the parquet crate (60.1) reads it, for the
//! checks that bound the crate's work on a file's own claims: the page headers ([`super::pages`])
//! and the footer ([`super::footer`]). The point is not the values alone but the work: a
//! [`Cursor`] takes the crate's path through the bytes, so it knows how many steps the crate's
//! read will take before the crate takes them.
//!
//! Three ways in which the crate's read is not the protocol make its work unbounded by the bytes,
//! and so are mirrored here:
//! - its skip (`skip_till_depth`) takes no byte for a boolean element of a list, set or map (the
//!   protocol writes one), so a list of 2^31 booleans costs 2^31 steps and 6 bytes. Both of its
//!   protocols share that skip;
//! - its `Read`-based protocol (page headers) does not fail a skipped `double`, UUID or binary
//!   past the end of the bytes: the skip stops at the end and the read goes on, so a list of
//!   2^31 doubles at the end of a chunk costs 2^31 steps ([`Protocol`]);
//! - a known field is read by its id whatever type its header declares (a list at an `i32`'s id
//!   is read as an `i32`), and `i16` and `i32` values wrap, so the crate's read and the
//!   protocol's part ways and the crate reads the rest of the bytes as something else. The
//!   callers read known ids by the crate's types, not by the declared ones.
//!
//! A [`Cursor`] counts the crate's steps (a field of a struct, an element of a collection) and
//! gives up, as an error, once they pass the bytes read by [`SLACK_STEPS`]: what a writer
//! produced takes a byte at least for each.
//!
//! Tied to parquet 60.1's `parquet_thrift.rs`: an upgrade must re-check its skip of a boolean
//! element, its `skip_bytes` at the end of the bytes, and the by-id reads of the structs the
//! callers mirror.

/// Steps past the bytes read that a read may take before it is refused: a writer's bytes take
/// none (each field and element takes a byte at least).
pub(super) const SLACK_STEPS: usize = 64;
/// The crate's depth for a skip (`DEFAULT_SKIP_DEPTH`).
pub(super) const SKIP_DEPTH: u32 = 64;

/// Which of the crate's two protocols reads the bytes: they differ at the end of the bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Protocol {
    /// `ThriftReadInputProtocol`, for page headers: a skip past the end stops there, without
    /// an error (`io::copy` of a `take`).
    Read,
    /// `ThriftSliceInputProtocol`, for the footer: a skip past the end fails.
    Slice,
}

/// Why bytes were not read to their end.
#[derive(Debug, PartialEq)]
pub(super) enum Unread {
    /// The crate's read fails here as well, after no more steps than bytes: it reports the
    /// error itself.
    Fails,
    /// The crate's read would take more steps than the bytes (by [`SLACK_STEPS`]).
    Excess { steps: usize, bytes: usize },
}

pub(super) type Step<T> = Result<T, Unread>;

/// A boolean field's value is in its header; the crate refuses any other type there.
pub(super) fn bool_field(kind: u8) -> Step<()> {
    if matches!(kind, 1 | 2) { Ok(()) } else { Err(Unread::Fails) }
}

/// The crate's read position, and the steps it has taken.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    steps: usize,
    protocol: Protocol,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8], protocol: Protocol) -> Self {
        Cursor { bytes, at: 0, steps: 0, protocol }
    }

    /// The bytes read so far.
    pub(super) fn at(&self) -> usize {
        self.at
    }

    /// One more step: an error once they pass the bytes read by [`SLACK_STEPS`].
    fn step(&mut self) -> Step<()> {
        self.steps += 1;
        if self.steps > self.at.saturating_add(SLACK_STEPS) {
            return Err(Unread::Excess { steps: self.steps, bytes: self.at });
        }
        Ok(())
    }

    pub(super) fn byte(&mut self) -> Step<u8> {
        let b = *self.bytes.get(self.at).ok_or(Unread::Fails)?;
        self.at += 1;
        Ok(b)
    }

    /// `skip_bytes`: `n` bytes. Past the end, the `Read` protocol stops at the end and the
    /// slice protocol fails.
    fn skip_bytes(&mut self, n: u64) -> Step<()> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left && self.protocol == Protocol::Slice {
            return Err(Unread::Fails);
        }
        self.at += usize::try_from(n.min(left)).unwrap_or(0);
        Ok(())
    }

    /// `read_bytes` (a binary or a string, read): its length, then that many bytes, which
    /// must be there.
    pub(super) fn binary(&mut self) -> Step<()> {
        let n = self.varint()?;
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(Unread::Fails);
        }
        self.skip_bytes(n)
    }

    /// `read_double`: 8 bytes, which must be there.
    pub(super) fn double(&mut self) -> Step<()> {
        if self.bytes.len() - self.at < 8 {
            return Err(Unread::Fails);
        }
        self.skip_bytes(8)
    }

    /// `read_vlq`: as many bytes as the varint has, the shift wrapping as the crate's does.
    pub(super) fn varint(&mut self) -> Step<u64> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f).wrapping_shl(shift);
            if b & 0x80 == 0 {
                return Ok(value);
            }
            shift = shift.wrapping_add(7);
        }
    }

    fn zigzag(&mut self) -> Step<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// `read_i32`: the zigzag value cut to 32 bits, as the crate's `as` does.
    pub(super) fn i32(&mut self) -> Step<i32> {
        Ok(self.zigzag()? as i32)
    }

    /// `read_field_begin`: the next field's id and type, `None` at the struct's stop.
    pub(super) fn field_begin(&mut self, last: i16) -> Step<Option<(i16, u8)>> {
        let head = self.byte()?;
        let kind = head & 0x0f;
        if kind == 0 {
            return Ok(None);
        }
        if kind > 13 {
            return Err(Unread::Fails);
        }
        let id = match head >> 4 {
            // `read_i16`: the zigzag value cut to 16 bits.
            0 => self.zigzag()? as i16,
            delta => last.checked_add(i16::from(delta)).ok_or(Unread::Fails)?,
        };
        self.step()?;
        Ok(Some((id, kind)))
    }

    /// Reads a struct's fields to its stop, calling `field` with each one's id and type.
    pub(super) fn fields(&mut self, mut field: impl FnMut(&mut Self, i16, u8) -> Step<()>) -> Step<()> {
        let mut last = 0i16;
        while let Some((id, kind)) = self.field_begin(last)? {
            field(self, id, kind)?;
            last = id;
        }
        Ok(())
    }

    /// `read_list_begin`: a list's (or set's) element type and count.
    pub(super) fn list_begin(&mut self) -> Step<(u8, i32)> {
        let head = self.byte()?;
        if head == 0 {
            // The crate takes an empty list written with no element type as a list of bytes.
            return Ok((3, 0));
        }
        let element = element_type(head & 0x0f)?;
        let n = match head >> 4 {
            15 => i32::try_from(self.varint()?).map_err(|_| Unread::Fails)?,
            n => i32::from(n),
        };
        Ok((element, n))
    }

    /// One element of a collection: a step.
    pub(super) fn element(&mut self) -> Step<()> {
        self.step()
    }

    /// `skip_till_depth`: skips a value of type `kind`.
    pub(super) fn skip(&mut self, kind: u8, depth: u32) -> Step<()> {
        if depth == 0 {
            return Err(Unread::Fails);
        }
        match kind {
            // A boolean: no byte, as a field (its value is in the field's header) and, unlike
            // the protocol, as an element.
            1 | 2 => Ok(()),
            3 => self.byte().map(drop),
            4..=6 => self.varint().map(drop),
            7 => self.skip_bytes(8),
            8 => {
                let n = self.varint()?;
                self.skip_bytes(n)
            }
            9 | 10 => {
                let (element, n) = self.list_begin()?;
                for _ in 0..n {
                    self.step()?;
                    self.skip(element, depth - 1)?;
                }
                Ok(())
            }
            11 => {
                let n = i32::try_from(self.varint()?).map_err(|_| Unread::Fails)?;
                if n > 0 {
                    let kinds = self.byte()?;
                    let (key, value) = (element_type(kinds >> 4)?, element_type(kinds & 0x0f)?);
                    for _ in 0..n {
                        self.step()?;
                        self.skip(key, depth - 1)?;
                        self.skip(value, depth - 1)?;
                    }
                }
                Ok(())
            }
            12 => self.fields(|c, _, kind| c.skip(kind, depth - 1)),
            13 => self.skip_bytes(16),
            _ => Err(Unread::Fails),
        }
    }
}

/// A collection's element type as the crate takes it (`ElementType`, then `FieldType`): 1 and
/// 2 are both a boolean.
fn element_type(nibble: u8) -> Step<u8> {
    match nibble {
        1..=13 => Ok(nibble),
        _ => Err(Unread::Fails),
    }
}

/// Thrift's compact encoding of the parts the tests put together.
#[cfg(test)]
pub(super) mod encode {
    /// A field header: `delta` from the last id, compact type `kind`.
    pub(in crate::source::parquet) fn field(delta: u8, kind: u8) -> u8 {
        delta << 4 | kind
    }

    /// `v` as an unsigned varint.
    pub(in crate::source::parquet) fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// `v` as a zigzag varint (thrift's compact `i16`, `i32` and `i64`).
    pub(in crate::source::parquet) fn zigzag(v: i64) -> Vec<u8> {
        varint(((v << 1) ^ (v >> 63)) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{field, varint};
    use super::*;

    /// Skips one struct from `bytes` under `protocol`.
    fn skip_struct(bytes: &[u8], protocol: Protocol) -> Step<usize> {
        let mut c = Cursor::new(bytes, protocol);
        c.skip(12, SKIP_DEPTH)?;
        Ok(c.at())
    }

    #[test]
    fn the_protocols_differ_only_past_the_end() {
        // Field 1, a double cut to 3 bytes: the `Read` protocol skips what is there.
        let cut = [field(1, 7), 1, 2, 3];
        assert_eq!(skip_struct(&cut, Protocol::Read), Err(Unread::Fails), "then the stop is missing");
        let mut c = Cursor::new(&cut[1..], Protocol::Read);
        assert_eq!((c.skip(7, SKIP_DEPTH), c.at()), (Ok(()), 3));
        let mut c = Cursor::new(&cut[1..], Protocol::Slice);
        assert_eq!(c.skip(7, SKIP_DEPTH), Err(Unread::Fails));
        // Whole, both read it alike.
        let whole = [field(1, 7), 1, 2, 3, 4, 5, 6, 7, 8, field(1, 8), 2, b'h', b'i', 0];
        for protocol in [Protocol::Read, Protocol::Slice] {
            assert_eq!(skip_struct(&whole, protocol), Ok(whole.len()));
        }
    }

    #[test]
    fn a_list_of_booleans_is_refused_under_either_protocol() {
        let mut list = vec![field(1, 9), 0xf1];
        list.extend(varint(i32::MAX as u64));
        list.push(0);
        for protocol in [Protocol::Read, Protocol::Slice] {
            let Err(Unread::Excess { steps, bytes }) = skip_struct(&list, protocol) else { panic!("skip") };
            assert!(steps > bytes + SLACK_STEPS && steps < 200, "{steps} steps for {bytes} bytes");
        }
    }

    #[test]
    fn a_binary_read_must_be_there_whole() {
        let mut c = Cursor::new(&[3, b'a', b'b'], Protocol::Read);
        assert_eq!(c.binary(), Err(Unread::Fails));
        let mut c = Cursor::new(&[2, b'a', b'b'], Protocol::Slice);
        assert_eq!((c.binary(), c.at()), (Ok(()), 3));
        assert_eq!(Cursor::new(&[0; 7], Protocol::Slice).double(), Err(Unread::Fails));
    }
}
