//! One axis's bilinear taps, as `fast_image_resize` 6 computes them (its
//! `precompute_coefficients` with the adaptive kernel size, then its 16-bit normalizer).

/// The largest precision a sum may take: 32 bits, less 8 for the result and 2 for the overflow
/// of filters with negative lobes.
const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Bits of an `i16` weight's magnitude.
const MAX_WEIGHT_BITS: u32 = 16 - 1;

/// The taps of one axis: for each output pixel, the first source pixel it reads and its
/// weights, fixed-point with [`Taps::precision`] fractional bits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Taps {
    /// First source pixel of each output pixel (relative to [`Taps::first`]).
    starts: Vec<usize>,
    /// Weights of each output pixel, `window` slots each, the first `sizes[i]` in use.
    weights: Vec<i16>,
    sizes: Vec<usize>,
    window: usize,
    precision: u32,
    /// The first and one past the last source pixel any output reads.
    first: usize,
    end: usize,
    /// The weights before rounding, kept to reuse the allocation.
    exact: Vec<f64>,
}

/// The bilinear (triangle) filter, support 1.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

// `f64::round`, `floor` and `ceil` are calls into libm on x86-64 without SSE4.1 (about half of
// this file's time, for a few thousand weights an image); these give the same values from a
// truncating conversion, for the magnitudes here (under 2^52).

/// `v.round()` (half away from zero).
fn round(v: f64) -> f64 {
    let t = v as i64 as f64;
    let frac = v - t;
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

/// `v.floor()`, saturated to `0..` as a pixel index.
fn floor_index(v: f64) -> usize {
    if v <= 0.0 || v.is_nan() { 0 } else { v as usize }
}

/// `v.ceil()`, saturated to `0..` as a pixel index.
fn ceil_index(v: f64) -> usize {
    if v <= 0.0 || v.is_nan() {
        return 0;
    }
    let t = v as usize;
    if (t as f64) < v { t + 1 } else { t }
}

impl Taps {
    /// Sets the taps to resize `in0..in1` (fractional, of a row of `in_size` pixels) to
    /// `out_size` pixels; empty when a size is 0 or the span is not positive.
    pub fn bilinear(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        self.starts.clear();
        self.weights.clear();
        self.sizes.clear();
        self.exact.clear();
        (self.window, self.precision, self.first, self.end) = (0, 0, 0, 0);
        let scale = (in1 - in0) / out_size as f64;
        if in_size == 0 || out_size == 0 || scale.is_nan() || scale <= 0.0 {
            return;
        }
        let filter_scale = scale.max(1.0);
        let radius = filter_scale;
        let window = radius.ceil() as usize * 2 + 1;
        let recip = 1.0 / filter_scale;
        for out_x in 0..out_size {
            let in_center = in0 + (out_x as f64 + 0.5) * scale;
            // Saturating, as the crate's `floor().max(0.) as u32` and `ceil().min(size) as u32`.
            let x_min = floor_index(in_center - radius);
            let x_max = ceil_index(in_center + radius).min(in_size).max(x_min);
            let here = self.exact.len();
            let center = in_center - 0.5;
            let (mut start, mut end) = (x_min, x_max);
            let mut sum = 0.0;
            for x in x_min..x_max {
                let w = triangle((x as f64 - center) * recip);
                if x == start && w == 0.0 {
                    start += 1;
                } else {
                    self.exact.push(w);
                    sum += w;
                }
            }
            for &w in self.exact[here..].iter().rev() {
                if end <= start || w != 0.0 {
                    break;
                }
                end -= 1;
            }
            if sum != 0.0 {
                self.exact[here..].iter_mut().for_each(|w| *w /= sum);
            }
            self.exact.resize(here + window, 0.0);
            self.starts.push(start);
            self.sizes.push(end.saturating_sub(start).min(window));
        }
        let largest = self.exact.iter().copied().fold(0.0, f64::max);
        let mut precision = 0;
        for p in 0..PRECISION_BITS {
            precision = p;
            if round(largest * (1u64 << (p + 1)) as f64) as i64 >= 1 << MAX_WEIGHT_BITS {
                break;
            }
        }
        let scale = (1u64 << precision) as f64;
        self.weights.extend(self.exact.iter().map(|&w| round(w * scale) as i16));
        self.window = window;
        self.precision = precision;
        let reads = self.starts.iter().zip(&self.sizes).filter(|&(_, &size)| size > 0);
        self.first = reads.clone().map(|(&s, _)| s).min().unwrap_or(0);
        self.end = reads.map(|(&s, &size)| s + size).max().unwrap_or(0).max(self.first);
        self.starts.iter_mut().for_each(|s| *s = s.saturating_sub(self.first));
    }

    /// Output pixels.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether there are no output pixels.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The first source pixel any output reads: the rows given to the pass start here.
    pub fn first(&self) -> usize {
        self.first
    }

    /// Source pixels from [`Taps::first`] to one past the last any output reads.
    pub fn source_width(&self) -> usize {
        self.end - self.first
    }

    /// Fractional bits of the weights.
    pub fn precision(&self) -> u32 {
        self.precision
    }

    /// The most weights any output pixel has.
    pub fn most(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Output pixel `i`'s first source pixel (from [`Taps::first`]) and its weights.
    pub fn of(&self, i: usize) -> (usize, &[i16]) {
        (self.starts[i], &self.weights[i * self.window..][..self.sizes[i]])
    }

    /// Resamples one RGB row (from [`Taps::first`]) into `dst`, one pixel at a time.
    pub fn resample_row(&self, src: &[u8], dst: &mut [u8]) {
        let half = (1i32 << self.precision) >> 1;
        for (i, out) in dst.chunks_exact_mut(3).enumerate().take(self.len()) {
            let (start, weights) = self.of(i);
            let mut sums = [half; 3];
            for (k, &w) in weights.iter().enumerate() {
                let pixel = &src[(start + k) * 3..][..3];
                for (sum, &v) in sums.iter_mut().zip(pixel) {
                    *sum += i32::from(w) * i32::from(v);
                }
            }
            for (o, sum) in out.iter_mut().zip(sums) {
                *o = (sum >> self.precision).clamp(0, 255) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversions_give_libms_values() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut values = vec![
            0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            0.49999999999999994,
            1e-300,
            3.0,
            16384.0,
            22.999_999_999_999_996,
        ];
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 11) as f64 / (1u64 << 53) as f64;
            values.extend([v, v * 2.0, v * 40_000.0, (v * 64.0).floor() / 4.0, -v * 300.0]);
        }
        for v in values {
            assert_eq!(round(v), v.round(), "round({v:e})");
            assert_eq!(floor_index(v), v.floor().max(0.0) as usize, "floor({v:e})");
            assert_eq!(ceil_index(v), v.ceil().max(0.0) as usize, "ceil({v:e})");
        }
    }
}
