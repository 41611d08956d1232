//! libFuzzer entry point of [`granary_fuzz::worker_requests`]; built by scripts/fuzz.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_fuzz::worker_requests(data));
