//! The taps as `fast_image_resize` 6 writes them (`precompute_coefficients`, then its 16-bit
//! normalizer), one weight pushed at a time and libm's rounding: what [`Taps::bilinear`] must
//! give to the last bit, and the baseline of its benchmark.

use super::{MAX_WEIGHT_BITS, PRECISION_BITS, Taps, triangle};

/// Sets `taps` as [`Taps::bilinear`] does.
pub fn bilinear(taps: &mut Taps, in_size: usize, in0: f64, in1: f64, out_size: usize) {
    *taps = Taps::default();
    let scale = (in1 - in0) / out_size as f64;
    if in_size == 0 || out_size == 0 || scale.is_nan() || scale <= 0.0 {
        return;
    }
    let filter_scale = scale.max(1.0);
    let radius = filter_scale;
    let window = radius.ceil() as usize * 2 + 1;
    let recip = 1.0 / filter_scale;
    let mut exact = Vec::new();
    for out_x in 0..out_size {
        let in_center = in0 + (out_x as f64 + 0.5) * scale;
        let x_min = (in_center - radius).floor().max(0.0) as usize;
        let x_max = ((in_center + radius).ceil().max(0.0) as usize).min(in_size).max(x_min);
        let here = exact.len();
        let center = in_center - 0.5;
        let (mut start, mut end) = (x_min, x_max);
        let mut sum = 0.0;
        for x in x_min..x_max {
            let w = triangle((x as f64 - center) * recip);
            if x == start && w == 0.0 {
                start += 1;
            } else {
                exact.push(w);
                sum += w;
            }
        }
        for &w in exact[here..].iter().rev() {
            if end <= start || w != 0.0 {
                break;
            }
            end -= 1;
        }
        if sum != 0.0 {
            exact[here..].iter_mut().for_each(|w| *w /= sum);
        }
        exact.resize(here + window, 0.0);
        taps.starts.push(start);
        taps.sizes.push(end.saturating_sub(start).min(window));
    }
    let largest = exact.iter().copied().fold(0.0, f64::max);
    let mut precision = 0;
    for p in 0..PRECISION_BITS {
        precision = p;
        if (largest * (1u64 << (p + 1)) as f64).round() as i64 >= 1 << MAX_WEIGHT_BITS {
            break;
        }
    }
    let scale = (1u64 << precision) as f64;
    taps.weights.extend(exact.iter().map(|&w| (w * scale).round() as i16));
    taps.window = window;
    taps.precision = precision;
    let reads = taps.starts.iter().zip(&taps.sizes).filter(|&(_, &size)| size > 0);
    taps.first = reads.clone().map(|(&s, _)| s).min().unwrap_or(0);
    taps.end = reads.map(|(&s, &size)| s + size).max().unwrap_or(0).max(taps.first);
    taps.starts.iter_mut().for_each(|s| *s = s.saturating_sub(taps.first));
}
