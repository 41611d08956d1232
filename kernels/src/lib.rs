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

pub mod mirror;
pub mod normalize;
pub mod planes;

#[cfg(test)]
mod benchmark;
