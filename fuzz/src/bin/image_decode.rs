//! libFuzzer entry point of [`granary_fuzz::image_decode`]; built by scripts/fuzz.
//!
//! `image.decode` catches the pure-Rust decoders' panics on malformed files and reports the
//! file as malformed, as the worker must: see [`granary_fuzz::unwind_dependency_panics`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: granary_fuzz::unwind_dependency_panics(),
    |data: &[u8]| granary_fuzz::image_decode(data)
);
