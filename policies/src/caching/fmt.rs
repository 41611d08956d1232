//! Figures in words for reasons: numbers with sensible precision, bytes, durations, dollars.

/// A number with two or three significant digits; scientific notation outside 0.01..1e6.
pub(super) fn num(x: f64) -> String {
    let a = x.abs();
    if !x.is_finite() {
        format!("{x}")
    } else if a == 0.0 {
        "0".to_string()
    } else if a >= 1e6 {
        format!("{x:.2e}")
    } else if a >= 10.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.1}")
    } else if a >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.1e}")
    }
}

/// Bytes in decimal units: "120 MB", "1.2 GB".
pub(super) fn bytes(x: f64) -> String {
    const UNITS: [(f64, &str); 5] = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")];
    for (scale, unit) in UNITS {
        if x >= scale {
            return format!("{} {unit}", num(x / scale));
        }
    }
    format!("{} B", num(x))
}

/// Elements per second: "410", "9.5".
pub(super) fn rate(items_per_s: f64) -> String {
    num(items_per_s)
}

/// A duration: "45 s", "12 min", "3.4 h", "2.0 days".
pub(super) fn duration(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{} s", num(seconds))
    } else if seconds < 2.0 * 3600.0 {
        format!("{} min", num(seconds / 60.0))
    } else if seconds < 48.0 * 3600.0 {
        format!("{} h", num(seconds / 3600.0))
    } else {
        format!("{} days", num(seconds / 86_400.0))
    }
}

/// Dollars: "$12.30", "$0.0004" (one significant digit under a cent).
pub(super) fn dollars(x: f64) -> String {
    if !x.is_finite() || x >= 1e9 {
        format!("${x:.2e}")
    } else if x >= 0.01 || x <= 0.0 {
        format!("${x:.2}")
    } else if x < 1e-6 {
        "under $0.000001".to_string()
    } else {
        // 1e-6 <= x < 0.01: 3 to 6 decimals, so the first significant digit shows.
        let decimals = if x >= 1e-3 {
            3
        } else if x >= 1e-4 {
            4
        } else if x >= 1e-5 {
            5
        } else {
            6
        };
        format!("${x:.decimals$}")
    }
}

/// A share as a percentage: "40%".
pub(super) fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// "the next one" / "the 2 after" for epochs after this one.
pub(super) fn epochs_after(k: u32) -> String {
    if k == 1 { "the next one".to_string() } else { format!("the {k} after") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_well() {
        assert_eq!(bytes(1.2e9), "1.2 GB");
        assert_eq!(bytes(500e6), "500 MB");
        assert_eq!(bytes(12.0), "12 B");
        assert_eq!(rate(410.4), "410");
        assert_eq!(rate(9.46), "9.5");
        assert_eq!(duration(30.0), "30 s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(3.4 * 3600.0), "3.4 h");
        assert_eq!(dollars(0.0004), "$0.0004");
        assert_eq!(dollars(12.3), "$12.30");
        assert_eq!(dollars(0.0), "$0.00");
        assert_eq!(percent(0.4), "40%");
        assert_eq!(epochs_after(2), "the 2 after");
        assert_eq!(num(f64::NAN), "NaN");
    }
}
