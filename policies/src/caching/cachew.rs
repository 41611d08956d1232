//! Cachew's autocacher (Graur et al., USENIX ATC'22) as a baseline to compare Granary's against.
//!
//! Cachew weighs three options only: computing, caching the full output of the deterministic
//! prefix (the last cut), and caching the source (cut 0). It compares the estimated total time
//! of the remaining epochs, time only (no prices, no `spec.cache.maxBytes`, no margin), and
//! takes the fastest. Store transfers come from a static read-time table rather than
//! measurement: every read and write is assumed to run at [`STATIC_BYTES_PER_S`], whatever the
//! store's measured rates say. CPU terms are the same as in Granary's model.

use super::auto::{compute_only, cut_name};
use super::model::{Estimate, Model};
use super::{Action, Boundary, CacheDecision, CacheInputs, Candidate, StoreRates, fmt};

/// The static store throughput Cachew assumes, bytes per second (200 MB/s), for reads and writes.
pub const STATIC_BYTES_PER_S: f64 = 200e6;

/// Cachew's decision: the fastest of computing, caching the last cut and caching the source.
pub fn decide(inputs: &CacheInputs) -> CacheDecision {
    let table = StoreRates { read_bytes_per_s: STATIC_BYTES_PER_S, write_bytes_per_s: STATIC_BYTES_PER_S };
    let m = Model::new(inputs, table, false, None);
    let assumed = format!("reads assumed at {}/s", fmt::bytes(STATIC_BYTES_PER_S));
    let source = inputs.boundaries.iter().find(|b| b.index == 0);
    let full =
        inputs.boundaries.iter().max_by_key(|b| b.index).filter(|f| Some(f.index) != source.map(|s| s.index));
    let cuts: Vec<(&Boundary, Result<Estimate, String>)> =
        source.into_iter().chain(full).map(|b| (b, m.cut(b))).collect();
    let compute = match m.compute() {
        Ok(c) => c,
        Err(why) => {
            let mut candidates = vec![Candidate {
                action: Action::Compute,
                seconds: 0.0,
                bytes: 0.0,
                dollars: 0.0,
                excluded: None,
            }];
            candidates.extend(cuts.iter().map(|(b, _)| out(b, why.clone())));
            return CacheDecision {
                action: Action::Compute,
                predicted: compute_only(&m),
                reason: format!("Cachew: compute: {why}"),
                candidates,
            };
        }
    };
    let mut candidates = vec![compute.candidate(None)];
    let mut best: Option<(&Boundary, &Estimate)> = None;
    for (b, e) in &cuts {
        match e {
            Ok(e) => {
                candidates.push(e.candidate(None));
                if e.seconds < compute.seconds && best.is_none_or(|(_, x)| e.seconds < x.seconds) {
                    best = Some((b, e));
                }
            }
            Err(why) => candidates.push(out(b, why.clone())),
        }
    }
    let left =
        if m.epochs == 1 { "this last epoch".to_string() } else { format!("the {} epochs left", m.epochs) };
    let name = |b: &Boundary| {
        if b.index == 0 {
            format!("the source (cut 0, `{}`)", b.stage)
        } else {
            format!("the full output of {}", cut_name(b))
        }
    };
    let total = |s: f64| fmt::duration(s);
    match best {
        Some((b, e)) => CacheDecision {
            action: e.action,
            predicted: e.predicted,
            reason: format!(
                "Cachew: cache {}: {} for {left} vs {} computing, {assumed}",
                name(b),
                total(e.seconds),
                total(compute.seconds)
            ),
            candidates,
        },
        None => {
            let other = cuts
                .iter()
                .filter_map(|(b, e)| e.as_ref().ok().map(|e| (b, e)))
                .min_by(|x, y| x.1.seconds.total_cmp(&y.1.seconds))
                .map_or(String::new(), |(b, e)| format!(" vs {} caching {}", total(e.seconds), name(b)));
            CacheDecision {
                action: Action::Compute,
                predicted: compute.predicted,
                reason: format!("Cachew: compute: {} for {left}{other}, {assumed}", total(compute.seconds)),
                candidates,
            }
        }
    }
}

/// A cut that could not be estimated.
fn out(b: &Boundary, why: String) -> Candidate {
    let action = super::model::action(b);
    Candidate { action, seconds: 0.0, bytes: 0.0, dollars: 0.0, excluded: Some(why) }
}
