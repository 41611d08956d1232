//! The two passes of a bilinear resize of RGB `uint8` images, antialiased when shrinking
//! (Pillow's convolution, which `fast_image_resize` and torchvision's `antialias=True` share).
//!
//! [`Taps::bilinear`] computes one axis's taps as `fast_image_resize` 6 does: the same `f64`
//! weights, trimmed of zeros at both ends and normalized, rounded to `i16` at the precision its
//! largest weight allows. [`Vertical::run`] and [`Horizontal::run`] resample with them: each
//! output byte is `(2^(p−1) + Σ weight·pixel) >> p`, saturated to `0..=255`. Integer sums do
//! not depend on their order, so every implementation gives the same bytes as that crate's
//! passes.
//!
//! Where the CPU has AVX-512 with VBMI's byte permutes and VNNI's fused multiply-add of 16-bit
//! pairs ([`vectors_available`]: Ice Lake, Sapphire Rapids, Zen 4):
//! - the horizontal pass puts four output pixels in one 512-bit vector, a 128-bit lane each. A
//!   masked load brings the up to 21 source pixels the four read, one byte permute per pair of
//!   taps places each pixel's channels beside its neighbour's as 16-bit pairs, and one
//!   multiply-add per pair of taps sums them with their weights. Sixteen output pixels are
//!   packed to bytes and stored at once.
//! - the vertical pass takes two source rows at a time: one byte permute places each byte
//!   beside the byte below it as a 16-bit pair, and one multiply-add adds both taps' products.
//!
//! Elsewhere, or when four neighbouring outputs reach over more than 21 source pixels (a
//! shrink by more than about 4×), [`Horizontal::vectors`] is false: callers keep a pass of
//! their own, and the passes go pixel by pixel.

#[cfg(target_arch = "x86_64")]
mod horizontal;
mod taps;
#[cfg(target_arch = "x86_64")]
mod vertical;

pub use taps::Taps;

/// Whether this CPU has what the vector passes use: AVX-512 F and BW, VBMI's byte permutes and
/// VNNI's fused multiply-add of 16-bit pairs (Ice Lake, Sapphire Rapids, Zen 4 and later).
pub fn vectors_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The vertical pass of one resize: rows of any length (in bytes) resampled from source rows.
#[derive(Clone, Debug, Default)]
pub struct Vertical {
    taps: Taps,
    /// Each output row's weights as pairs (the first in the low 16 bits), `taps.most()`
    /// halved and rounded up for every row, a lone last weight paired with zero: what the
    /// vector pass broadcasts.
    pairs: Vec<i32>,
}

impl Vertical {
    /// Sets the pass to resize the rows `in0..in1` (fractional, of `in_size` rows) to
    /// `out_size` rows, reusing this value's buffers.
    pub fn bilinear(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        self.taps.bilinear(in_size, in0, in1, out_size);
        let per_row = self.taps.most().div_ceil(2);
        self.pairs.clear();
        self.pairs.resize(per_row * self.taps.len(), 0);
        for y in 0..self.taps.len() {
            for (k, &w) in self.taps.of(y).1.iter().enumerate() {
                self.pairs[y * per_row + k / 2] |= i32::from(w as u16) << (16 * (k % 2));
            }
        }
    }

    /// The taps in effect.
    pub fn taps(&self) -> &Taps {
        &self.taps
    }

    /// Resamples rows of `len` bytes: source row `i` (from [`Taps::first`]) at `src[i ×
    /// stride..][..len]`, output row `y` at `dst[y × len..][..len]`, for the [`Taps::len`]
    /// output rows.
    ///
    /// # Panics
    /// When `stride < len`, or `src` or `dst` is too short for those rows: the caller's
    /// arithmetic is wrong, and no pass may read or write past them.
    pub fn run(&self, src: &[u8], stride: usize, len: usize, dst: &mut [u8]) {
        let rows = self.taps.source_width();
        let fits = stride >= len
            && (rows == 0 || (rows - 1) * stride + len <= src.len())
            && self.taps.len() * len <= dst.len();
        assert!(fits, "the vertical pass's rows do not fit its buffers");
        if len == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if vectors_available() {
            // SAFETY: the CPU has the features (checked just now); every tap reads a row
            // below `source_width`, inside `src`, and the output rows are inside `dst`
            // (asserted above).
            return unsafe { vertical::run(&self.taps, &self.pairs, src, stride, len, dst) };
        }
        let half = (1i32 << self.taps.precision()) >> 1;
        for (y, out) in dst.chunks_exact_mut(len.max(1)).take(self.taps.len()).enumerate() {
            let (start, weights) = self.taps.of(y);
            for (x, o) in out.iter_mut().enumerate() {
                let sum = weights
                    .iter()
                    .enumerate()
                    .fold(half, |sum, (t, &w)| sum + i32::from(w) * i32::from(src[(start + t) * stride + x]));
                *o = (sum >> self.taps.precision()).clamp(0, 255) as u8;
            }
        }
    }
}

/// The horizontal pass of one resize: its taps, and the vector kernel's tables for them.
#[derive(Clone, Debug, Default)]
pub struct Horizontal {
    taps: Taps,
    /// Whether the vector kernel runs these taps on this CPU.
    vectors: bool,
    #[cfg(target_arch = "x86_64")]
    tables: horizontal::Tables,
}

impl Horizontal {
    /// Sets the pass to resize the columns `in0..in1` (fractional) of rows `in_size` pixels wide
    /// to `out_size` pixels, reusing this value's buffers.
    pub fn bilinear(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        self.taps.bilinear(in_size, in0, in1, out_size);
        self.vectors = false;
        #[cfg(target_arch = "x86_64")]
        if vectors_available() {
            self.vectors = self.tables.prepare(&self.taps);
        }
    }

    /// The taps in effect.
    pub fn taps(&self) -> &Taps {
        &self.taps
    }

    /// Whether [`Horizontal::run`] takes the vector kernel: false on CPUs without AVX-512 VBMI
    /// and for taps that reach too far (see the module's doc).
    pub fn vectors(&self) -> bool {
        self.vectors
    }

    /// Resamples each row of `src` (RGB rows of [`Taps::source_width`] pixels, from column
    /// [`Taps::first`] of the rows the taps were made for) into the row of `dst` at the same
    /// index (RGB rows of [`Taps::len`] pixels). Rows past the shorter of the two are left
    /// alone.
    pub fn run(&self, src: &[u8], dst: &mut [u8]) {
        let (src_row, dst_row) = (self.taps.source_width() * 3, self.taps.len() * 3);
        if src_row == 0 || dst_row == 0 {
            return;
        }
        let rows = (src.len() / src_row).min(dst.len() / dst_row);
        #[cfg(target_arch = "x86_64")]
        if self.vectors {
            // SAFETY: `vectors` is only set where `vectors_available()` held, for these taps'
            // tables; `rows` whole rows fit in both buffers.
            return unsafe { self.tables.run(&self.taps, src, dst, rows) };
        }
        for (src, dst) in src.chunks_exact(src_row).zip(dst.chunks_exact_mut(dst_row)).take(rows) {
            self.taps.resample_row(src, dst);
        }
    }
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests;
