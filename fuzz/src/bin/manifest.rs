//! libFuzzer entry point of [`granary_fuzz::manifest`]; built by scripts/fuzz.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::manifest(data));
