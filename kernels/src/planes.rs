//! RGB rows (`[h, w, 3]` `uint8`) split into three planes (`[3, h, w]`), optionally mirrored left
//! to right: the `uint8` CHW layout.
//!
//! Pixel by pixel, each plane reads every third byte, which does not vectorize: a compiler
//! gathers the bytes one at a time. Where the CPU has SSSE3, sixteen pixels (48 bytes, three
//! 128-bit vectors) go at once: each plane's sixteen bytes are taken from the three vectors by
//! one `pshufb` each, or-ed together, and a mirrored row takes its blocks from the row's other
//! end with the shuffles reversed. The pixels past the last whole block of a row go one by one.
//! Both forms give the same bytes.

use std::mem::MaybeUninit;

/// Appends the whole rows of `src` (rows of `width` RGB pixels) to `out` as three planes, red,
/// green and blue, each row mirrored when `flip` is set; bytes past the last whole row are left
/// out. Writes each output byte once (no zero-fill first).
pub fn planes_into(src: &[u8], width: usize, flip: bool, out: &mut Vec<u8>) {
    let row = width * 3;
    if row == 0 {
        return;
    }
    let src = &src[..src.len() / row * row];
    out.reserve(src.len());
    let start = out.len();
    #[cfg(target_arch = "x86_64")]
    let blocks = crate::byte_shuffles();
    #[cfg(not(target_arch = "x86_64"))]
    let blocks = false;
    split(src, width, flip, blocks, &mut out.spare_capacity_mut()[..src.len()]);
    // SAFETY: `split` wrote every one of the `src.len()` bytes after `start`, within the
    // capacity reserved above.
    unsafe { out.set_len(start + src.len()) };
}

/// [`planes_into`] into `out` (exactly `src.len()` bytes; `src` is whole rows of `width > 0`
/// pixels): sixteen pixels at a time with `blocks` (which only a CPU with SSSE3 may ask for),
/// the rest of each row pixel by pixel.
fn split(src: &[u8], width: usize, flip: bool, blocks: bool, out: &mut [MaybeUninit<u8>]) {
    let n = src.len() / 3;
    let (red, rest) = out.split_at_mut(n);
    let (green, blue) = rest.split_at_mut(n);
    let rows = src.chunks_exact(width * 3).zip(red.chunks_exact_mut(width));
    for ((row, r), (g, b)) in rows.zip(green.chunks_exact_mut(width).zip(blue.chunks_exact_mut(width))) {
        let mut planes = [r, g, b];
        // SAFETY: the caller asks for blocks only where the CPU has SSSE3.
        #[cfg(target_arch = "x86_64")]
        let done = if blocks { unsafe { simd::blocks(row, width, flip, &mut planes) } } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let done = {
            let _ = blocks;
            0
        };
        let (pixels, _) = row.as_chunks::<3>();
        for x in done..width {
            let p = pixels[if flip { width - 1 - x } else { x }];
            for (plane, value) in planes.iter_mut().zip(p) {
                plane[x].write(value);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    /// Pixels a block splits at once.
    pub(super) const PIXELS: usize = 16;
    /// Bytes of a block.
    pub(super) const BLOCK: usize = PIXELS * 3;

    /// Source byte, within a block, of byte `p` of plane `c`: pixel `p`, or pixel `15 − p` when
    /// mirrored.
    pub(super) const fn source(c: usize, p: usize, mirrored: bool) -> usize {
        let pixel = if mirrored { PIXELS - 1 - p } else { p };
        3 * pixel + c
    }

    /// `SHUFFLES[m][c][r]`: for plane `c` (mirrored when `m` is 1), the lane of input vector `r`
    /// each byte comes from, `0x80` (a zero byte, or-ed away) where it comes from another vector.
    pub(super) const SHUFFLES: [[[[u8; 16]; 3]; 3]; 2] = {
        let mut masks = [[[[0x80u8; 16]; 3]; 3]; 2];
        let mut m = 0;
        while m < 2 {
            let mut c = 0;
            while c < 3 {
                let mut p = 0;
                while p < PIXELS {
                    let s = source(c, p, m == 1);
                    masks[m][c][s / 16][p] = (s % 16) as u8;
                    p += 1;
                }
                c += 1;
            }
            m += 1;
        }
        masks
    };

    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128};
    use std::mem::MaybeUninit;

    /// Writes the whole blocks of sixteen pixels of `row` (`width` pixels) to the start of its
    /// three plane rows, mirrored when `flip` is set; returns the pixels written, the rest of
    /// the row being the caller's.
    #[target_feature(enable = "ssse3")]
    pub(super) fn blocks(
        row: &[u8],
        width: usize,
        flip: bool,
        planes: &mut [&mut [MaybeUninit<u8>]; 3],
    ) -> usize {
        // SAFETY: 16-byte arrays read as vectors; unaligned loads are allowed.
        let masks: [[__m128i; 3]; 3] = std::array::from_fn(|c| {
            std::array::from_fn(|r| unsafe {
                _mm_loadu_si128(SHUFFLES[usize::from(flip)][c][r].as_ptr().cast())
            })
        });
        let whole = width - width % PIXELS;
        for x in (0..whole).step_by(PIXELS) {
            // The block's first source pixel: from the row's other end when mirrored.
            let s = if flip { width - PIXELS - x } else { x };
            // Slices of the block's exact length (in bounds: s + 16 <= width), so that the
            // vectors below stay inside them; an index out of bounds would panic, never leave
            // bytes unwritten.
            let block = &row[3 * s..3 * s + BLOCK];
            // SAFETY: each load reads 16 bytes within the 48 of `block`.
            let v: [__m128i; 3] =
                std::array::from_fn(|i| unsafe { _mm_loadu_si128(block.as_ptr().add(16 * i).cast()) });
            for (plane, mask) in planes.iter_mut().zip(&masks) {
                let bytes = _mm_or_si128(
                    _mm_or_si128(_mm_shuffle_epi8(v[0], mask[0]), _mm_shuffle_epi8(v[1], mask[1])),
                    _mm_shuffle_epi8(v[2], mask[2]),
                );
                let dst = &mut plane[x..x + PIXELS];
                // SAFETY: the store writes the 16 bytes of `dst`; unaligned stores are allowed,
                // and `MaybeUninit<u8>` has the layout of `u8`.
                unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), bytes) };
            }
        }
        whole
    }
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixel by pixel, appended: the definition.
    fn reference(src: &[u8], width: usize, flip: bool) -> Vec<u8> {
        let rows = src.len() / (width * 3);
        let mut out = Vec::new();
        for c in 0..3 {
            for y in 0..rows {
                for x in 0..width {
                    let sx = if flip { width - 1 - x } else { x };
                    out.push(src[(y * width + sx) * 3 + c]);
                }
            }
        }
        out
    }

    fn image(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn shuffles_send_each_byte_of_a_block_to_its_plane() {
        use super::simd::{BLOCK, PIXELS, SHUFFLES, source};
        let block: Vec<u8> = (0..BLOCK as u8).collect();
        for (m, flip) in [false, true].into_iter().enumerate() {
            let planes = reference(&block, PIXELS, flip);
            for c in 0..3 {
                for p in 0..PIXELS {
                    let s = usize::from(planes[c * PIXELS + p]);
                    assert_eq!(s, source(c, p, flip), "plane {c}, byte {p}, flip {flip}");
                    // Exactly one source vector has the byte.
                    let from: Vec<usize> = (0..3).filter(|&r| SHUFFLES[m][c][r][p] != 0x80).collect();
                    assert_eq!(from, vec![s / 16]);
                    assert_eq!(usize::from(SHUFFLES[m][c][s / 16][p]), s % 16);
                }
            }
        }
    }

    #[test]
    fn planes_match_the_definition_for_any_width() {
        for width in [1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 64, 100, 224, 225] {
            for rows in [0, 1, 3] {
                // Whole rows, and a partial row after them (left out).
                for extra in [0, 2] {
                    let src = image(width * 3 * rows + extra);
                    for flip in [false, true] {
                        let mut out = vec![7];
                        planes_into(&src, width, flip, &mut out);
                        assert_eq!(out[0], 7, "appends after what is there");
                        assert_eq!(
                            out[1..],
                            reference(&src, width, flip)[..],
                            "width {width}, rows {rows}, extra {extra}, flip {flip}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_pixel_by_pixel_form_gives_the_same_bytes() {
        for width in [1, 16, 33, 224] {
            let src = image(width * 3 * 2);
            for flip in [false, true] {
                let mut out = vec![MaybeUninit::new(0); src.len()];
                split(&src, width, flip, false, &mut out);
                // SAFETY: every byte was initialized above.
                let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
                assert_eq!(got, reference(&src, width, flip), "width {width}, flip {flip}");
            }
        }
    }

    #[test]
    fn zero_width_appends_nothing() {
        let mut out = vec![1, 2];
        planes_into(&[5, 6, 7], 0, true, &mut out);
        assert_eq!(out, [1, 2]);
    }
}
