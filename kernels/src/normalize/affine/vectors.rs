//! The `float32` forms of an image in reading order (no flip), eight pixels a step with AVX2, in
//! `f64` (the two operations of [`Affine`], rounded once to `f32`):
//! - CHW: the 24 bytes of eight pixels are split into their three channels by byte shuffles, and
//!   each channel's eight values are stored with one 32-byte store per plane;
//! - HWC, streamed only (through the caches the compiler's vectors of the interleaved loop do as
//!   well): the 24 values of eight pixels take their channels' constants by position, three
//!   32-byte stores.
//!
//! With [`Stores::Streaming`] those stores go around the caches. A batch of ImageNet images is
//! 77 MB of `float32`, far past any cache: a store through the caches first reads the line it
//! writes, and then evicts what the decoder was using. On the 2-core VM this was measured on:
//! - filling a 77 MB buffer took 77 µs an image with plain 32-byte stores (7.8 GB/s), 31 µs with
//!   non-temporal ones (19 GB/s);
//! - the CHW kernel (the benchmark in `normalize/bench.rs`) writes an image in 60–66 µs through
//!   the caches and 54 µs streaming, against 75 µs for the auto-vectorized form it replaces;
//! - the same loop written in C with no arithmetic at all (the shuffled bytes widened and
//!   streamed) takes 56 µs, and with two `f32` fused multiply-adds in place of the `f64` round
//!   trip 59–60 µs: reading the `uint8` batch and streaming the values bound it, not the
//!   conversions. (An exact `f32` form on split constants exists for the ImageNet tables; it
//!   measured no faster here in Rust either, so it is left out.)

use super::{Affine, Sink};
use crate::normalize::Stores;
use std::arch::x86_64::*;

/// The shuffles that take channel `c` of eight pixels out of their first 16 bytes (`.0`) and
/// their last 8 (`.1`); a byte another vector supplies is zeroed (index with the high bit set).
fn channel_shuffles(c: usize) -> ([i8; 16], [i8; 16]) {
    let (mut first, mut last) = ([-1i8; 16], [-1i8; 16]);
    for k in 0..8 {
        let at = 3 * k + c;
        if at < 16 {
            first[k] = at as i8;
        } else {
            last[k] = (at - 16) as i8;
        }
    }
    (first, last)
}

impl Affine {
    /// Writes `pixels` to `out` as three planes (`out` holds exactly three values a pixel), in
    /// reading order. The caller checked that the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn chw_avx2<S: Sink>(&self, pixels: &[[u8; 3]], stores: Stores, out: &mut [S]) {
        let n = pixels.len();
        assert_eq!(out.len(), 3 * n, "the CHW form writes three values a pixel");
        let base = S::as_f32_ptr(out);
        // Single pixels first until the red plane is 32-byte aligned; streaming needs that for
        // all three planes, so only when they are a multiple of eight values apart.
        let stream = stores == Stores::Streaming && n.is_multiple_of(8);
        let head = if stream { base.align_offset(32).min(n) } else { 0 };
        let blocks = (n - head) / 8;
        // SAFETY: plane `c` is at `c·n..(c+1)·n` of the `3n` values.
        unsafe { self.singles(pixels, head, head + blocks * 8, base, |i, c| c * n + i) };
        let mut shuffles = [(_mm_setzero_si128(), _mm_setzero_si128()); 3];
        let mut constants = [(_mm256_setzero_pd(), _mm256_setzero_pd()); 3];
        for c in 0..3 {
            let (first, last) = channel_shuffles(c);
            // SAFETY: unaligned loads of 16 bytes from arrays of 16.
            shuffles[c] =
                unsafe { (_mm_loadu_si128(first.as_ptr().cast()), _mm_loadu_si128(last.as_ptr().cast())) };
            constants[c] = (_mm256_set1_pd(self.scale[c]), _mm256_set1_pd(self.offset[c]));
        }
        for i in (head..head + blocks * 8).step_by(8) {
            let (a, b) = load_eight(pixels, i);
            for (c, (first, last)) in shuffles.into_iter().enumerate() {
                let channel = _mm_or_si128(_mm_shuffle_epi8(a, first), _mm_shuffle_epi8(b, last));
                let values = eight_values(channel, constants[c], constants[c]);
                // SAFETY: eight values from `c·n + i`, `i + 8 ≤ n`; streamed only where `head`
                // brought the red plane to 32 bytes and the planes are 32 bytes apart.
                unsafe { store(base.add(c * n + i), values, stream) };
            }
        }
        if stream {
            // Non-temporal stores are weakly ordered: make them visible before the caller hands
            // the buffer on.
            _mm_sfence();
        }
    }

    /// Writes `pixels` to `out` interleaved (`out` holds exactly three values a pixel), in
    /// reading order, around the caches. The caller checked that the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn hwc_streamed_avx2<S: Sink>(&self, pixels: &[[u8; 3]], out: &mut [S]) {
        let n = pixels.len();
        assert_eq!(out.len(), 3 * n, "the HWC form writes three values a pixel");
        let base = S::as_f32_ptr(out);
        // Single pixels first until the values are 32-byte aligned: eight pixels are 96 bytes,
        // so every block after stays aligned. Pixel `i` starts `3i` values in, and 3 is its own
        // inverse modulo 8.
        let to_line = (8 - base.addr() % 32 / 4) % 8;
        let head = (3 * to_line % 8).min(n);
        let blocks = (n - head) / 8;
        // SAFETY: pixel `i` is at `3i..3i+3` of the `3n` values.
        unsafe { self.singles(pixels, head, head + blocks * 8, base, |i, c| 3 * i + c) };
        // Four values from position `p` take the channels `p, p+1, p+2, p+3` (modulo 3): the
        // constants of pattern `p % 3`.
        let mut constants = [(_mm256_setzero_pd(), _mm256_setzero_pd()); 3];
        for (start, pattern) in constants.iter_mut().enumerate() {
            let at = |j: usize| (start + j) % 3;
            let [s, o] =
                [self.scale, self.offset].map(|k| _mm256_setr_pd(k[at(0)], k[at(1)], k[at(2)], k[at(3)]));
            *pattern = (s, o);
        }
        for i in (head..head + blocks * 8).step_by(8) {
            let (a, b) = load_eight(pixels, i);
            for (g, eight) in [a, _mm_srli_si128::<8>(a), b].into_iter().enumerate() {
                let values = eight_values(eight, constants[8 * g % 3], constants[(8 * g + 4) % 3]);
                // SAFETY: values `3i + 8g ..+ 8` of `out`, `i + 8 ≤ n`; 32-byte aligned after
                // `head`.
                unsafe { store(base.add(3 * i + 8 * g), values, true) };
            }
        }
        _mm_sfence();
    }

    /// Writes the pixels before `from` and from `to` on one value at a time, value `c` of pixel
    /// `i` at `base + at(i, c)`.
    ///
    /// # Safety
    /// `base` is valid for `f32` writes at every `at(i, c)` of those pixels.
    #[inline]
    unsafe fn singles(
        &self,
        pixels: &[[u8; 3]],
        from: usize,
        to: usize,
        base: *mut f32,
        at: impl Fn(usize, usize) -> usize,
    ) {
        for i in (0..from).chain(to..pixels.len()) {
            for (c, &x) in pixels[i].iter().enumerate() {
                // SAFETY: the caller's.
                unsafe { base.add(at(i, c)).write(self.value(c, x)) };
            }
        }
    }
}

/// The 24 bytes of pixels `i..i+8`: the first 16, and the last 8 in the low half.
///
/// # Panics
/// When `i + 8` is past the pixels.
#[inline]
#[target_feature(enable = "avx2")]
fn load_eight(pixels: &[[u8; 3]], i: usize) -> (__m128i, __m128i) {
    let src = pixels[i..i + 8].as_flattened();
    // SAFETY: 16 bytes at `src[0..16]` and 8 at `src[16..24]`, within `src`.
    unsafe { (_mm_loadu_si128(src.as_ptr().cast()), _mm_loadl_epi64(src[16..].as_ptr().cast())) }
}

/// The eight bytes in the low half of `bytes` as `f32` values, `x · scale + offset` in `f64`
/// rounded once: the first four with `low`'s `(scale, offset)`, the last four with `high`'s.
#[inline]
#[target_feature(enable = "avx2")]
fn eight_values(bytes: __m128i, low: (__m256d, __m256d), high: (__m256d, __m256d)) -> __m256 {
    let l = _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(bytes));
    let h = _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_srli_si128::<4>(bytes)));
    let l = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(l, low.0), low.1));
    let h = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(h, high.0), high.1));
    _mm256_set_m128(h, l)
}

/// Stores eight values at `to`: around the caches when `stream` (then `to` must be 32-byte
/// aligned), else through them.
///
/// # Safety
/// `to` is valid for eight `f32` writes, 32-byte aligned when `stream`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store(to: *mut f32, values: __m256, stream: bool) {
    // SAFETY: the caller's.
    unsafe {
        if stream {
            _mm256_stream_ps(to, values);
        } else {
            _mm256_storeu_ps(to, values);
        }
    }
}
