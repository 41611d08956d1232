//! What a policy answers: a target worker count, and why.

use serde::{Deserialize, Serialize};

/// Whether the target went up, down or stayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecisionKind {
    /// The target grew.
    ScaleUp,
    /// The target shrank.
    ScaleDown,
    /// The target stayed; not counted as a decision.
    Hold,
}

/// The outcome of one evaluation. Only a change of the target counts as a decision; a hold
/// carries its reason too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Worker count the pool should have.
    pub target: u32,
    /// Why, in words.
    pub reason: String,
    /// Up, down or hold.
    pub kind: DecisionKind,
}

impl Decision {
    /// Keep `target`.
    pub fn hold(target: u32, reason: impl Into<String>) -> Decision {
        Decision { target, reason: reason.into(), kind: DecisionKind::Hold }
    }

    /// Go from `from` to `to`; a hold when they are equal.
    pub fn change(from: u32, to: u32, reason: impl Into<String>) -> Decision {
        let kind = match to.cmp(&from) {
            std::cmp::Ordering::Greater => DecisionKind::ScaleUp,
            std::cmp::Ordering::Less => DecisionKind::ScaleDown,
            std::cmp::Ordering::Equal => DecisionKind::Hold,
        };
        Decision { target: to, reason: reason.into(), kind }
    }

    /// True when the target changed.
    pub fn is_change(&self) -> bool {
        self.kind != DecisionKind::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_to_the_same_count_is_a_hold() {
        assert_eq!(Decision::change(3, 3, "x").kind, DecisionKind::Hold);
        assert_eq!(Decision::change(3, 5, "x").kind, DecisionKind::ScaleUp);
        assert_eq!(Decision::change(3, 1, "x").kind, DecisionKind::ScaleDown);
        assert!(!Decision::hold(3, "x").is_change());
    }
}
