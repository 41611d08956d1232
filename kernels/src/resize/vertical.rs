//! The vertical pass with AVX-512: two source rows at a time (a pair of taps), 64 bytes of
//! each. One byte permute from the two rows (VBMI's `vpermt2b`) makes each output byte's 16-bit
//! pair, the top row's byte beside the bottom row's, zero-extended; one fused multiply-add
//! (VNNI's `vpdpwssd`) adds both taps' products into its 32-bit sum. Four permutes and four
//! multiply-adds cover 64 output bytes.

use super::Taps;
use std::arch::x86_64::{
    __m128i, __m512i, _mm_cvtsi32_si128, _mm512_dpwssd_epi32, _mm512_loadu_si512, _mm512_mask_storeu_epi8,
    _mm512_maskz_loadu_epi8, _mm512_maskz_permutex2var_epi8, _mm512_packs_epi32, _mm512_packus_epi16,
    _mm512_permutexvar_epi32, _mm512_set1_epi32, _mm512_sra_epi32, _mm512_storeu_si512,
};

/// The permuted bytes that hold pixel values: bytes 0 and 2 of each 32-bit lane (the low bytes
/// of its two 16-bit slots); the rest are zeros.
const VALUES: u64 = 0x5555_5555_5555_5555;

/// `PAIRS[k]`: the permute for output bytes `16k .. 16k + 16`. Lane `i` takes byte `16k + i` of
/// the top row (index `16k + i` of the two rows' 128 bytes) and of the bottom row (`64 + 16k +
/// i`), zero-extended to a 16-bit pair.
const PAIRS: [[u8; 64]; 4] = {
    let mut index = [[0u8; 64]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 16 {
            index[k][4 * i] = (16 * k + i) as u8;
            index[k][4 * i + 2] = (64 + 16 * k + i) as u8;
            i += 1;
        }
        k += 1;
    }
    index
};

/// After packing four vectors of sixteen 32-bit sums to bytes, the four bytes at dword `4L + k`
/// are bytes `16k + 4L ..` of the output (lane `L` of vector `k`): this puts each dword back.
const ORDER: [u32; 16] = {
    let mut index = [0u32; 16];
    let mut o = 0;
    while o < 16 {
        let (k, lane) = (o / 4, o % 4);
        index[o] = (4 * lane + k) as u32;
        o += 1;
    }
    index
};

/// Resamples the rows of `src` into `dst`, as [`super::Vertical::run`] says.
///
/// # Safety
/// The CPU has what [`super::Kernels::Avx512`] needs; for every output row `y` and each of
/// its taps `t`, the `len` bytes from `(start_y + t) × stride` are inside `src`; `dst` holds
/// `taps.len()` rows of `len` bytes; `pairs` holds each row's weights in pairs, `taps.most()`
/// halved and rounded up to a row.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
pub(super) unsafe fn run(taps: &Taps, pairs: &[i32], src: &[u8], stride: usize, len: usize, dst: &mut [u8]) {
    let half = _mm512_set1_epi32((1i32 << taps.precision()) >> 1);
    let shift = _mm_cvtsi32_si128(taps.precision() as i32);
    // SAFETY: the tables hold 64 bytes each.
    let permutes: [__m512i; 4] = PAIRS.map(|p| unsafe { _mm512_loadu_si512(p.as_ptr().cast()) });
    let per_row = taps.most().div_ceil(2);
    let order = unsafe { _mm512_loadu_si512(ORDER.as_ptr().cast()) };
    let tail = len % 64;
    let tail_mask = u64::MAX >> (64 - tail.max(1));
    for y in 0..taps.len() {
        let (start, weights) = taps.of(y);
        let row_pairs = &pairs[y * per_row..][..weights.len().div_ceil(2)];
        // SAFETY: the rows `start + 2t` and (when weighted) `start + 2t + 1` are inside `src`,
        // and row `y` of `dst` inside `dst` (the contract). A lone last tap pairs with its own
        // row, weighted zero.
        let rows = row_pairs.iter().enumerate().map(|(t, &pair)| unsafe {
            let top = src.as_ptr().add((start + 2 * t) * stride);
            (top, if 2 * t + 1 < weights.len() { top.add(stride) } else { top }, pair)
        });
        let out = unsafe { dst.as_mut_ptr().add(y * len) };
        // Whole 64-byte steps with plain loads and stores (no mask to set on the permutes'
        // port), then the rest masked to the row.
        let mut x = 0;
        while x + 64 <= len {
            // SAFETY: 64 bytes from `x` are inside each row and the output row.
            unsafe {
                let sums = step::<false>(rows.clone(), x, u64::MAX, half, &permutes);
                _mm512_storeu_si512(out.add(x).cast(), pack(sums, shift, order));
            }
            x += 64;
        }
        if tail > 0 {
            // SAFETY: the loads and the store are masked to the `tail` bytes left of the rows.
            unsafe {
                let sums = step::<true>(rows, x, tail_mask, half, &permutes);
                _mm512_mask_storeu_epi8(out.add(x).cast(), tail_mask, pack(sums, shift, order));
            }
        }
    }
}

/// The four vectors of sixteen 32-bit sums of one step of 64 output bytes from byte `x`: for
/// each pair of rows (and its weights), the 64 bytes from `x` of each, or with `MASKED` the
/// bytes of `mask`.
///
/// # Safety
/// As [`run`]'s, and the bytes loaded are inside the rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
unsafe fn step<const MASKED: bool>(
    rows: impl Iterator<Item = (*const u8, *const u8, i32)>,
    x: usize,
    mask: u64,
    half: __m512i,
    permutes: &[__m512i; 4],
) -> [__m512i; 4] {
    let mut sums = [half; 4];
    for (top, bottom, pair) in rows {
        let w = _mm512_set1_epi32(pair);
        // SAFETY: the caller's.
        let (a, b) = unsafe {
            let (top, bottom) = (top.add(x).cast(), bottom.add(x).cast());
            if MASKED {
                (_mm512_maskz_loadu_epi8(mask, top), _mm512_maskz_loadu_epi8(mask, bottom))
            } else {
                (_mm512_loadu_si512(top.cast()), _mm512_loadu_si512(bottom.cast()))
            }
        };
        for (sum, &index) in sums.iter_mut().zip(permutes) {
            *sum = _mm512_dpwssd_epi32(*sum, _mm512_maskz_permutex2var_epi8(VALUES, a, index, b), w);
        }
    }
    sums
}

/// The step's sums, shifted, saturated to bytes and back in the output's order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pack(sums: [__m512i; 4], shift: __m128i, order: __m512i) -> __m512i {
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| _mm512_sra_epi32(sums[i], shift));
    _mm512_permutexvar_epi32(order, _mm512_packus_epi16(_mm512_packs_epi32(a, b), _mm512_packs_epi32(c, d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_puts_each_dword_back() {
        for k in 0..4 {
            for lane in 0..4 {
                // Output bytes 16k + 4·lane.. are packed at dword 4·lane + k.
                assert_eq!(ORDER[(16 * k + 4 * lane) / 4] as usize, 4 * lane + k);
            }
        }
    }

    #[test]
    fn each_pair_takes_the_same_byte_of_both_rows() {
        for (k, index) in PAIRS.iter().enumerate() {
            for i in 0..16 {
                assert_eq!((index[4 * i], index[4 * i + 2]), ((16 * k + i) as u8, (64 + 16 * k + i) as u8));
            }
        }
    }
}
