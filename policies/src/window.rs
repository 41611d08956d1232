//! A short, bounded history of one noisy, non-negative quantity, with its mean, its spread, and
//! detection of a lasting shift (which restarts the history so old samples do not drag the
//! estimate).

use std::collections::VecDeque;

/// The last `capacity` samples of a quantity.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    samples: VecDeque<f64>,
    capacity: usize,
    /// Samples that disagreed with the window, waiting for confirmation.
    outliers: Vec<f64>,
}

/// Deviation from the mean, as `|ln(sample / mean)|`, that counts as a shift, at least: a factor
/// of 1.4 either way.
const MIN_SHIFT: f64 = 0.336_472_236_621_212_9;
/// Deviation in standard deviations of one sample (relative) that counts as a shift, at least.
const SHIFT_SIGMAS: f64 = 3.0;
/// Consecutive deviating samples, on the same side, that confirm a shift.
const CONFIRM: usize = 2;

impl Window {
    /// An empty window keeping up to `capacity` samples (at least 2).
    pub(crate) fn new(capacity: usize) -> Window {
        let capacity = capacity.max(2);
        Window { samples: VecDeque::with_capacity(capacity), capacity, outliers: Vec::new() }
    }

    /// Adds a sample. Returns true when it confirmed a shift and the window restarted.
    pub(crate) fn push(&mut self, x: f64) -> bool {
        if !x.is_finite() {
            return false;
        }
        if let Some(mean) = self.mean() {
            let threshold = (SHIFT_SIGMAS * self.cv()).max(MIN_SHIFT);
            let deviation = x - mean;
            let log_ratio = if x > 0.0 && mean > 0.0 { (x / mean).ln().abs() } else { f64::INFINITY };
            let shifted = if mean > 0.0 { log_ratio > threshold } else { deviation.abs() > 0.0 };
            if self.samples.len() >= 2 && shifted {
                let same_side =
                    self.outliers.last().is_none_or(|o| (o - mean).signum() == deviation.signum());
                if !same_side {
                    self.outliers.clear();
                }
                self.outliers.push(x);
                if self.outliers.len() >= CONFIRM {
                    self.samples.clear();
                    self.samples.extend(self.outliers.drain(..));
                    return true;
                }
                return false;
            }
        }
        self.outliers.clear();
        if self.samples.len() >= self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(x);
        false
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.samples.clear();
        self.outliers.clear();
    }

    /// Number of samples held.
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    /// Mean of the samples.
    pub(crate) fn mean(&self) -> Option<f64> {
        (!self.samples.is_empty()).then(|| self.samples.iter().sum::<f64>() / self.samples.len() as f64)
    }

    /// The smallest of the last `k` samples, when there are at least `k`.
    pub(crate) fn recent_min(&self, k: usize) -> Option<f64> {
        let n = self.samples.len();
        (k > 0 && n >= k).then(|| self.samples.iter().skip(n - k).copied().fold(f64::INFINITY, f64::min))
    }

    /// The largest of the last `k` samples, when there are at least `k`.
    pub(crate) fn recent_max(&self, k: usize) -> Option<f64> {
        let n = self.samples.len();
        (k > 0 && n >= k).then(|| self.samples.iter().skip(n - k).copied().fold(f64::NEG_INFINITY, f64::max))
    }

    /// The first and the last sample.
    pub(crate) fn ends(&self) -> Option<(f64, f64)> {
        Some((*self.samples.front()?, *self.samples.back()?))
    }

    /// Coefficient of variation of one sample (standard deviation over mean); 0 with fewer than
    /// two samples or a zero mean.
    pub(crate) fn cv(&self) -> f64 {
        let n = self.samples.len();
        let Some(mean) = self.mean() else { return 0.0 };
        if n < 2 || mean == 0.0 {
            return 0.0;
        }
        let var = self.samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let cv = var.sqrt() / mean.abs();
        if cv.is_finite() { cv } else { 0.0 }
    }

    /// Relative standard error of the mean.
    pub(crate) fn relative_error(&self) -> f64 {
        let n = self.samples.len().max(1) as f64;
        self.cv() / n.sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_samples() {
        let mut w = Window::new(3);
        for x in [1.0, 2.0, 3.0, 4.0] {
            w.push(x * 0.01 + 10.0);
        }
        assert_eq!(w.len(), 3);
        assert!((w.mean().unwrap_or(0.0) - 10.03).abs() < 1e-9);
    }

    #[test]
    fn a_confirmed_shift_restarts_the_window() {
        let mut w = Window::new(6);
        for x in [10.0, 10.5, 9.5, 10.0] {
            assert!(!w.push(x));
        }
        assert!(!w.push(20.0), "one outlier is not a shift");
        assert!(w.push(21.0));
        assert_eq!(w.len(), 2);
        assert!((w.mean().unwrap_or(0.0) - 20.5).abs() < 1e-9);
    }

    #[test]
    fn outliers_on_both_sides_are_noise() {
        let mut w = Window::new(6);
        for x in [10.0, 10.5, 9.5, 10.0] {
            w.push(x);
        }
        assert!(!w.push(20.0));
        assert!(!w.push(1.0));
        assert_eq!(w.len(), 4);
    }
}
