//! The normalization computed instead of looked up: `x · scale[c] + offset[c]` in `f64`, one
//! multiply and one add (never fused: Rust does not contract them), rounded once to `f32`.
//!
//! Four values a vector step (AVX2, `f64` lanes) against one table load each: a lookup is a load per value
//! and does not vectorize, while this converts, multiplies and adds whole vectors. It is used
//! only where [`Affine::reproduces`] found it equal to every entry of the tables (the `f64`
//! error, ~1e-16 relative, changes an `f32` rounding only within that of a midpoint; the
//! check is exhaustive, 768 values), so the output is the same bits either way.

use super::{Layout, Stores};
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
mod vectors;

/// The per-channel affine form of the normalization tables.
#[derive(Clone, Copy, Debug)]
pub(super) struct Affine {
    scale: [f64; 3],
    offset: [f64; 3],
}

/// Where a kernel stores its values: a slice of values, or the spare capacity of a `Vec`.
///
/// # Safety
/// An implementor has the size and alignment of an `f32` and holds one as its bits, so that a
/// vector kernel may store `f32`s through `as_f32_ptr`.
pub(super) unsafe trait Sink: Sized {
    /// Stores `value`.
    fn put(&mut self, value: f32);

    /// The start of `slots`, for storing `f32`s.
    #[cfg(target_arch = "x86_64")]
    fn as_f32_ptr(slots: &mut [Self]) -> *mut f32 {
        slots.as_mut_ptr().cast()
    }
}

// SAFETY: an `f32`.
unsafe impl Sink for f32 {
    #[inline(always)]
    fn put(&mut self, value: f32) {
        *self = value;
    }
}

// SAFETY: `MaybeUninit<f32>` has the layout of an `f32`.
unsafe impl Sink for MaybeUninit<f32> {
    #[inline(always)]
    fn put(&mut self, value: f32) {
        self.write(value);
    }
}

/// Whether this CPU runs the arithmetic form faster than the tables: with 256-bit vectors
/// (four `f64` lanes). With two lanes the conversions cost about what the loads do.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Affine {
    /// `(x / 255 − mean) / std` as `x · 1/(255·std) + (−mean/std)`.
    pub(super) fn new(mean: [f32; 3], std: [f32; 3]) -> Affine {
        let scale = std::array::from_fn(|c| 1.0 / (255.0 * f64::from(std[c])));
        let offset = std::array::from_fn(|c| -f64::from(mean[c]) / f64::from(std[c]));
        Affine { scale, offset }
    }

    /// The value of `x` in channel `c`; `interleaved` computes the same two operations with the
    /// constants laid out per byte position.
    #[inline(always)]
    fn value(&self, c: usize, x: u8) -> f32 {
        (f64::from(x) * self.scale[c] + self.offset[c]) as f32
    }

    /// Whether this form gives every entry of `tables`, bit for bit.
    pub(super) fn reproduces(&self, tables: &[[f32; 256]; 3]) -> bool {
        tables.iter().enumerate().all(|(c, table)| {
            table.iter().enumerate().all(|(x, &entry)| self.value(c, x as u8).to_bits() == entry.to_bits())
        })
    }

    /// Writes `pixels` (rows of `w`; a whole number of rows) to `out` (three values a pixel)
    /// in `layout`, each row mirrored when `flip` is set. Without a flip the values are stored
    /// as `stores` says (where the CPU has AVX2; a mirrored form, and any form on other CPUs,
    /// goes through the caches). Right on any CPU; faster than the tables only where
    /// [`available`].
    pub(super) fn write<S: Sink>(
        &self,
        pixels: &[[u8; 3]],
        w: usize,
        flip: bool,
        layout: Layout,
        stores: Stores,
        out: &mut [S],
    ) {
        #[cfg(target_arch = "x86_64")]
        if available() {
            match layout {
                // SAFETY: the CPU has AVX2 (checked just now).
                Layout::Chw if !flip => return unsafe { self.chw_avx2(pixels, stores, out) },
                // SAFETY: as above.
                Layout::Hwc if !flip && stores == Stores::Streaming => {
                    return unsafe { self.hwc_streamed_avx2(pixels, out) };
                }
                _ => {}
            }
            // SAFETY: as above.
            return unsafe { self.write_avx2(pixels, w, flip, layout, out) };
        }
        let _ = stores;
        self.write_any(pixels, w, flip, layout, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn write_avx2<S: Sink>(&self, pixels: &[[u8; 3]], w: usize, flip: bool, layout: Layout, out: &mut [S]) {
        self.write_any(pixels, w, flip, layout, out)
    }

    /// The kernels, inlined into each caller so that they vectorize for its target features.
    #[inline(always)]
    fn write_any<S: Sink>(&self, pixels: &[[u8; 3]], w: usize, flip: bool, layout: Layout, out: &mut [S]) {
        if w == 0 {
            return;
        }
        match layout {
            Layout::Hwc if !flip => self.interleaved(pixels, out),
            // Mirrored: pixel by pixel, each row backwards.
            Layout::Hwc => {
                let (values, _) = out.as_chunks_mut::<3>();
                for (row, values) in pixels.chunks_exact(w).zip(values.chunks_exact_mut(w)) {
                    row.iter().rev().zip(values).for_each(|(p, v)| self.pixel(p, v));
                }
            }
            Layout::Chw => {
                let n = pixels.len();
                let (r, rest) = out.split_at_mut(n.min(out.len()));
                let (g, b) = rest.split_at_mut(n.min(rest.len()));
                let planes = r.chunks_exact_mut(w).zip(g.chunks_exact_mut(w)).zip(b.chunks_exact_mut(w));
                for (row, ((r, g), b)) in pixels.chunks_exact(w).zip(planes) {
                    let put = |(((p, r), g), b): (((&[u8; 3], &mut S), &mut S), &mut S)| {
                        r.put(self.value(0, p[0]));
                        g.put(self.value(1, p[1]));
                        b.put(self.value(2, p[2]));
                    };
                    if flip {
                        row.iter().rev().zip(r).zip(g).zip(b).for_each(put);
                    } else {
                        row.iter().zip(r).zip(g).zip(b).for_each(put);
                    }
                }
            }
        }
    }

    /// Interleaved and in order: the bytes four pixels at a time, each position with its
    /// channel's constants, so that the loop is whole vectors with no shuffles.
    #[inline(always)]
    fn interleaved<S: Sink>(&self, pixels: &[[u8; 3]], out: &mut [S]) {
        let scale: [f64; 12] = std::array::from_fn(|i| self.scale[i % 3]);
        let offset: [f64; 12] = std::array::from_fn(|i| self.offset[i % 3]);
        let (quads, tail) = pixels.as_chunks::<4>();
        let (quad_values, tail_values) = out.split_at_mut((quads.len() * 12).min(out.len()));
        let (quad_values, _) = quad_values.as_chunks_mut::<12>();
        for (quad, values) in quads.iter().zip(quad_values) {
            let bytes = quad.as_flattened();
            for i in 0..12 {
                values[i].put((f64::from(bytes[i]) * scale[i] + offset[i]) as f32);
            }
        }
        let (tail_values, _) = tail_values.as_chunks_mut::<3>();
        tail.iter().zip(tail_values).for_each(|(p, v)| self.pixel(p, v));
    }

    #[inline(always)]
    fn pixel<S: Sink>(&self, p: &[u8; 3], v: &mut [S; 3]) {
        v[0].put(self.value(0, p[0]));
        v[1].put(self.value(1, p[1]));
        v[2].put(self.value(2, p[2]));
    }
}
