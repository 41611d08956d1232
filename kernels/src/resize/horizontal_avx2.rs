//! The horizontal pass with AVX2, for CPUs without AVX-512's byte permutes: two output pixels to
//! a 256-bit vector, a 128-bit lane each. Each lane loads the 16 bytes from its own output's
//! first source pixel, so one byte shuffle per pair of taps, the same for every output, places
//! each channel's two pixels side by side as a 16-bit pair, and one multiply-add of 16-bit pairs
//! (`vpmaddwd`) weighs them. Eight outputs are packed and stored together.

use super::Taps;
use std::arch::x86_64::{
    __m128i, __m256i, _mm_cvtsi32_si128, _mm_loadu_si128, _mm_storel_epi64, _mm_storeu_si128,
    _mm256_add_epi32, _mm256_broadcastsi128_si256, _mm256_castsi256_si128, _mm256_extracti128_si256,
    _mm256_load_si256, _mm256_loadu2_m128i, _mm256_madd_epi16, _mm256_packs_epi32, _mm256_packus_epi16,
    _mm256_permutevar8x32_epi32, _mm256_set1_epi32, _mm256_setr_epi32, _mm256_shuffle_epi8, _mm256_sra_epi32,
    _mm256_storeu_si256,
};

/// Source pixels one output may read: the whole pixels in the 16 bytes its lane loads.
pub(super) const REACH: usize = 5;
/// Outputs packed and stored together: four vectors of two.
const GROUP: usize = 8;
/// A shuffle index that writes a zero.
const NONE: u8 = 0x80;

/// `SHUFFLES[k]`: the byte shuffle for pair of taps `k` (pixels `2k` and `2k + 1` of the lane's
/// 16 bytes): each channel's 32-bit lane gets the two pixels' bytes as 16-bit values (red, red,
/// green, green, blue, blue, then a lane of zeros). Pixel 5 is not whole in 16 bytes: the last
/// pair's second pixel is always zero, and [`REACH`] keeps its weight zero too.
const SHUFFLES: [[u8; 16]; 3] = {
    let mut index = [[NONE; 16]; 3];
    let mut k = 0;
    while k < 3 {
        let mut c = 0;
        while c < 3 {
            index[k][4 * c] = (6 * k + c) as u8;
            if 6 * k + 5 < 16 {
                index[k][4 * c + 2] = (6 * k + 3 + c) as u8;
            }
            c += 1;
        }
        k += 1;
    }
    index
};

/// After packing a group to bytes, each lane holds four outputs as red, green, blue and an unused
/// byte: this keeps the twelve bytes of RGB at the lane's start.
const COMPACT: [u8; 16] = [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, NONE, NONE, NONE, NONE];

/// A table entry aligned to its 32 bytes, so that each load reads one cache line.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
struct Lanes([i32; 8]);

/// The kernel's tables for one set of taps.
#[derive(Clone, Debug, Default)]
pub(super) struct Tables {
    /// Tap pairs of every vector (the most taps of any output, halved, rounded up).
    pairs: usize,
    /// Output pixels.
    outputs: usize,
    /// Per vector: the byte offset in a row of each lane's first source pixel. Vector `j` of
    /// group `g` holds outputs `8g + j` (low lane) and `8g + 4 + j` (high lane); outputs past
    /// the last repeat it, and are not stored.
    sources: Vec<[usize; 2]>,
    /// Per vector and tap pair: each lane's two weights, as the 16-bit pair of its three
    /// channels' 32-bit lanes (the fourth zero).
    weights: Vec<Lanes>,
}

impl Tables {
    /// Builds the tables for `taps`; false (and the tables unusable) when an output reads more
    /// than [`REACH`] source pixels, or there are no taps.
    pub(super) fn prepare(&mut self, taps: &Taps) -> bool {
        let (outputs, most) = (taps.len(), taps.most());
        let pairs = most.div_ceil(2);
        (self.pairs, self.outputs) = (pairs, outputs);
        self.sources.clear();
        self.weights.clear();
        if pairs == 0 || most > REACH || taps.precision() == 0 {
            return false;
        }
        let vectors = outputs.div_ceil(GROUP) * GROUP / 2;
        self.weights.resize(vectors * pairs, Lanes::default());
        for v in 0..vectors {
            let (group, j) = (v / 4, v % 4);
            let lanes = [GROUP * group + j, GROUP * group + 4 + j].map(|o| o.min(outputs - 1));
            let mut offsets = [0; 2];
            for (lane, &o) in lanes.iter().enumerate() {
                let (start, w) = taps.of(o);
                // An output with no weights reads nothing: any offset in the row will do.
                offsets[lane] = if w.is_empty() { 0 } else { start * 3 };
                for (k, &weight) in w.iter().enumerate() {
                    let entry = &mut self.weights[v * pairs + k / 2].0;
                    for c in 0..3 {
                        entry[4 * lane + c] |= i32::from(weight as u16) << (16 * (k % 2));
                    }
                }
            }
            self.sources.push(offsets);
        }
        true
    }

    /// Resamples the first `rows` rows of `src` into `dst` (rows as [`super::Horizontal::run`]
    /// says).
    ///
    /// # Safety
    /// The CPU has AVX2, the tables were prepared (successfully) from `taps`, and `rows` whole
    /// rows fit in both `src` and `dst`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn run(&self, taps: &Taps, src: &[u8], dst: &mut [u8], rows: usize) {
        let (src_row, dst_row) = (taps.source_width() * 3, taps.len() * 3);
        // Each lane loads 16 bytes; past its output's pixels they are of the row after, and
        // weighted zero. Rows whose loads would leave `src` (the last one or two) are copied
        // first into a buffer with room to spare.
        let farthest = self.sources.iter().flatten().max().copied().unwrap_or(0) + 16;
        let whole = super::rows_within(src.len(), src_row, farthest, rows);
        let mut padded = Vec::new();
        for r in 0..rows {
            let row = &src[r * src_row..][..src_row];
            let from = if r < whole {
                row.as_ptr()
            } else {
                padded.clear();
                padded.extend_from_slice(row);
                padded.resize(farthest.max(src_row), 0);
                padded.as_ptr()
            };
            // SAFETY: the 16 bytes from every offset are inside `src` (whole rows) or `padded`;
            // row `r` of `dst` is inside it (the contract).
            unsafe { self.row(taps, from, &mut dst[r * dst_row..][..dst_row]) };
        }
    }

    /// One row of [`Tables::run`], from `from` into `to`.
    ///
    /// # Safety
    /// As [`Tables::run`]'s; the 16 bytes from `from` plus each of `sources` are readable.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn row(&self, taps: &Taps, from: *const u8, to: &mut [u8]) {
        let half = _mm256_set1_epi32((1i32 << taps.precision()) >> 1);
        let shift = _mm_cvtsi32_si128(taps.precision() as i32);
        let broadcast = |bytes: &[u8; 16]| {
            // SAFETY: 16 bytes.
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) })
        };
        let shuffles = SHUFFLES.map(|s| broadcast(&s));
        let compact = broadcast(&COMPACT);
        // Lane 0's twelve bytes, then lane 1's: the group's 24 bytes in order.
        let gather = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
        let pairs = self.pairs;
        for (g, group) in self.sources.chunks_exact(GROUP / 2).enumerate() {
            let mut sums = [half; GROUP / 2];
            for (j, (sum, &[low, high])) in sums.iter_mut().zip(group).enumerate() {
                // SAFETY: the caller's.
                let pixels = unsafe {
                    _mm256_loadu2_m128i(from.add(high).cast::<__m128i>(), from.add(low).cast::<__m128i>())
                };
                let first = (g * GROUP / 2 + j) * pairs;
                for (pair, shuffle) in shuffles.iter().enumerate().take(pairs) {
                    // SAFETY: `pairs` entries for each vector.
                    let weights =
                        unsafe { _mm256_load_si256(self.weights.as_ptr().add(first + pair).cast()) };
                    *sum = _mm256_add_epi32(
                        *sum,
                        _mm256_madd_epi16(_mm256_shuffle_epi8(pixels, *shuffle), weights),
                    );
                }
            }
            let [a, b, c, d]: [__m256i; GROUP / 2] = sums.map(|s| _mm256_sra_epi32(s, shift));
            let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
            let packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(bytes, compact), gather);
            let at = g * GROUP * 3;
            let outputs = (self.outputs - g * GROUP).min(GROUP);
            if outputs == GROUP {
                let out = &mut to[at..at + GROUP * 3];
                // SAFETY: 16 and then 8 bytes, inside the 24 of `out`.
                unsafe {
                    _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(packed));
                    _mm_storel_epi64(out.as_mut_ptr().add(16).cast(), _mm256_extracti128_si256(packed, 1));
                }
            } else {
                let mut last = [0u8; 32];
                // SAFETY: 32 bytes.
                unsafe { _mm256_storeu_si256(last.as_mut_ptr().cast(), packed) };
                to[at..at + outputs * 3].copy_from_slice(&last[..outputs * 3]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shuffle_takes_its_pairs_channels_and_no_partial_pixel() {
        for (k, index) in SHUFFLES.iter().enumerate() {
            for c in 0..3 {
                assert_eq!(usize::from(index[4 * c]), 3 * (2 * k) + c);
                let second = if k < 2 { (3 * (2 * k + 1) + c) as u8 } else { NONE };
                assert_eq!(index[4 * c + 2], second);
                assert_eq!((index[4 * c + 1], index[4 * c + 3]), (NONE, NONE));
            }
            assert_eq!(index[12..], [NONE; 4]);
        }
    }
}
