//! The share of a task's images its consumer makes (placement of the image run on trainer
//! hosts, `Lease.client_image_share`).
//!
//! The share is spread over the split's elements by their index: element `i` is planned when
//! `⌊(i + 1)·s⌋ > ⌊i·s⌋`, so any run of `n` consecutive elements holds `⌊n·s⌋` or `⌈n·s⌉`
//! planned ones. A consumer that makes a share of every split's images works at an even pace;
//! one given whole splits (a share of the leases) works in bursts of a split each, which its
//! host's idle figure, sampled between heartbeats, sees as alternating idle and busy intervals.
//! Which elements are planned never changes the bytes: a planned image is made from the same
//! plan with the same code.

/// A share of a task's images, in [`ClientShare::PARTS`]ths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClientShare(u16);

impl ClientShare {
    /// The resolution of a share.
    pub const PARTS: u16 = 4096;
    /// No image: the worker makes every one.
    pub const NONE: ClientShare = ClientShare(0);
    /// Every image the worker can plan.
    pub const ALL: ClientShare = ClientShare(ClientShare::PARTS);

    /// The share nearest `fraction` (clamped to 0..=1); a positive fraction, however small,
    /// is at least one part, and NaN is none.
    pub fn of(fraction: f32) -> ClientShare {
        if fraction.is_nan() || fraction <= 0.0 {
            return ClientShare::NONE;
        }
        let parts = (fraction.min(1.0) * f32::from(ClientShare::PARTS)).round();
        // Within 1..=PARTS after the clamp and the rounding.
        ClientShare((parts as u16).clamp(1, ClientShare::PARTS))
    }

    /// Whether the consumer makes none of the images.
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The share as a fraction.
    pub fn fraction(self) -> f64 {
        f64::from(self.0) / f64::from(ClientShare::PARTS)
    }

    /// Whether element `index` of the split is among the consumer's images.
    pub fn marks(self, index: u64) -> bool {
        let (parts, whole) = (u64::from(self.0), u64::from(ClientShare::PARTS));
        // `⌊(i+1)·s⌋ > ⌊i·s⌋` with `s = parts / whole`: the remainder of `i·parts` over
        // `whole`, plus `parts`, reaches `whole`. Taken modulo `whole` first, nothing overflows.
        (index % whole * parts % whole) + parts >= whole
    }
}

#[cfg(test)]
mod tests {
    use super::ClientShare;

    #[test]
    fn fractions_map_to_parts() {
        assert_eq!(ClientShare::of(0.0), ClientShare::NONE);
        assert_eq!(ClientShare::of(-1.0), ClientShare::NONE);
        assert_eq!(ClientShare::of(f32::NAN), ClientShare::NONE);
        assert_eq!(ClientShare::of(1.0), ClientShare::ALL);
        assert_eq!(ClientShare::of(7.5), ClientShare::ALL);
        assert_eq!(ClientShare::of(f32::INFINITY), ClientShare::ALL);
        assert_eq!(ClientShare::of(1e-9), ClientShare(1), "a positive share is at least one part");
        assert_eq!(ClientShare::of(0.25).fraction(), 0.25);
    }

    #[test]
    fn marks_spread_evenly_over_any_run_of_elements() {
        for share in [0.001, 0.1, 0.25, 1.0 / 3.0, 0.5, 0.7, 0.999, 1.0] {
            let s = ClientShare::of(share);
            let exact = s.fraction();
            for start in [0u64, 1, 17, 4095, 4096, 1 << 40, u64::MAX - 300] {
                for n in [1u64, 7, 64, 128, 256] {
                    let marked = (start..start + n).filter(|&i| s.marks(i)).count() as f64;
                    let want = n as f64 * exact;
                    assert!(
                        marked >= want.floor() - 1e-9 && marked <= want.ceil() + 1e-9,
                        "share {share}: {marked} of {n} from {start}, want {want}"
                    );
                }
            }
        }
        assert!((0..1000).all(|i| ClientShare::ALL.marks(i)));
        assert!((0..1000).all(|i| !ClientShare::NONE.marks(i)));
    }
}
