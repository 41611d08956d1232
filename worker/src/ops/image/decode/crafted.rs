//! Hand-made image files that the encoders will not write: headers that claim huge sizes, and a
//! bitstream that makes a decoder panic. For the decode tests.

use super::PNG_MAGIC;

/// CRC-32 (IEEE) of a PNG chunk's type and data, bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A PNG of 40 bytes whose `IHDR` claims `width × height` RGB pixels, with no image data.
pub(super) fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut chunk = b"IHDR".to_vec();
    chunk.extend(width.to_be_bytes());
    chunk.extend(height.to_be_bytes());
    chunk.extend([8, 2, 0, 0, 0]); // 8-bit RGB, deflate, adaptive filter, not interlaced
    let mut out = PNG_MAGIC.to_vec();
    out.extend(13u32.to_be_bytes());
    out.extend(&chunk);
    out.extend(crc32(&chunk).to_be_bytes());
    out
}

/// A WebP of 44 bytes: an extended (`VP8X`) header whose canvas is `width × height`, and a
/// lossless bitstream header of 1×1.
pub(super) fn webp_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut vp8x = vec![0u8; 4];
    vp8x.extend(&(width - 1).to_le_bytes()[..3]);
    vp8x.extend(&(height - 1).to_le_bytes()[..3]);
    let vp8l = [0x2f, 0, 0, 0, 0, 0]; // signature, 1×1, version 0; padded to even
    let mut body = b"WEBP".to_vec();
    body.extend(b"VP8X");
    body.extend(10u32.to_le_bytes());
    body.extend(vp8x);
    body.extend(b"VP8L");
    body.extend(5u32.to_le_bytes());
    body.extend(vp8l);
    let mut out = b"RIFF".to_vec();
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(body);
    out
}

/// Bits in the order a lossless WebP (VP8L) bitstream is read: least significant first.
#[derive(Default)]
struct Bits {
    bytes: Vec<u8>,
    len: usize,
}

impl Bits {
    /// The `n` low bits of `value`, lowest first.
    fn put(&mut self, value: u32, n: u32) {
        for i in 0..n {
            if self.len.is_multiple_of(8) {
                self.bytes.push(0);
            }
            let last = self.bytes.len() - 1;
            self.bytes[last] |= (((value >> i) & 1) as u8) << (self.len % 8);
            self.len += 1;
        }
    }

    /// A prefix code word of `n` bits: its first bit is the most significant.
    fn code(&mut self, word: u32, n: u32) {
        for i in (0..n).rev() {
            self.put(word >> i, 1);
        }
    }
}

/// A 1×1 lossless WebP whose green prefix code is over-subscribed: lengths 1, 1, 1, 2, …, 14,
/// 15, 15 (Kraft sum above 1). image-webp 0.2.4 overflows a `u16` building it (a panic with
/// overflow checks) and, without them, passes its own completeness check and indexes past
/// its table (a panic in release builds).
pub(super) fn webp_with_an_oversubscribed_code() -> Vec<u8> {
    let mut bits = Bits::default();
    bits.put(0x2f, 8); // signature
    bits.put(0, 28); // width − 1 and height − 1: 1×1
    bits.put(0, 4); // no alpha, version 0
    bits.put(0, 3); // no transform, no colour cache, no meta prefix codes
    bits.put(0, 1); // the green code is a normal (not simple) code
    bits.put(15, 4); // 4 + 15 code-length code lengths, in the format's order:
    for symbol in [17, 18, 0, 1, 2, 3, 4, 5, 16, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        bits.put(if symbol < 16 { 4 } else { 0 }, 3); // literal lengths 0..15: 4 bits each
    }
    bits.put(1, 1); // a symbol count follows:
    bits.put(2, 3); // in 2 + 2·2 bits,
    bits.put(16, 6); // 2 + 16 symbols
    for length in [1, 1, 1].into_iter().chain(2..=14).chain([15, 15]) {
        bits.code(length, 4); // canonical code: literal length n is the word n
    }
    bits.bytes.resize(bits.bytes.len() + 16, 0);
    if !bits.bytes.len().is_multiple_of(2) {
        bits.bytes.push(0);
    }
    let mut body = b"WEBPVP8L".to_vec();
    body.extend((bits.bytes.len() as u32).to_le_bytes());
    body.extend(&bits.bytes);
    let mut file = b"RIFF".to_vec();
    file.extend((body.len() as u32).to_le_bytes());
    file.extend(body);
    file
}
