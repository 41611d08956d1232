//! Panics caught where they would end a worker's thread. Third-party decoders' panics on
//! malformed input are caught where the input is decoded, so that a bad file is that file's
//! error, as for any other bad data: the `image` crate's pure-Rust decoders and the parquet
//! crate are fuzzed upstream and still panic on some malformed files (see the callers). Any
//! other stage's panic is caught around the stage's call, and is its error on the element
//! (`executor::panicked`): a compute thread that died would leave its element's place in the
//! batch order empty, and a served pipeline would wait for it forever. The cache profile's
//! measurement, on a thread of its own, reports a panic as the profile's error the same way.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `call`, giving what a panic inside it said instead of unwinding further. What the
/// callers' closures change (a decoder they own, the element being transformed) is dropped or
/// reported as failed after a panic, never used as if whole (hence `AssertUnwindSafe`). The
/// process's panic hook still prints the panic, with where it happened.
pub(crate) fn contained<T>(call: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|panic| message(panic.as_ref()).to_string())
}

/// What a caught panic said.
pub(crate) fn message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

#[cfg(test)]
mod tests {
    use super::contained;

    #[test]
    fn a_panic_becomes_its_message_and_a_value_passes_through() {
        assert_eq!(contained(|| 7), Ok(7));
        assert_eq!(contained(|| -> u8 { panic!("static text") }), Err("static text".to_string()));
        let n = 3;
        assert_eq!(contained(|| -> u8 { panic!("formatted {n}") }), Err("formatted 3".to_string()));
    }
}
