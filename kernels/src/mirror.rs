//! RGB rows (`[h, w, 3]` `uint8`) mirrored left to right in place.
//!
//! A pixel is three bytes, so a mirror is not a byte reversal: reversing a slice of `[u8; 3]`
//! swaps one pixel at a time, several times what a copy of the image costs. Where the CPU has
//! SSSE3, sixteen pixels (48 bytes, three 128-bit vectors) are reversed at once by byte
//! shuffles: each output vector takes its bytes from up to three input vectors, one `pshufb`
//! each, or-ed together; blocks from the two ends of a row swap places, and the middle, under
//! two blocks, goes pixel by pixel. Other CPUs go pixel by pixel throughout. Both give the same
//! bytes.

/// Mirrors each row of `data` (rows of `width` RGB pixels) left to right in place; bytes past
/// the last whole row are left as they are.
pub fn mirror_in_place(data: &mut [u8], width: usize) {
    let row = width * 3;
    if row == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::byte_shuffles() {
        // SAFETY: the CPU has SSSE3 (checked just now).
        return unsafe { simd::in_place(data, width) };
    }
    in_place_any(data, width);
}

/// [`mirror_in_place`] pixel by pixel.
fn in_place_any(data: &mut [u8], width: usize) {
    for row in data.chunks_exact_mut(width * 3) {
        row.as_chunks_mut::<3>().0.reverse();
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    /// Pixels a block reverses at once.
    pub(super) const PIXELS: usize = 16;
    /// Bytes of a block.
    pub(super) const BLOCK: usize = PIXELS * 3;

    /// Source byte of output byte `o` in a reversed block: pixel `o / 3` comes from pixel
    /// `15 − o / 3`, channel kept.
    pub(super) const fn source(o: usize) -> usize {
        3 * (PIXELS - 1 - o / 3) + o % 3
    }

    /// `SHUFFLES[k][r]`: for output vector `k`, the lane of input vector `r` each byte comes from,
    /// `0x80` (a zero byte, or-ed away) where it comes from another vector.
    pub(super) const SHUFFLES: [[[u8; 16]; 3]; 3] = {
        let mut masks = [[[0x80u8; 16]; 3]; 3];
        let mut o = 0;
        while o < BLOCK {
            let s = source(o);
            masks[o / 16][s / 16][o % 16] = (s % 16) as u8;
            o += 1;
        }
        masks
    };

    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_or_si128, _mm_shuffle_epi8, _mm_storeu_si128};

    /// The 48 bytes of `block` as three vectors.
    #[inline(always)]
    fn load(block: &[u8; BLOCK]) -> [__m128i; 3] {
        // SAFETY: each load reads 16 bytes within the 48 of `block`; unaligned loads are allowed.
        std::array::from_fn(|i| unsafe { _mm_loadu_si128(block.as_ptr().add(16 * i).cast()) })
    }

    /// Stores three vectors over the 48 bytes of `out`.
    #[inline(always)]
    fn store(v: [__m128i; 3], out: &mut [u8; BLOCK]) {
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: each store writes 16 bytes within the 48 of `out`; unaligned stores are
            // allowed.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().add(16 * i).cast(), v) };
        }
    }

    /// The sixteen pixels of `v` in reverse order.
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn reverse(v: [__m128i; 3]) -> [__m128i; 3] {
        std::array::from_fn(|k| {
            // SAFETY: a 16-byte array read as one vector (an unaligned load of its bytes).
            let mask = |r: usize| unsafe { _mm_loadu_si128(SHUFFLES[k][r].as_ptr().cast()) };
            let a = _mm_shuffle_epi8(v[0], mask(0));
            let b = _mm_shuffle_epi8(v[1], mask(1));
            let c = _mm_shuffle_epi8(v[2], mask(2));
            _mm_or_si128(_mm_or_si128(a, b), c)
        })
    }

    /// [`super::mirror_in_place`] with the block shuffles.
    #[target_feature(enable = "ssse3")]
    pub(super) fn in_place(data: &mut [u8], width: usize) {
        let row = width * 3;
        for r in data.chunks_exact_mut(row) {
            // Swap reversed blocks from the two ends inwards; the middle, under two blocks, is
            // reversed pixel by pixel.
            let (mut left, mut right) = (0, row);
            while right - left >= 2 * BLOCK {
                let (front, back) = r.split_at_mut(right - BLOCK);
                let (Some(a), Some(b)) =
                    (front[left..].first_chunk_mut::<BLOCK>(), back.first_chunk_mut::<BLOCK>())
                else {
                    break;
                };
                let (va, vb) = (reverse(load(a)), reverse(load(b)));
                store(vb, a);
                store(va, b);
                left += BLOCK;
                right -= BLOCK;
            }
            r[left..right].as_chunks_mut::<3>().0.reverse();
        }
    }
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixel by pixel: the definition.
    fn reference(src: &[u8], width: usize) -> Vec<u8> {
        let row = width * 3;
        let mut out = src.to_vec();
        if row > 0 {
            for r in out.chunks_exact_mut(row) {
                r.as_chunks_mut::<3>().0.reverse();
            }
        }
        out
    }

    fn image(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn shuffles_send_each_byte_of_a_block_to_its_mirror() {
        use super::simd::{BLOCK, PIXELS, SHUFFLES, source};
        let block: Vec<u8> = (0..BLOCK as u8).collect();
        assert_eq!(reference(&block, PIXELS), (0..BLOCK).map(|o| source(o) as u8).collect::<Vec<_>>());
        // Every output byte has exactly one source vector.
        for o in 0..BLOCK {
            let from: Vec<usize> = (0..3).filter(|&r| SHUFFLES[o / 16][r][o % 16] != 0x80).collect();
            assert_eq!(from, vec![source(o) / 16], "byte {o}");
        }
    }

    #[test]
    fn in_place_matches_the_definition_for_any_width() {
        for width in [0, 1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 64, 100, 224, 225] {
            for rows in [0, 1, 3] {
                // Whole rows, and a partial row after them (left as it is).
                for extra in [0, 2] {
                    let src = image(width * 3 * rows + extra);
                    let mut mirrored = src.clone();
                    mirror_in_place(&mut mirrored, width);
                    assert_eq!(mirrored, reference(&src, width), "width {width}, rows {rows}, extra {extra}");
                }
            }
        }
    }

    #[test]
    fn the_pixel_by_pixel_form_gives_the_same_bytes() {
        for width in [1, 16, 33, 224] {
            let src = image(width * 3 * 2);
            let mut mirrored = src.clone();
            in_place_any(&mut mirrored, width);
            assert_eq!(mirrored, reference(&src, width), "width {width}");
        }
    }

    #[test]
    fn mirroring_twice_gives_the_image_back() {
        let src = image(224 * 224 * 3);
        let mut twice = src.clone();
        mirror_in_place(&mut twice, 224);
        assert_ne!(twice, src);
        mirror_in_place(&mut twice, 224);
        assert_eq!(twice, src);
    }
}
