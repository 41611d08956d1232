//! Pixel kernels shared by the worker and the client, so that work moved across the wire gives
//! bit-identical results on either side.
//!
//! - `normalize`: `uint8` RGB to `float32` `(x / 255 − mean) / std` through per-channel tables
//!   (or the arithmetic that reproduces them bit for bit, where the CPU has AVX2),
//!   in HWC or CHW layout, optionally mirrored.

pub mod normalize;
