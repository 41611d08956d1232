//! The closed loop: what an epoch's measured time says about the profile's figures.
//!
//! A profile is measured once, on a sample, possibly while the machine does other work. At each
//! epoch boundary the caller compares the epoch's measured seconds with those predicted for what
//! the epoch did (computing, writing or reading) and, when they differ by more than
//! [`TOLERANCE`], corrects the figures the prediction was built from and decides again.
//!
//! The rule ([`Corrections::observe`]): the measured seconds replace the predicted ones of the
//! action taken, by scaling every figure that action's prediction is built from by measured over
//! predicted seconds, so that the model predicts the measured time for it:
//! - computing: the CPU time per element of the whole pipeline;
//! - writing: that CPU time, encoding and the store's write time per byte: the measurement does
//!   not say which part was off, so all take the same error;
//! - reading: the store's read time per byte, decoding and the stages after the cut.
//!
//! Figures no observed action uses keep their profiled (or earlier corrected) values: a slow
//! computing epoch says nothing about the store's throughput.

use super::model::Model;
use super::{Action, CacheDecision, CacheInputs, Predicted};
use serde::{Deserialize, Serialize};

/// Measured seconds may differ from predicted ones by this share of the prediction before the
/// policy decides again.
pub const TOLERANCE: f64 = 0.25;

/// The largest correction one epoch applies (either way): a factor beyond it is a glitch (a
/// stalled epoch, a clock jump), not a measurement.
pub const MOST: f64 = 100.0;

/// What an epoch did, as measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observed {
    /// Its splits ran every stage from the source.
    Compute,
    /// Some of its splits were computed and written to the entry.
    Write,
    /// Most of its splits were read from the entry.
    Read,
}

impl Observed {
    /// `compute`, `write` or `read`.
    pub fn name(self) -> &'static str {
        match self {
            Observed::Compute => "compute",
            Observed::Write => "write",
            Observed::Read => "read",
        }
    }

    /// `computing`, `writing` or `reading`.
    pub fn gerund(self) -> &'static str {
        match self {
            Observed::Compute => "computing",
            Observed::Write => "writing",
            Observed::Read => "reading",
        }
    }
}

/// Factors by which measured epochs correct the profile's figures; 1 keeps a figure as profiled.
/// Each multiplies a time: CPU seconds per element, or seconds per byte of the store.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corrections {
    /// CPU seconds per element of the whole pipeline (`compute_s_per_element`).
    pub compute: f64,
    /// Encoding seconds per element at every cut.
    pub encode: f64,
    /// The store's write time per byte (divides `write_bytes_per_s`).
    pub write: f64,
    /// The store's read time per byte (divides `read_bytes_per_s`).
    pub read: f64,
    /// Decoding seconds per element at every cut.
    pub decode: f64,
    /// Seconds per element of the stages after every cut.
    pub suffix: f64,
}

impl Default for Corrections {
    fn default() -> Corrections {
        Corrections { compute: 1.0, encode: 1.0, write: 1.0, read: 1.0, decode: 1.0, suffix: 1.0 }
    }
}

impl Corrections {
    /// Whether every figure is kept as profiled.
    pub fn is_identity(&self) -> bool {
        *self == Corrections::default()
    }

    /// An epoch that did `what` took `factor` times the predicted seconds: scales the figures
    /// its prediction is built from (see the module's rule). Returns `false`, changing nothing,
    /// for a factor that is not finite and positive; clamps it to [`MOST`] either way.
    pub fn observe(&mut self, what: Observed, factor: f64) -> bool {
        if !(factor.is_finite() && factor > 0.0) {
            return false;
        }
        let k = factor.clamp(1.0 / MOST, MOST);
        match what {
            Observed::Compute => self.compute *= k,
            Observed::Write => {
                self.compute *= k;
                self.encode *= k;
                self.write *= k;
            }
            Observed::Read => {
                self.read *= k;
                self.decode *= k;
                self.suffix *= k;
            }
        }
        true
    }

    /// `inputs` with the corrected figures.
    pub fn apply(&self, inputs: &CacheInputs) -> CacheInputs {
        let mut out = inputs.clone();
        out.compute_s_per_element *= self.compute;
        out.store.write_bytes_per_s /= self.write;
        out.store.read_bytes_per_s /= self.read;
        for b in &mut out.boundaries {
            b.encode_s_per_element *= self.encode;
            b.decode_s_per_element *= self.decode;
            b.suffix_s_per_element *= self.suffix;
        }
        out
    }
}

/// The model's rate of each kind of split for `action` under `inputs`: computing; writing the
/// cut as if nothing of it were stored yet (a split either writes or reads, and the caller
/// weighs the kinds by its own counts); reading it. Write and read rates are `None` for
/// computing, and for a cut that cannot be estimated.
pub fn rates(inputs: &CacheInputs, action_taken: Action) -> Predicted {
    let m = Model::new(inputs, inputs.store, false, None);
    let compute_only =
        Predicted { compute_items_per_s: m.compute_rate(), write_items_per_s: None, read_items_per_s: None };
    let cut = match action_taken {
        Action::Compute => return compute_only,
        Action::Write { boundary } | Action::Read { boundary } => boundary,
    };
    let Some(b) = inputs.boundaries.iter().find(|b| b.index == cut) else { return compute_only };
    let mut fresh = b.clone();
    fresh.existing_fraction = 0.0;
    if let Ok(e) = m.cut(&fresh) {
        return e.predicted;
    }
    // Writing cannot be estimated (no compute or write measurement): reading may still be.
    fresh.existing_fraction = 1.0;
    m.cut(&fresh).map_or(compute_only, |e| e.predicted)
}

/// The relative error of `measured` seconds against `predicted` ones, `(measured − predicted) /
/// predicted`; `None` unless both are finite and positive.
pub fn error(predicted: f64, measured: f64) -> Option<f64> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    (ok(predicted) && ok(measured)).then(|| (measured - predicted) / predicted)
}

/// Whether an `error` is beyond [`TOLERANCE`].
pub fn off(error: f64) -> bool {
    error.abs() > TOLERANCE
}

/// The least share of the current action's predicted time another action must save for a
/// re-decision to switch to it. Epochs are timed whole, and a short one is mostly fixed costs
/// (lease round trips, the epoch's first and last splits): a smaller predicted gain is within
/// that noise, and following it made the decision flap between reading and computing.
pub const SWITCH_MARGIN: f64 = 0.10;

/// How much `decision`'s action gains over `current`, when a re-decision would switch to it by
/// less than [`SWITCH_MARGIN`] of `current`'s predicted time: then `current` stays. `None` when
/// the decision keeps `current`, when `current` is out (excluded or not estimated), or when the
/// gain is larger.
pub fn marginal_switch(decision: &CacheDecision, current: Action) -> Option<f64> {
    if decision.action == current {
        return None;
    }
    let seconds = |action: Action| {
        decision
            .candidates
            .iter()
            .find(|c| c.action == action && c.excluded.is_none() && c.seconds > 0.0)
            .map(|c| c.seconds)
    };
    let (best, kept) = (seconds(decision.action)?, seconds(current)?);
    let gain = 1.0 - best / kept;
    (gain < SWITCH_MARGIN).then_some(gain)
}

#[cfg(test)]
mod tests {
    use super::super::{Boundary, CacheCosts, Candidate, StoreRates, decide};
    use super::*;

    #[test]
    fn a_switch_within_the_tolerance_keeps_the_current_action() {
        let candidate = |action, seconds, excluded: Option<&str>| Candidate {
            action,
            seconds,
            bytes: 0.0,
            dollars: 0.0,
            excluded: excluded.map(str::to_string),
        };
        let read = Action::Read { boundary: 4 };
        let decision = |candidates: Vec<Candidate>| CacheDecision {
            action: Action::Compute,
            predicted: Predicted {
                compute_items_per_s: 1.0,
                write_items_per_s: None,
                read_items_per_s: None,
            },
            reason: String::new(),
            candidates,
        };
        // Computing predicted 3% faster than the reading just measured: keep reading.
        let close = decision(vec![candidate(Action::Compute, 0.77, None), candidate(read, 0.79, None)]);
        let gain = marginal_switch(&close, read).expect("a marginal switch");
        assert!((gain - (1.0 - 0.77 / 0.79)).abs() < 1e-12);
        // 15% faster: switch.
        let far = decision(vec![candidate(Action::Compute, 0.85, None), candidate(read, 1.0, None)]);
        assert_eq!(marginal_switch(&far, read), None);
        // Reading is out (say the entry went incomplete): switch, however small the gain.
        let out = decision(vec![candidate(Action::Compute, 0.99, None), candidate(read, 1.0, Some("gone"))]);
        assert_eq!(marginal_switch(&out, read), None);
        // The decision keeps the action: nothing to hold.
        assert_eq!(marginal_switch(&close, Action::Compute), None);
    }

    /// Computing and writing-then-reading cut 1 predict about the same time (no gain): the
    /// prefix is cheap next to the store.
    fn no_gain() -> CacheInputs {
        CacheInputs {
            boundaries: vec![Boundary {
                index: 1,
                stage: "decode".into(),
                prefix_s_per_element: 0.003,
                suffix_s_per_element: 0.001,
                bytes_per_element: 4e5,
                encode_s_per_element: 0.0005,
                decode_s_per_element: 0.0005,
                existing_fraction: 0.0,
            }],
            compute_s_per_element: 0.004,
            cores: 4.0,
            readers: 1.0,
            elements_per_epoch: 10_000,
            remaining_epochs: 3,
            store: StoreRates { read_bytes_per_s: 5e8, write_bytes_per_s: 5e8 },
            costs: CacheCosts { time_per_hour: 0.0, storage_per_gb_month: 0.0, retention_hours: 0.0 },
            max_bytes: None,
        }
    }

    #[test]
    fn a_slower_computing_epoch_makes_the_cache_pay() {
        let inputs = no_gain();
        assert_eq!(decide(&inputs).action, Action::Compute, "{}", decide(&inputs).reason);
        let before = rates(&inputs, Action::Compute);
        let mut c = Corrections::default();
        assert!(c.observe(Observed::Compute, 3.0));
        let corrected = c.apply(&inputs);
        let after = rates(&corrected, Action::Compute);
        // The model now predicts the measured time for what was observed...
        assert!((before.compute_items_per_s / after.compute_items_per_s - 3.0).abs() < 1e-9);
        // ...and keeps the store's figures, so reading the cut now beats computing.
        let read = rates(&corrected, Action::Write { boundary: 1 }).read_items_per_s;
        assert_eq!(read, rates(&inputs, Action::Write { boundary: 1 }).read_items_per_s);
        assert_eq!(decide(&corrected).action, Action::Write { boundary: 1 });
    }

    #[test]
    fn each_observation_scales_only_the_figures_of_its_action() {
        let inputs = no_gain();
        let w = Action::Write { boundary: 1 };
        let mut c = Corrections::default();
        c.observe(Observed::Write, 2.0);
        let (a, b) = (rates(&inputs, w), rates(&c.apply(&inputs), w));
        let ratio = |x: Option<f64>, y: Option<f64>| x.unwrap_or(0.0) / y.unwrap_or(1.0);
        assert!((ratio(a.write_items_per_s, b.write_items_per_s) - 2.0).abs() < 1e-9);
        assert_eq!(a.read_items_per_s, b.read_items_per_s);
        let mut c = Corrections::default();
        c.observe(Observed::Read, 0.5);
        let (a, b) = (rates(&inputs, w), rates(&c.apply(&inputs), w));
        assert!((ratio(a.read_items_per_s, b.read_items_per_s) - 0.5).abs() < 1e-9);
        assert_eq!(
            (a.compute_items_per_s, a.write_items_per_s),
            (b.compute_items_per_s, b.write_items_per_s)
        );
        // Unusable factors change nothing; huge ones are clamped.
        let mut c = Corrections::default();
        assert!(!c.observe(Observed::Compute, f64::NAN) && !c.observe(Observed::Read, 0.0));
        assert!(c.is_identity());
        c.observe(Observed::Compute, 1e9);
        assert_eq!(c.compute, MOST);
    }

    #[test]
    fn the_error_is_relative_to_the_prediction() {
        assert_eq!(error(8.0, 10.0), Some(0.25));
        assert!(!off(0.25) && off(-0.26) && off(3.0));
        assert_eq!(error(0.0, 1.0), None);
        assert_eq!(error(1.0, f64::INFINITY), None);
    }
}
