//! libFuzzer entry point of [`granary_fuzz::source_parquet`]; built by scripts/fuzz.
//!
//! The Parquet reader catches the parquet crate's panics on corrupt pages and reports the file
//! as corrupt, as the worker must; libFuzzer's panic hook would abort on those caught panics, so
//! this target puts the default hook back. A panic nothing catches still aborts (it cannot
//! unwind out of the fuzzer's entry point), so it is still found.
#![no_main]

libfuzzer_sys::fuzz_target!(init: drop(std::panic::take_hook()), |data: &[u8]| granary_fuzz::source_parquet(data));
