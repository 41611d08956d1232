//! How decisions put worker counts and rates into words.

/// "1 worker" / "3 workers".
pub(crate) fn workers(n: u32) -> String {
    if n == 1 { "1 worker".to_string() } else { format!("{n} workers") }
}

/// The verb for `n` workers: "makes" or "make".
pub(crate) fn make(n: u32) -> &'static str {
    if n == 1 { "makes" } else { "make" }
}

/// A rate in words with sensible precision.
pub(crate) fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}
