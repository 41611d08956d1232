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
//! Each pass takes the widest [`Kernels`] the CPU runs ([`Kernels::best`]). Where the CPU has
//! AVX-512 with VBMI's byte permutes and VNNI's fused multiply-add of 16-bit pairs (Ice Lake,
//! Sapphire Rapids, Zen 4):
//! - the horizontal pass puts four output pixels in one 512-bit vector, a 128-bit lane each. A
//!   masked load brings the up to 21 source pixels the four read, one byte permute per pair of
//!   taps places each pixel's channels beside its neighbour's as 16-bit pairs, and one
//!   multiply-add per pair of taps sums them with their weights. Sixteen output pixels are
//!   packed to bytes and stored at once.
//! - the vertical pass takes two source rows at a time: one byte permute places each byte
//!   beside the byte below it as a 16-bit pair, and one multiply-add adds both taps' products.
//!
//! Where it has AVX2 only (Haswell, Zen 1–3):
//! - the horizontal pass puts two output pixels in a 256-bit vector, a lane each loading the 16
//!   bytes from its own first pixel; one in-lane byte shuffle per pair of taps (the same for
//!   every output) makes the 16-bit pairs, and `vpmaddwd` weighs them. Eight outputs are packed
//!   and stored together.
//! - the vertical pass interleaves two rows' bytes, then each with zeros, into 16-bit pairs
//!   for `vpmaddwd`, 32 bytes a step.
//!
//! Elsewhere, or when outputs reach too far for the kernel (four neighbouring outputs over 21
//! source pixels with AVX-512, one output over 5 with AVX2: a shrink by more than about 4× or
//! 2×), [`Horizontal::vectors`] is false: callers keep a pass of their own, and the passes go
//! pixel by pixel.

#[cfg(target_arch = "x86_64")]
mod horizontal;
#[cfg(target_arch = "x86_64")]
mod horizontal_avx2;
mod taps;
#[cfg(target_arch = "x86_64")]
mod vertical;
#[cfg(target_arch = "x86_64")]
mod vertical_avx2;

use std::sync::OnceLock;
pub use taps::Taps;

/// The kernels a pass runs on, from the plainest to the widest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kernels {
    /// Byte by byte: any CPU.
    #[default]
    Bytes,
    /// AVX2 (Haswell, Zen and later): two output pixels to a vector across, 32 bytes a step
    /// down.
    Avx2,
    /// AVX-512 F and BW with VBMI's byte permutes and VNNI's fused multiply-add of 16-bit pairs
    /// (Ice Lake, Sapphire Rapids, Zen 4 and later): four output pixels to a vector across, 64
    /// bytes a step down.
    Avx512,
}

impl Kernels {
    /// The widest kernels this CPU runs, no wider than `GRANARY_RESIZE_KERNELS` (`bytes`,
    /// `avx2` or `avx512`) where that is set: one machine can then measure the kernels a
    /// plainer CPU would take (`bytes` leaves the resize to `fast_image_resize`). Both are
    /// read once.
    pub fn best() -> Kernels {
        static BEST: OnceLock<Kernels> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var("GRANARY_RESIZE_KERNELS") {
                Ok(name) => Kernels::named(&name).unwrap_or_else(|| {
                    tracing::warn!(
                        value = %name,
                        "GRANARY_RESIZE_KERNELS names no kernels: set `bytes`, `avx2` or `avx512`, or unset it; the resize takes this CPU's widest"
                    );
                    Kernels::Avx512
                }),
                Err(_) => Kernels::Avx512,
            };
            Kernels::of_cpu().min(cap)
        })
    }

    /// The widest kernels this CPU runs within `limit` (`None`: no limit).
    fn within(limit: Option<Kernels>) -> Kernels {
        limit.map_or_else(Kernels::best, |limit| limit.min(Kernels::best()))
    }

    /// The kernels named `name` (`bytes`, `avx2` or `avx512`).
    pub fn named(name: &str) -> Option<Kernels> {
        match name.trim().to_ascii_lowercase().as_str() {
            "bytes" => Some(Kernels::Bytes),
            "avx2" => Some(Kernels::Avx2),
            "avx512" => Some(Kernels::Avx512),
            _ => None,
        }
    }

    /// The widest kernels this CPU has the features for.
    fn of_cpu() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vbmi") && has!("avx512vnni") {
                return Kernels::Avx512;
            }
            if has!("avx2") {
                return Kernels::Avx2;
            }
        }
        Kernels::Bytes
    }
}

/// How many of the first `rows` rows (each `src_row` bytes, the first at byte 0 of a source of
/// `len` bytes) may read up to byte `farthest` of the row without leaving the source: the
/// horizontal kernels' wide loads reach past a row's end into the next.
#[cfg(target_arch = "x86_64")]
fn rows_within(len: usize, src_row: usize, farthest: usize, rows: usize) -> usize {
    match len.checked_sub(farthest) {
        Some(room) if src_row > 0 => (room / src_row + 1).min(rows),
        Some(_) => rows,
        None => 0,
    }
}

/// The shortest rows (in bytes) the AVX2 vertical pass takes: one step of it.
const AVX2_ROWS: usize = 32;

/// The vertical pass of one resize: rows of any length (in bytes) resampled from source rows.
#[derive(Clone, Debug, Default)]
pub struct Vertical {
    taps: Taps,
    /// Each output row's weights as pairs (the first in the low 16 bits), `taps.most()`
    /// halved and rounded up for every row, a lone last weight paired with zero: what the
    /// vector pass broadcasts.
    pairs: Vec<i32>,
    /// The widest kernels the pass may take (`None`: this CPU's best).
    limit: Option<Kernels>,
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

    /// Keeps the pass to `kernels` or plainer (to compare kernels on one CPU).
    pub fn limit(&mut self, kernels: Kernels) {
        self.limit = Some(kernels);
    }

    /// The kernels [`Vertical::run`] takes for rows of `len` bytes.
    pub fn kernels(&self, len: usize) -> Kernels {
        match Kernels::within(self.limit) {
            Kernels::Avx2 if len < AVX2_ROWS => Kernels::Bytes,
            kernels => kernels,
        }
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
        // SAFETY (both kernels): the CPU has their features (`kernels` takes no more than
        // `Kernels::best`), and the AVX2 one rows of `AVX2_ROWS` bytes or more; every tap reads a row
        // below `source_width`, inside `src`, and the output rows are inside `dst` (asserted
        // above).
        #[cfg(target_arch = "x86_64")]
        match self.kernels(len) {
            Kernels::Avx512 => {
                return unsafe { vertical::run(&self.taps, &self.pairs, src, stride, len, dst) };
            }
            Kernels::Avx2 => {
                return unsafe { vertical_avx2::run(&self.taps, &self.pairs, src, stride, len, dst) };
            }
            Kernels::Bytes => {}
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
    /// The kernels that run these taps on this CPU.
    kernels: Kernels,
    /// The widest kernels the pass may take (`None`: this CPU's best).
    limit: Option<Kernels>,
    #[cfg(target_arch = "x86_64")]
    tables: horizontal::Tables,
    #[cfg(target_arch = "x86_64")]
    tables_avx2: horizontal_avx2::Tables,
}

impl Horizontal {
    /// Sets the pass to resize the columns `in0..in1` (fractional) of rows `in_size` pixels wide
    /// to `out_size` pixels, reusing this value's buffers.
    pub fn bilinear(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        self.taps.bilinear(in_size, in0, in1, out_size);
        self.kernels = Kernels::Bytes;
        #[cfg(target_arch = "x86_64")]
        {
            let widest = Kernels::within(self.limit);
            if widest == Kernels::Avx512 && self.tables.prepare(&self.taps) {
                self.kernels = Kernels::Avx512;
            } else if widest >= Kernels::Avx2 && self.tables_avx2.prepare(&self.taps) {
                self.kernels = Kernels::Avx2;
            }
        }
    }

    /// Keeps the pass to `kernels` or plainer from the next [`Horizontal::bilinear`] (to
    /// compare kernels on one CPU).
    pub fn limit(&mut self, kernels: Kernels) {
        self.limit = Some(kernels);
    }

    /// The kernels [`Horizontal::run`] takes for these taps.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The taps in effect.
    pub fn taps(&self) -> &Taps {
        &self.taps
    }

    /// Whether [`Horizontal::run`] takes a vector kernel: false on CPUs without AVX2 and for
    /// taps that reach too far (see the module's doc).
    pub fn vectors(&self) -> bool {
        self.kernels != Kernels::Bytes
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
        // SAFETY (both kernels): `kernels` is only set to kernels the CPU has, whose tables
        // were prepared for these taps; `rows` whole rows fit in both buffers.
        #[cfg(target_arch = "x86_64")]
        match self.kernels {
            Kernels::Avx512 => return unsafe { self.tables.run(&self.taps, src, dst, rows) },
            Kernels::Avx2 => return unsafe { self.tables_avx2.run(&self.taps, src, dst, rows) },
            Kernels::Bytes => {}
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
