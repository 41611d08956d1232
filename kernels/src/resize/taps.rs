//! One axis's bilinear taps, as `fast_image_resize` 6 computes them (its
//! `precompute_coefficients` with the adaptive kernel size, then its 16-bit normalizer).

/// The largest precision a sum may take: 32 bits, less 8 for the result and 2 for the overflow
/// of filters with negative lobes.
const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Bits of an `i16` weight's magnitude.
const MAX_WEIGHT_BITS: u32 = 16 - 1;

/// The taps of one axis: for each output pixel, the first source pixel it reads and its
/// weights, fixed-point with [`Taps::precision`] fractional bits.
#[derive(Clone, Debug, Default)]
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

/// Taps are equal when they resample alike: the buffer kept for reuse does not count.
impl PartialEq for Taps {
    fn eq(&self, other: &Taps) -> bool {
        self.outcome() == other.outcome()
    }
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
    // Without branches: the fractions of weights are as good as random, and a branch on them
    // mispredicts one time in two.
    let t = v as i64 as f64;
    let frac = v - t;
    t + f64::from(u8::from(frac >= 0.5)) - f64::from(u8::from(frac <= -0.5))
}

// The indices go through `i64`: one instruction each way on x86-64, where `usize` takes a
// branch and a fix-up for values over `i64::MAX` (no pixel index is).

/// `v.floor()`, saturated to `0..` as a pixel index.
fn floor_index(v: f64) -> usize {
    if v <= 0.0 || v.is_nan() { 0 } else { v as i64 as usize }
}

/// `v.ceil()`, saturated to `0..` as a pixel index.
fn ceil_index(v: f64) -> usize {
    if v <= 0.0 || v.is_nan() {
        return 0;
    }
    let t = v as i64;
    (if (t as f64) < v { t + 1 } else { t }) as usize
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
        // `ceil(c + r) − floor(c − r) < 2r + 2`: no output reads more pixels than this.
        let window = ceil_index(radius) * 2 + 1;
        let recip = 1.0 / filter_scale;
        // Each output's weights go straight into its slot of `window`: no pushes, no zero-fill
        // per output.
        self.exact.resize(out_size * window, 0.0);
        let mut largest = 0.0f64;
        for (out_x, slot) in self.exact.chunks_exact_mut(window).enumerate() {
            let in_center = in0 + (out_x as f64 + 0.5) * scale;
            // Saturating, as the crate's `floor().max(0.) as u32` and `ceil().min(size) as u32`.
            let x_min = floor_index(in_center - radius);
            let x_max = ceil_index(in_center + radius).min(in_size).max(x_min);
            let center = in_center - 0.5;
            // Zeros before the first weight are skipped, the rest kept (the crate's order, so
            // that the sum, and so every weight, is its to the last bit).
            let (mut start, mut kept, mut sum) = (x_min, 0, 0.0);
            for x in x_min..x_max {
                let w = triangle((x as i64 as f64 - center) * recip);
                if x == start && w == 0.0 {
                    start += 1;
                } else {
                    if let Some(at) = slot.get_mut(kept) {
                        *at = w;
                    }
                    kept += 1;
                    sum += w;
                }
            }
            let kept = &mut slot[..kept.min(window)];
            let zeros_after = kept.iter().rev().take_while(|&&w| w == 0.0).count();
            let end = x_max.saturating_sub(zeros_after).max(start);
            if sum != 0.0 {
                for w in kept.iter_mut() {
                    *w /= sum;
                    // `f64::max`'s care for NaN would chain the weights one after another.
                    if *w > largest {
                        largest = *w;
                    }
                }
            }
            self.starts.push(start);
            self.sizes.push((end - start).min(window));
        }
        let mut precision = 0;
        for p in 0..PRECISION_BITS {
            precision = p;
            if round(largest * (1u64 << (p + 1)) as f64) as i64 >= 1 << MAX_WEIGHT_BITS {
                break;
            }
        }
        let scale = (1u64 << precision) as f64;
        // Only the weights in use: every slot after them holds a zero.
        self.weights.resize(out_size * window, 0);
        let rounded = self.weights.chunks_exact_mut(window).zip(self.exact.chunks_exact(window));
        for ((weights, exact), &size) in rounded.zip(&self.sizes) {
            for (w, &e) in weights.iter_mut().zip(exact).take(size) {
                *w = round(e * scale) as i16;
            }
        }
        self.window = window;
        self.precision = precision;
        let reads = self.starts.iter().zip(&self.sizes).filter(|&(_, &size)| size > 0);
        self.first = reads.clone().map(|(&s, _)| s).min().unwrap_or(0);
        self.end = reads.map(|(&s, &size)| s + size).max().unwrap_or(0).max(self.first);
        self.starts.iter_mut().for_each(|s| *s = s.saturating_sub(self.first));
    }

    /// Everything but the buffer kept for reuse.
    fn outcome(&self) -> (&[usize], &[i16], &[usize], [usize; 3], u32) {
        (&self.starts, &self.weights, &self.sizes, [self.window, self.first, self.end], self.precision)
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
pub(super) mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_taps_are_the_crates_to_the_last_bit() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        // One `Taps` reused throughout, as a resize reuses it image after image.
        let (mut taps, mut expected) = (Taps::default(), Taps::default());
        for case in 0..20_000 {
            let in_size = 1 + (next() * 1200.0) as usize;
            let out_size = 1 + (next() * 400.0) as usize;
            let (in0, in1) = match case % 4 {
                // Whole pixels, as a resize of the whole image or a center crop.
                0 => {
                    let a = (next() * in_size as f64 / 2.0).floor();
                    (a, (a + 1.0 + (next() * (in_size as f64 - a - 1.0)).floor()).min(in_size as f64))
                }
                // Past the edges, and empty or reversed spans.
                1 => (next() * 4.0 - 2.0, next() * in_size as f64 * 1.1),
                _ => {
                    let a = next() * in_size as f64 * 0.6;
                    (a, a + next() * (in_size as f64 - a))
                }
            };
            taps.bilinear(in_size, in0, in1, out_size);
            reference::bilinear(&mut expected, in_size, in0, in1, out_size);
            assert_eq!(taps.outcome(), expected.outcome(), "{in0}..{in1} of {in_size} → {out_size}");
        }
    }

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
