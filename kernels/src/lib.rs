//! Pixel kernels shared by the worker and the client, so that work moved across the wire gives
//! bit-identical results on either side.
//!
//! - `normalize`: `uint8` RGB to `float32` `(x / 255 − mean) / std` through per-channel tables
//!   (or the arithmetic that reproduces them bit for bit, where the CPU has AVX2),
//!   in HWC or CHW layout, optionally mirrored.
//! - `mirror`: `uint8` RGB rows mirrored left to right, copied or in place (sixteen pixels at a
//!   time where the CPU has SSSE3).
//! - `planes`: `uint8` RGB rows split into three planes (the CHW layout), optionally mirrored
//!   (sixteen pixels at a time where the CPU has SSSE3).
//! - `resize`: both passes of a bilinear, antialiased resize of RGB rows and the taps they use,
//!   with the taps and bytes of `fast_image_resize` (two source rows at a time down, and four
//!   output pixels to a vector across where the CPU has AVX-512 VBMI and VNNI, two where it has
//!   AVX2).

pub mod mirror;
pub mod normalize;
pub mod planes;
pub mod resize;

/// Whether this CPU shuffles bytes within a vector (SSSE3's `pshufb`), which the mirror and the
/// planes use to move sixteen pixels at a time.
#[cfg(target_arch = "x86_64")]
fn byte_shuffles() -> bool {
    std::arch::is_x86_feature_detected!("ssse3")
}

#[cfg(test)]
mod benchmark;
