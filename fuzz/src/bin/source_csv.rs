//! libFuzzer entry point of [`granary_fuzz::source_csv`]; built by scripts/fuzz.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::source_csv(data));
