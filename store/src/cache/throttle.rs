//! Test-only slowing of a store (the cache's: `GRANARY_TEST_CACHE_THROTTLE`; the worker's source
//! has its own variable), so that tests and benchmarks on a local disk can pretend to be on a
//! remote object store.

use std::time::Duration;

use super::CacheError;

/// The environment variable [`CacheStore::open`](super::CacheStore::open) reads: a comma list of
/// `get_per_byte_ns=N`, `put_per_byte_ns=N`, `per_call_ms=N`.
pub const THROTTLE_ENV: &str = "GRANARY_TEST_CACHE_THROTTLE";

/// How much to slow the store down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttle {
    /// Nanoseconds of delay per byte read.
    pub get_per_byte_ns: u64,
    /// Nanoseconds of delay per byte written.
    pub put_per_byte_ns: u64,
    /// Milliseconds of delay per get and put.
    pub per_call_ms: u64,
}

impl Throttle {
    /// Parses `get_per_byte_ns=N,put_per_byte_ns=N,per_call_ms=N` (any subset, any order, spaces
    /// allowed around items). Errors name [`THROTTLE_ENV`].
    pub fn parse(text: &str) -> Result<Throttle, CacheError> {
        Throttle::parse_var(THROTTLE_ENV, text)
    }

    /// [`Throttle::parse`] for the value of the variable `var`; errors name it.
    pub fn parse_var(var: &str, text: &str) -> Result<Throttle, CacheError> {
        let mut throttle = Throttle::default();
        for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            let bad = |why: String| CacheError::Format(format!("{var}: `{item}`: {why}"));
            let (key, value) = item.split_once('=').ok_or_else(|| {
                bad("expected KEY=N with KEY one of get_per_byte_ns, put_per_byte_ns, per_call_ms".into())
            })?;
            let value: u64 = value
                .trim()
                .parse()
                .map_err(|e| bad(format!("`{}` is not a non-negative integer ({e})", value.trim())))?;
            match key.trim() {
                "get_per_byte_ns" => throttle.get_per_byte_ns = value,
                "put_per_byte_ns" => throttle.put_per_byte_ns = value,
                "per_call_ms" => throttle.per_call_ms = value,
                other => {
                    return Err(bad(format!(
                        "unknown key `{other}` (expected get_per_byte_ns, put_per_byte_ns or per_call_ms)"
                    )));
                }
            }
        }
        Ok(throttle)
    }

    /// The throttle [`THROTTLE_ENV`] asks for, or `None` when it is not set.
    pub fn from_env() -> Result<Option<Throttle>, CacheError> {
        Throttle::from_var(THROTTLE_ENV)
    }

    /// The throttle the environment variable `var` asks for, or `None` when it is not set.
    pub fn from_var(var: &str) -> Result<Option<Throttle>, CacheError> {
        match std::env::var(var) {
            Ok(text) => Throttle::parse_var(var, &text).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(CacheError::Format(format!("{var} is not valid UTF-8")))
            }
        }
    }

    /// The delay for reading `bytes` bytes.
    pub(crate) fn get_delay(&self, bytes: usize) -> Duration {
        Duration::from_nanos(self.get_per_byte_ns.saturating_mul(bytes as u64))
            + Duration::from_millis(self.per_call_ms)
    }

    /// The delay for writing `bytes` bytes.
    pub(crate) fn put_delay(&self, bytes: usize) -> Duration {
        Duration::from_nanos(self.put_per_byte_ns.saturating_mul(bytes as u64))
            + Duration::from_millis(self.per_call_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_any_subset() {
        assert_eq!(Throttle::parse("").unwrap(), Throttle::default());
        assert_eq!(
            Throttle::parse(" per_call_ms=5 , get_per_byte_ns=2,put_per_byte_ns = 3").unwrap(),
            Throttle { get_per_byte_ns: 2, put_per_byte_ns: 3, per_call_ms: 5 }
        );
        let t = Throttle::parse("per_call_ms=7").unwrap();
        assert_eq!(t.get_delay(0), Duration::from_millis(7));
        let t = Throttle { put_per_byte_ns: 10, get_per_byte_ns: 2, per_call_ms: 0 };
        assert_eq!(t.put_delay(3), Duration::from_nanos(30));
        assert_eq!(t.get_delay(3), Duration::from_nanos(6));
    }

    #[test]
    fn errors_name_the_variable_and_the_item() {
        for (text, needle) in [
            ("per_call_ms", "expected KEY=N"),
            ("per_call_ms=-1", "not a non-negative integer"),
            ("per_call_ms=x", "`x`"),
            ("speed=3", "unknown key `speed`"),
        ] {
            let err = Throttle::parse(text).unwrap_err().to_string();
            assert!(err.starts_with(THROTTLE_ENV), "{err}");
            assert!(err.contains(needle), "{err}");
        }
        let err = Throttle::parse_var("OTHER_THROTTLE", "per_call_ms=x").unwrap_err().to_string();
        assert!(
            err.starts_with("OTHER_THROTTLE: `per_call_ms=x`"),
            "another variable's errors name it: {err}"
        );
    }
}
