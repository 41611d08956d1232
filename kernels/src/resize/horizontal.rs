//! The horizontal pass with AVX-512 byte permutes: four output pixels to a 512-bit vector, a
//! 128-bit lane each, holding their red, green and blue sums (and one unused) as 32-bit lanes.

use super::Taps;
use std::arch::x86_64::{
    __m512i, _mm_cvtsi32_si128, _mm512_dpwssd_epi32, _mm512_load_si512, _mm512_loadu_si512,
    _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8, _mm512_packs_epi32, _mm512_packus_epi16,
    _mm512_permutexvar_epi8, _mm512_set1_epi32, _mm512_sra_epi32,
};

/// Output pixels of a vector.
const GROUP: usize = 4;
/// Vectors packed and stored together: sixteen output pixels, 48 bytes.
const BLOCK: usize = 4;
/// Source pixels one vector's four outputs may read: the whole pixels in 64 bytes.
pub(super) const REACH: usize = 21;
/// The byte of a loaded window that is always zero: a window loads at most `3 × REACH` = 63
/// bytes, and the masked load zeroes the rest. The permutes take the high bytes of the 16-bit
/// slots, and the slots of no pixel, from here.
const ZERO: u8 = 63;

/// After packing sixteen outputs to bytes, output pixel `p` is at byte `16·(p % 4) + 4·(p / 4)`
/// (lane `p % 4` of vector `p / 4`, red, green, blue and an unused byte): this gathers them into
/// 48 bytes of RGB.
const COMPACT: [u8; 64] = {
    let mut index = [0u8; 64];
    let mut o = 0;
    while o < 48 {
        let (p, c) = (o / 3, o % 3);
        index[o] = (16 * (p % 4) + 4 * (p / 4) + c) as u8;
        o += 1;
    }
    index
};

/// One 64-byte line of a table, aligned to a cache line, so that each of the kernel's 64-byte
/// loads from a table reads one line, not two.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line<T>(T);

/// The kernel's tables for one set of taps.
#[derive(Clone, Debug, Default)]
pub(super) struct Tables {
    /// Tap pairs of every vector (the most taps of any output, halved, rounded up).
    pairs: usize,
    /// Per vector: the byte offset of its first source pixel in a row, and the mask of the
    /// bytes to load from there. Padded to whole blocks with vectors of zero weights (which read
    /// the row's first pixel, and whose outputs are not stored).
    sources: Vec<(usize, u64)>,
    /// Output pixels.
    outputs: usize,
    /// Per vector and tap pair: the byte permute placing each output's two source pixels as
    /// 16-bit pairs (red, red, green, green, blue, blue, then two zero slots), 64 bytes.
    index: Vec<Line<[u8; 64]>>,
    /// Per vector and tap pair: each output's two weights, as the 16-bit pair of each of its
    /// three channels' 32-bit lanes (the fourth lane zero).
    weights: Vec<Line<[i32; 16]>>,
}

impl Tables {
    /// Builds the tables for `taps`; false (and the tables unusable) when four neighbouring
    /// outputs read more than [`REACH`] source pixels, or there are no taps.
    pub(super) fn prepare(&mut self, taps: &Taps) -> bool {
        let (outputs, pairs) = (taps.len(), taps.most().div_ceil(2));
        let vectors = outputs.div_ceil(GROUP).next_multiple_of(BLOCK);
        (self.pairs, self.outputs) = (pairs, outputs);
        self.sources.clear();
        self.index.clear();
        self.weights.clear();
        if pairs == 0 || taps.precision() == 0 {
            return false;
        }
        self.index.resize(vectors * pairs, Line([ZERO; 64]));
        self.weights.resize(vectors * pairs, Line([0; 16]));
        for v in 0..vectors {
            let members = v * GROUP..((v + 1) * GROUP).min(outputs);
            let reads = members.clone().map(|i| taps.of(i)).filter(|(_, w)| !w.is_empty());
            let base = reads.clone().map(|(start, _)| start).min().unwrap_or(0);
            let reach = reads.map(|(start, w)| start + w.len() - base).max().unwrap_or(1);
            if reach > REACH {
                return false;
            }
            self.sources.push((base * 3, u64::MAX >> (64 - 3 * reach)));
            for (j, i) in members.enumerate() {
                let (start, w) = taps.of(i);
                for (k, &weight) in w.iter().enumerate() {
                    let (pair, second) = (k / 2, k % 2);
                    let line = v * pairs + pair;
                    for c in 0..3 {
                        self.index[line].0[16 * j + 4 * c + 2 * second] = (3 * (start + k - base) + c) as u8;
                        self.weights[line].0[4 * j + c] |= i32::from(weight as u16) << (16 * second);
                    }
                }
            }
        }
        true
    }

    /// Resamples the first `rows` rows of `src` into `dst` (rows as [`super::Horizontal::run`]
    /// says).
    ///
    /// # Safety
    /// The CPU has what [`super::Kernels::Avx512`] needs, the tables were prepared
    /// (successfully) from `taps`, and `rows` whole rows fit in both `src` and `dst`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) unsafe fn run(&self, taps: &Taps, src: &[u8], dst: &mut [u8], rows: usize) {
        // Up to three pairs of taps (a shrink by up to 2×, after the DCT scaling has done the
        // rest), the loop over pairs is unrolled.
        match self.pairs {
            // SAFETY: as this function's.
            1 => unsafe { self.rows::<1>(taps, src, dst, rows) },
            2 => unsafe { self.rows::<2>(taps, src, dst, rows) },
            3 => unsafe { self.rows::<3>(taps, src, dst, rows) },
            _ => unsafe { self.rows::<0>(taps, src, dst, rows) },
        }
    }

    /// [`Tables::run`] with `PAIRS` tap pairs (0: `self.pairs`, looped).
    ///
    /// # Safety
    /// As [`Tables::run`]'s.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    unsafe fn rows<const PAIRS: usize>(&self, taps: &Taps, src: &[u8], dst: &mut [u8], rows: usize) {
        let (src_row, dst_row) = (taps.source_width() * 3, taps.len() * 3);
        // Rows from which every vector may load all of its 63 bytes without leaving `src` (the
        // bytes past its own outputs' pixels are of the next row, and no permute takes them):
        // one mask for every load, set once, where each vector's own mask takes an instruction
        // on the permutes' port. The last rows load with their own masks.
        let farthest = self.sources.iter().map(|&(offset, _)| offset).max().unwrap_or(0) + ZERO as usize;
        let whole = super::rows_within(src.len(), src_row, farthest, rows);
        for r in 0..rows {
            // SAFETY: row `r` is inside both (the contract); the first `whole` rows' loads of
            // 63 bytes stay inside `src` (just computed).
            unsafe {
                let (from, to) = (src.as_ptr().add(r * src_row), dst.as_mut_ptr().add(r * dst_row));
                if r < whole {
                    self.row::<PAIRS, true>(taps, from, to)
                } else {
                    self.row::<PAIRS, false>(taps, from, to)
                }
            }
        }
    }

    /// One row of [`Tables::rows`], from `from` to `to`: with `WHOLE`, every vector loads 63
    /// bytes; otherwise only those its outputs read.
    ///
    /// # Safety
    /// As [`Tables::run`]'s, for the row at `from` and `to`; with `WHOLE`, the 63 bytes from each
    /// vector's first source byte are inside the source.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    unsafe fn row<const PAIRS: usize, const WHOLE: bool>(&self, taps: &Taps, from: *const u8, to: *mut u8) {
        let pairs = if PAIRS == 0 { self.pairs } else { PAIRS };
        let half = _mm512_set1_epi32((1i32 << taps.precision()) >> 1);
        let shift = _mm_cvtsi32_si128(taps.precision() as i32);
        // SAFETY (loads and stores below): the tables hold `pairs` entries of 64 bytes for each
        // of `sources`; each source load is masked to the bytes the vector's outputs read, which
        // `prepare` found inside the row (or with `WHOLE` to 63 bytes the caller found inside the
        // source); each store is masked to the outputs the row holds.
        let compact = unsafe { _mm512_loadu_si512(COMPACT.as_ptr().cast()) };
        let (index, weights) = (self.index.as_ptr(), self.weights.as_ptr());
        let full_blocks = self.outputs / (GROUP * BLOCK);
        for (b, block) in self.sources.chunks_exact(BLOCK).enumerate() {
            let mut sums = [half; BLOCK];
            for (k, (sum, &(offset, load))) in sums.iter_mut().zip(block).enumerate() {
                let load = if WHOLE { u64::MAX >> 1 } else { load };
                let pixels = unsafe { _mm512_maskz_loadu_epi8(load, from.add(offset).cast()) };
                let first = (b * BLOCK + k) * pairs;
                for pair in first..first + pairs {
                    let index = unsafe { _mm512_load_si512(index.add(pair).cast()) };
                    let weights = unsafe { _mm512_load_si512(weights.add(pair).cast()) };
                    let values = _mm512_permutexvar_epi8(index, pixels);
                    *sum = _mm512_dpwssd_epi32(*sum, values, weights);
                }
            }
            let [a, b4, c, d]: [__m512i; BLOCK] = sums.map(|s| _mm512_sra_epi32(s, shift));
            let bytes = _mm512_packus_epi16(_mm512_packs_epi32(a, b4), _mm512_packs_epi32(c, d));
            let keep = if b < full_blocks {
                u64::MAX >> 16
            } else {
                u64::MAX >> (64 - 3 * (self.outputs - b * GROUP * BLOCK))
            };
            unsafe {
                _mm512_mask_storeu_epi8(
                    to.add(b * GROUP * BLOCK * 3).cast(),
                    keep,
                    _mm512_permutexvar_epi8(compact, bytes),
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compaction_takes_each_pixel_from_its_lane_and_vector() {
        for p in 0..16 {
            for c in 0..3 {
                assert_eq!(usize::from(COMPACT[3 * p + c]), (p % 4) * 16 + (p / 4) * 4 + c);
            }
        }
    }
}
