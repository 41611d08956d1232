//! The vertical pass with AVX2, for CPUs without AVX-512's byte permutes: two source rows at a
//! time (a pair of taps), 32 bytes of each. Interleaving the two rows' bytes and then each byte
//! with a zero makes each output byte's 16-bit pair, the top row's beside the bottom row's; one
//! multiply-add of 16-bit pairs (`vpmaddwd`) weighs both. The sums come out in the output's
//! order after packing, lane by lane.

use super::Taps;
use std::arch::x86_64::{
    __m256i, _mm_cvtsi32_si128, _mm256_add_epi32, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_packs_epi32,
    _mm256_packus_epi16, _mm256_set1_epi32, _mm256_setzero_si256, _mm256_sra_epi32, _mm256_storeu_si256,
    _mm256_unpackhi_epi8, _mm256_unpacklo_epi8,
};

/// Bytes of a step: the pass needs rows at least this long.
const STEP: usize = super::AVX2_ROWS;

/// Resamples the rows of `src` into `dst`, as [`super::Vertical::run`] says. A row's last step
/// overlaps the one before it when `len` is not a multiple of [`STEP`]: it writes the same bytes
/// again.
///
/// # Safety
/// The CPU has AVX2; `len ≥ STEP`; for every output row `y` and each of its taps `t`, the `len`
/// bytes from `(start_y + t) × stride` are inside `src`; `dst` holds `taps.len()` rows of `len`
/// bytes; `pairs` holds each row's weights in pairs, `taps.most()` halved and rounded up to a
/// row.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn run(taps: &Taps, pairs: &[i32], src: &[u8], stride: usize, len: usize, dst: &mut [u8]) {
    let half = _mm256_set1_epi32((1i32 << taps.precision()) >> 1);
    let shift = _mm_cvtsi32_si128(taps.precision() as i32);
    let zero = _mm256_setzero_si256();
    let per_row = taps.most().div_ceil(2);
    for y in 0..taps.len() {
        let (start, weights) = taps.of(y);
        let row_pairs = &pairs[y * per_row..][..weights.len().div_ceil(2)];
        let mut x = 0;
        loop {
            let at = x.min(len - STEP);
            let mut sums = [half; 4];
            for (t, &pair) in row_pairs.iter().enumerate() {
                let w = _mm256_set1_epi32(pair);
                // SAFETY: the rows `start + 2t` and (when weighted) `start + 2t + 1` are inside
                // `src`, `at + STEP ≤ len` (the contract). A lone last tap pairs with its own
                // row, weighted zero.
                let (a, b) = unsafe {
                    let top = src.as_ptr().add((start + 2 * t) * stride + at);
                    let bottom = if 2 * t + 1 < weights.len() { top.add(stride) } else { top };
                    (_mm256_loadu_si256(top.cast()), _mm256_loadu_si256(bottom.cast()))
                };
                // Per 128-bit lane: bytes 0–7 of both rows interleaved, then 8–15; each of
                // those widened with zeros gives four (top, bottom) pairs a vector.
                let (low, high) = (_mm256_unpacklo_epi8(a, b), _mm256_unpackhi_epi8(a, b));
                let widened = [
                    _mm256_unpacklo_epi8(low, zero),
                    _mm256_unpackhi_epi8(low, zero),
                    _mm256_unpacklo_epi8(high, zero),
                    _mm256_unpackhi_epi8(high, zero),
                ];
                for (sum, pairs) in sums.iter_mut().zip(widened) {
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, w));
                }
            }
            let [s0, s1, s2, s3]: [__m256i; 4] = sums.map(|s| _mm256_sra_epi32(s, shift));
            // Lane by lane: s0 and s1 hold bytes 0–7 (16–23), s2 and s3 bytes 8–15 (24–31).
            let bytes = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
            // SAFETY: row `y` of `dst` holds `len ≥ at + STEP` bytes.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(y * len + at).cast(), bytes) };
            if at + STEP >= len {
                break;
            }
            x += STEP;
        }
    }
}
