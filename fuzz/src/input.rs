//! Reading a fuzz input as a few framed fields.

/// A cursor over the fuzzer's bytes; reads past the end give zeros and empty slices, so every
/// input is some valid sequence of fields.
pub struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { rest: data }
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// The next byte (0 past the end).
    pub fn byte(&mut self) -> u8 {
        let (first, rest) = self.rest.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.rest = rest;
        first
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    /// The next `n` bytes, or fewer at the end.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.rest.split_at(n.min(self.rest.len()));
        self.rest = rest;
        taken
    }

    /// A field framed by a little-endian u16 length.
    pub fn framed(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.take(n)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }
}
