//! Whole worker counts from fractional ones.

/// The smallest count at least `x`: `ceil(x)`, saturating; 0 for NaN and negative values.
pub(crate) fn count_at_least(x: f64) -> u32 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        // In range and non-negative: the cast is exact after ceil.
        x.ceil() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate() {
        assert_eq!(count_at_least(f64::NAN), 0);
        assert_eq!(count_at_least(-3.0), 0);
        assert_eq!(count_at_least(2.01), 3);
        assert_eq!(count_at_least(2.0), 2);
        assert_eq!(count_at_least(f64::INFINITY), u32::MAX);
    }
}
