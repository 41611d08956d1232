//! The rules that rule a cache option out before the cheapest one is chosen, and their words.

use super::Action;
use super::fmt;
use super::model::{Estimate, Model};

/// A cache option must beat computing by this share of the total (seconds, or dollars when
/// priced), so that measurement noise cannot make the policy cache.
pub const MARGIN: f64 = 0.05;

/// Why a cache option is out.
#[derive(Clone, Debug)]
pub(super) enum Out {
    /// A measurement or an estimate cannot be used; the words say which.
    Unusable(String),
    /// The entry would take more than `spec.cache.maxBytes`.
    OverBudget { need: f64, max: u64 },
    /// Only this epoch is left and writing does not gain the margin.
    LastEpoch { cost: f64, compute: f64 },
    /// Reading the entry is no faster than computing (elements per second).
    Slower { read: f64, compute: f64 },
    /// The option does not beat computing by the margin; `storage` is its storage dollars.
    NoGain { cost: f64, compute: f64, storage: f64 },
}

/// Why `est` is out against computing (`compute`), if it is.
pub(super) fn judge(m: &Model, est: &Estimate, compute: &Estimate) -> Option<Out> {
    let write = matches!(est.action, Action::Write { .. });
    if let (true, Some(max)) = (write, m.max_bytes)
        && est.entry_bytes > max as f64
    {
        return Some(Out::OverBudget { need: est.entry_bytes, max });
    }
    let (cost, base) = (m.key(est), m.key(compute));
    let gains = cost <= (1.0 - MARGIN) * base;
    if write && m.epochs == 1 && !gains {
        return Some(Out::LastEpoch { cost, compute: base });
    }
    let compute_rate = compute.predicted.compute_items_per_s;
    let read_rate = est.predicted.read_items_per_s.unwrap_or(0.0);
    if read_rate <= compute_rate {
        return Some(Out::Slower { read: read_rate, compute: compute_rate });
    }
    if !gains {
        return Some(Out::NoGain { cost, compute: base, storage: m.storage_dollars(est.bytes) });
    }
    None
}

impl Out {
    /// The reason in words, with its figures.
    pub(super) fn text(&self, m: &Model) -> String {
        match self {
            Out::Unusable(why) => why.clone(),
            Out::OverBudget { need, max } => {
                format!("needs {}, over spec.cache.maxBytes {}", fmt::bytes(*need), fmt::bytes(*max as f64))
            }
            Out::LastEpoch { cost, compute } => format!(
                "only this epoch is left, so writing cannot pay back within this run: {} vs {} computing",
                m.key_text(*cost),
                m.key_text(*compute)
            ),
            Out::Slower { read, compute } => format!(
                "reading is slower than computing: {} items/s vs {} computing",
                fmt::rate(*read),
                fmt::rate(*compute)
            ),
            Out::NoGain { cost, compute, storage } => {
                let saved = 1.0 - cost / compute;
                let storage = if *storage > 0.0 {
                    format!(" ({} of it storage)", fmt::dollars(*storage))
                } else {
                    String::new()
                };
                if saved > 0.0 {
                    format!(
                        "gains only {:.1}% over computing ({}{storage} vs {}), under the {} margin",
                        saved * 100.0,
                        m.key_text(*cost),
                        m.key_text(*compute),
                        fmt::percent(MARGIN)
                    )
                } else {
                    format!("no gain: {}{storage} vs {} computing", m.key_text(*cost), m.key_text(*compute))
                }
            }
        }
    }
}
