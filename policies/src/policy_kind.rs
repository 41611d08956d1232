//! The catalog of policies this crate implements, by name.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cachew::CachewPolicy;
use crate::error::Error;
use crate::granary::GranaryPolicy;
use crate::hpa::HpaPolicy;
use crate::policy::Policy;

/// The policies this crate implements, with their default settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// Granary's model-based autoscaler.
    Granary,
    /// Cachew's incremental rule (the baseline from the Cachew paper).
    Cachew,
    /// Kubernetes HPA at 80% CPU (Cachew's own baseline).
    Hpa,
}

impl PolicyKind {
    /// All three, in report order.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Granary, PolicyKind::Cachew, PolicyKind::Hpa];

    /// The policy with default settings.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::Granary => Box::new(GranaryPolicy::default()),
            PolicyKind::Cachew => Box::new(CachewPolicy::default()),
            PolicyKind::Hpa => Box::new(HpaPolicy::default()),
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Granary => "granary",
            PolicyKind::Cachew => "cachew",
            PolicyKind::Hpa => "hpa",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| Error::UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>().ok(), Some(kind));
        }
        assert!("k8s".parse::<PolicyKind>().is_err());
    }
}
