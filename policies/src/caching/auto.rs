//! Granary's policy (`auto`): weigh every cut of the deterministic prefix against computing and
//! choose the cheapest option that beats computing by the margin.

use super::fmt;
use super::model::{self, Estimate, Model};
use super::rules::{self, Out};
use super::{Action, Boundary, CacheDecision, CacheInputs, Candidate, Predicted};

/// One cut as weighed.
pub(super) struct Weighed<'a> {
    pub(super) boundary: &'a Boundary,
    pub(super) estimate: Result<Estimate, String>,
    pub(super) out: Option<Out>,
}

/// Computing and every cut, each with the rule that rules it out, if any.
pub(super) struct Weighing<'a> {
    pub(super) compute: Result<Estimate, String>,
    pub(super) cuts: Vec<Weighed<'a>>,
}

impl<'a> Weighing<'a> {
    /// Weighs every cut of `inputs` under the model `m`.
    pub(super) fn new(m: &Model, inputs: &'a CacheInputs) -> Weighing<'a> {
        let compute = m.compute();
        let cuts = inputs
            .boundaries
            .iter()
            .map(|boundary| {
                let estimate = m.cut(boundary);
                let out = match (&estimate, &compute) {
                    (Err(why), _) | (Ok(_), Err(why)) => Some(Out::Unusable(why.clone())),
                    (Ok(e), Ok(c)) => rules::judge(m, e, c),
                };
                Weighed { boundary, estimate, out }
            })
            .collect();
        Weighing { compute, cuts }
    }

    /// Every candidate: computing first, then each cut in order.
    pub(super) fn candidates(&self, m: &Model) -> Vec<Candidate> {
        let compute = match &self.compute {
            Ok(c) => c.candidate(None),
            Err(_) => {
                Candidate { action: Action::Compute, seconds: 0.0, bytes: 0.0, dollars: 0.0, excluded: None }
            }
        };
        let cuts = self.cuts.iter().map(|w| {
            let excluded = w.out.as_ref().map(|o| o.text(m));
            match &w.estimate {
                Ok(e) => e.candidate(excluded),
                Err(_) => Candidate {
                    action: model::action(w.boundary),
                    seconds: 0.0,
                    bytes: 0.0,
                    dollars: 0.0,
                    excluded,
                },
            }
        });
        std::iter::once(compute).chain(cuts).collect()
    }

    /// The best cut by the model's key among those `keep` accepts.
    pub(super) fn best(
        &self,
        m: &Model,
        keep: impl Fn(&Weighed<'a>) -> bool,
    ) -> Option<(&Weighed<'a>, &Estimate)> {
        let mut best: Option<(&Weighed<'a>, &Estimate)> = None;
        for w in self.cuts.iter().filter(|w| keep(w)) {
            if let Ok(e) = &w.estimate
                && best.is_none_or(|(_, b)| m.better(e, b))
            {
                best = Some((w, e));
            }
        }
        best
    }
}

/// Granary's autocaching policy (`spec.cache.policy: auto`).
///
/// Per element, with all cores (`cores`, at least 1): computing takes `t_c = compute / cores`;
/// the epoch that writes cut `k` takes `t_w = (compute + encode_k) / cores + bytes_k / write`;
/// an epoch that reads it takes `t_r = bytes_k / read + (decode_k + suffix_k) / cores`. With `N`
/// elements per epoch, `E` epochs left and a share `f` of the entry already stored, writing
/// costs `N·(f·t_r + (1−f)·t_w) + (E−1)·N·t_r`, reading a complete entry `E·N·t_r`, computing
/// `E·N·t_c`. Dollars add time at `time_per_hour` and the storage of newly written bytes over
/// the retention; without a time price, time alone decides (ties: fewer bytes).
///
/// A cut is out when its entry is over `spec.cache.maxBytes`, when reading it is no faster than
/// computing, when a measurement is unusable, or when it does not beat computing by
/// [`MARGIN`](super::MARGIN) of the total. Of the rest the cheapest wins; without one, compute.
/// Every cut is returned among the candidates with the reason it is out.
pub fn decide(inputs: &CacheInputs) -> CacheDecision {
    let m = Model::new(inputs, inputs.store, true, inputs.max_bytes);
    let weighing = Weighing::new(&m, inputs);
    let candidates = weighing.candidates(&m);
    let compute = match &weighing.compute {
        Ok(c) => c,
        Err(why) => {
            return CacheDecision {
                action: Action::Compute,
                predicted: compute_only(&m),
                reason: format!("compute: {why}"),
                candidates,
            };
        }
    };
    match weighing.best(&m, |w| w.out.is_none()) {
        Some((w, e)) => CacheDecision {
            action: e.action,
            predicted: e.predicted,
            reason: describe(&m, w.boundary, e, Some(compute)),
            candidates,
        },
        None => CacheDecision {
            action: Action::Compute,
            predicted: compute.predicted,
            reason: why_compute(&m, &weighing),
            candidates,
        },
    }
}

/// Predicted rates when computing.
pub(super) fn compute_only(m: &Model) -> Predicted {
    Predicted { compute_items_per_s: m.compute_rate(), write_items_per_s: None, read_items_per_s: None }
}

/// "`resize` (cut 2)".
pub(super) fn cut_name(b: &Boundary) -> String {
    format!("`{}` (cut {})", b.stage, b.index)
}

/// What the action at `b` does, in words, without figures.
pub(super) fn phrase(b: &Boundary, epochs: u32) -> String {
    let f = if b.existing_fraction.is_finite() { b.existing_fraction.clamp(0.0, 1.0) } else { 0.0 };
    let cut = cut_name(b);
    if f >= 1.0 {
        let when = if epochs == 1 {
            "for this last epoch".to_string()
        } else {
            format!("for the {epochs} epochs left")
        };
        return format!("read the complete entry of {cut} already in the store {when}");
    }
    let what = if f > 0.0 {
        format!(
            "write the rest of the output of `{}` (cut {}; {} already stored)",
            b.stage,
            b.index,
            fmt::percent(f)
        )
    } else {
        format!("write the output of {cut}")
    };
    match epochs.saturating_sub(1) {
        0 => format!("{what} in this last epoch"),
        k => format!("{what} this epoch and read it in {}", fmt::epochs_after(k)),
    }
}

/// The chosen (or forced) cache action in words with its figures.
pub(super) fn describe(m: &Model, b: &Boundary, e: &Estimate, compute: Option<&Estimate>) -> String {
    let mut text = phrase(b, m.epochs);
    let read = e.predicted.read_items_per_s.unwrap_or(0.0);
    text += &format!(": {} items/s reading vs {} computing", fmt::rate(read), fmt::rate(m.compute_rate()));
    if let Some(w) = e.predicted.write_items_per_s {
        text += &format!(", {} while writing", fmt::rate(w));
    }
    if let Some(c) = compute {
        text += &format!("; {} in all vs {} computing", fmt::duration(e.seconds), fmt::duration(c.seconds));
        if m.priced() {
            text += &format!(" ({} vs {})", fmt::dollars(e.dollars), fmt::dollars(c.dollars));
        }
    }
    if e.bytes > 0.0 {
        text += &format!("; entry {}", fmt::bytes(e.entry_bytes));
        if m.priced() {
            text += &format!(", {} storage", fmt::dollars(m.storage_dollars(e.bytes)));
        }
    } else {
        text += "; no new storage";
    }
    text
}

/// How close a ruled-out cut came to being chosen: it failed only the margin (3), it reads
/// faster than computing but is over budget (2), it reads slower (1), it cannot be estimated (0).
fn closeness(w: &Weighed<'_>, compute_rate: f64) -> u8 {
    match &w.out {
        None | Some(Out::NoGain { .. } | Out::LastEpoch { .. }) => 3,
        Some(Out::OverBudget { .. }) => {
            let read = w.estimate.as_ref().ok().and_then(|e| e.predicted.read_items_per_s).unwrap_or(0.0);
            if read > compute_rate { 2 } else { 1 }
        }
        Some(Out::Slower { .. }) => 1,
        Some(Out::Unusable(_)) => 0,
    }
}

/// Why computing wins, in words: the cut that came closest and what rules it out.
fn why_compute(m: &Model, weighing: &Weighing<'_>) -> String {
    let rate = m.compute_rate();
    let closest = (0..=3).rev().find_map(|r| weighing.best(m, |w| closeness(w, rate) == r));
    let Some((w, _)) = closest else {
        return match weighing.cuts.first() {
            None => "compute: the deterministic prefix has no cut to cache".to_string(),
            Some(first) => {
                let why = first.out.as_ref().map_or(String::new(), |o| o.text(m));
                format!("compute: no cut can be estimated ({}: {why})", cut_name(first.boundary))
            }
        };
    };
    let size = fmt::bytes(w.boundary.bytes_per_element);
    let name = format!("`{}`, cut {}, {size}/element", w.boundary.stage, w.boundary.index);
    match &w.out {
        Some(Out::Slower { read, compute }) => format!(
            "compute: reading the best cut ({name}) would give {} items/s vs {} computing",
            fmt::rate(*read),
            fmt::rate(*compute)
        ),
        Some(Out::LastEpoch { cost, compute }) => format!(
            "compute: only this epoch is left, so caching cannot pay back within this run (writing the best cut, {name}: {} vs {} computing)",
            m.key_text(*cost),
            m.key_text(*compute)
        ),
        Some(out) => format!("compute: the best cut ({name}) is out: {}", out.text(m)),
        None => format!("compute: the best cut ({name}) does not beat computing"),
    }
}
