//! libFuzzer entry point of [`granary_fuzz::source_parquet`]; built by scripts/fuzz.
//!
//! The Parquet reader catches the parquet crate's panics on corrupt pages and reports the file
//! as corrupt, as the worker must: see [`granary_fuzz::unwind_dependency_panics`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: granary_fuzz::unwind_dependency_panics(),
    |data: &[u8]| granary_fuzz::source_parquet(data)
);
