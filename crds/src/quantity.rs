//! Byte sizes (`500Mi`, `20Gi`, `1T`) and durations (`30s`, `12h`, `1h30m`) as written in specs.

use std::time::Duration;

/// Suffixes accepted by [`parse_bytes`] and the factor each stands for.
const BYTE_SUFFIXES: &[(&str, u64)] = &[
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("k", 1_000),
    ("K", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
];

/// The expected form of a byte size, for messages.
pub const BYTES_FORM: &str = "an integer number of bytes, or a number with a suffix Ki, Mi, Gi, Ti, Pi \
     (powers of 1024) or K, M, G, T, P (powers of 1000), e.g. `500Mi`, `20Gi`, `1.5T`";

/// The expected form of a duration, for messages.
pub const DURATION_FORM: &str = "a whole number with a unit `s`, `m`, `h` or `d`, optionally combined, e.g. `30s`, `15m`, `12h`, `7d`, `1h30m`";

/// Parses a byte count: a plain integer (`1048576`) or a number with a binary (`Ki`, `Mi`, `Gi`,
/// `Ti`, `Pi`) or decimal (`K`/`k`, `M`, `G`, `T`, `P`) suffix (`500Mi`, `1.5Gi`, `20G`). A
/// fractional result is rounded down to whole bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("is empty; expected {BYTES_FORM}"));
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let factor = if suffix.is_empty() {
        1
    } else if let Some((_, f)) = BYTE_SUFFIXES.iter().find(|(name, _)| *name == suffix) {
        *f
    } else {
        let hint = match suffix {
            "B" => "; drop the `B`".to_string(),
            _ if suffix.ends_with('B') || suffix.ends_with('b') => {
                format!("; write `{}` without the `B`", &suffix[..suffix.len() - 1])
            }
            _ if suffix.starts_with('-') => "; sizes cannot be negative".to_string(),
            _ => String::new(),
        };
        return Err(format!("`{text}` has an unknown suffix `{suffix}`{hint}; expected {BYTES_FORM}"));
    };
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty()
        || frac_part.contains('.')
        || (number.contains('.') && frac_part.is_empty())
    {
        return Err(format!("`{text}` is not a number; expected {BYTES_FORM}"));
    }
    if !frac_part.is_empty() && suffix.is_empty() {
        return Err(format!("`{text}` is a fraction of a byte; expected {BYTES_FORM}"));
    }
    let too_big = || format!("`{text}` is too large (at most 2^64 - 1 bytes)");
    let int: u128 = if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| too_big())? };
    // At most 18 fractional digits matter below a byte even for the largest suffix.
    let frac_digits = &frac_part[..frac_part.len().min(18)];
    let frac: u128 = if frac_digits.is_empty() { 0 } else { frac_digits.parse().map_err(|_| too_big())? };
    let scale = 10u128.pow(frac_digits.len() as u32);
    let factor = u128::from(factor);
    let total = int
        .checked_mul(factor)
        .and_then(|whole| whole.checked_add(frac * factor / scale))
        .ok_or_else(too_big)?;
    u64::try_from(total).map_err(|_| too_big())
}

/// Parses a duration: whole numbers with units `s`, `m`, `h`, `d`, optionally combined
/// (`30s`, `15m`, `12h`, `7d`, `1h30m`, `1d12h`). Each unit may appear once, largest first.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("is empty; expected {DURATION_FORM}"));
    }
    let mut total: u64 = 0;
    let mut rest = s;
    let mut last_rank: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "`{text}` is not a duration (expected a number at `{rest}`); expected {DURATION_FORM}"
            ));
        }
        let (number, after) = rest.split_at(digits);
        let Some(unit) = after.chars().next() else {
            return Err(format!(
                "`{text}` has no unit after `{number}`; write e.g. `{number}s` or `{number}m`; expected {DURATION_FORM}"
            ));
        };
        let (rank, seconds) = match unit {
            'd' => (0, 86_400u64),
            'h' => (1, 3_600),
            'm' => (2, 60),
            's' => (3, 1),
            other => {
                return Err(format!("`{text}` has an unknown unit `{other}`; expected {DURATION_FORM}"));
            }
        };
        if last_rank.is_some_and(|last| rank <= last) {
            return Err(format!(
                "`{text}` repeats or misorders its units; write the largest unit first, each once, e.g. `1h30m`"
            ));
        }
        last_rank = Some(rank);
        let too_long = || format!("`{text}` is too long");
        let n: u64 = number.parse().map_err(|_| too_long())?;
        total = n.checked_mul(seconds).and_then(|v| total.checked_add(v)).ok_or_else(too_long)?;
        rest = &after[unit.len_utf8()..];
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("1Ki"), Ok(1024));
        assert_eq!(parse_bytes("500Mi"), Ok(500 << 20));
        assert_eq!(parse_bytes("20Gi"), Ok(20 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_bytes("2k"), Ok(2_000));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("16Pi"), Ok(16 << 50));
        for bad in ["", "Gi", "1.5", "20GB", "20gi", "-1", "1..5Gi", "99999999999999P", "1e3"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "30", "h", "1x", "1m1h", "1h1h", "-5s", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
