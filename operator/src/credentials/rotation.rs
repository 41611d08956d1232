//! The CA's rotation, as a pure function of what its Secret holds and the time. Leaves are
//! issued by the current CA; every component trusts a bundle. A third of the way before the
//! current CA expires, a next CA is made and added to the bundle (so every Secret that leaves
//! and trainers read carries it long before it issues anything); a sixth of the way before, the
//! next CA becomes current and leaves are issued again from it, while the old one stays in the
//! bundle until it expires.

use granary_security::authority::validity;
use std::time::Duration;

/// How long a CA the operator makes is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A CA certificate and its key, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedCert {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

/// What the CA Secret holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaSet {
    /// The CA that issues leaves (`tls.crt`, `tls.key`: cert-manager's layout for a CA).
    pub current: KeyedCert,
    /// The CA that will issue them next, already trusted (`next.crt`, `next.key`).
    pub next: Option<KeyedCert>,
    /// Every CA certificate trusted (`ca.crt`).
    pub trust: String,
}

/// What to do with a CA set at a given time.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Keep,
    /// Make a next CA and trust it.
    Stage,
    /// Issue from the next CA.
    Promote,
}

/// The step due at `now` (Unix seconds). A current CA that cannot be read is left for the
/// caller to report.
pub fn due(set: &CaSet, now: i64) -> Step {
    let Some((from, until)) = validity(&set.current.cert) else { return Step::Keep };
    let life = (until - from).max(1);
    let left = until - now;
    match &set.next {
        Some(_) if left < life / 6 => Step::Promote,
        None if left < life / 3 => Step::Stage,
        _ => Step::Keep,
    }
}

/// The set after `step`; `make` makes a fresh CA when one is needed.
pub fn apply<E>(
    set: &CaSet,
    step: Step,
    now: i64,
    make: impl FnOnce() -> Result<KeyedCert, E>,
) -> Result<Option<CaSet>, E> {
    let next = match step {
        Step::Keep => return Ok(None),
        Step::Stage => {
            let next = make()?;
            CaSet { current: set.current.clone(), next: Some(next), trust: String::new() }
        }
        Step::Promote => match &set.next {
            Some(next) => CaSet { current: next.clone(), next: None, trust: String::new() },
            None => return Ok(None),
        },
    };
    let trust = bundle(&next, &set.trust, now);
    Ok(Some(CaSet { trust, ..next }))
}

/// The trust bundle of `set`: its current and next CAs, and the CAs of `earlier` that have not
/// expired at `now` (leaves they issued may still be in use), each once.
pub fn bundle(set: &CaSet, earlier: &str, now: i64) -> String {
    let mut certs: Vec<String> = vec![set.current.cert.trim().to_string()];
    certs.extend(set.next.iter().map(|n| n.cert.trim().to_string()));
    for cert in split(earlier) {
        let alive = validity(&cert).is_some_and(|(_, until)| until > now);
        if alive && !certs.contains(&cert) {
            certs.push(cert);
        }
    }
    certs.join("\n") + "\n"
}

/// The PEM certificates of a bundle, each trimmed.
fn split(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .map(str::trim)
        .filter(|c| c.starts_with("-----BEGIN CERTIFICATE-----") && c.ends_with(END))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_security::Authority;

    fn ca(name: &str, validity: Duration) -> KeyedCert {
        let a = Authority::generate(name, validity).unwrap();
        KeyedCert { cert: a.cert_pem().to_string(), key: a.key_pem() }
    }

    fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    fn fresh(validity: Duration) -> CaSet {
        let current = ca("first", validity);
        let mut set = CaSet { current, next: None, trust: String::new() };
        set.trust = bundle(&set, "", now());
        set
    }

    #[test]
    fn a_young_ca_is_kept() {
        let set = fresh(CA_VALIDITY);
        assert_eq!(due(&set, now()), Step::Keep);
        assert_eq!(apply(&set, Step::Keep, now(), || Ok::<_, ()>(ca("x", CA_VALIDITY))), Ok(None));
    }

    #[test]
    fn the_next_ca_is_trusted_before_it_issues_and_the_old_one_after() {
        let set = fresh(CA_VALIDITY);
        let year = CA_VALIDITY.as_secs() as i64;
        // Two thirds through its life and a little: stage the next CA, issuing still from the first.
        let later = now() + year * 2 / 3 + 3600;
        assert_eq!(due(&set, later), Step::Stage);
        let staged =
            apply(&set, Step::Stage, later, || Ok::<_, ()>(ca("second", CA_VALIDITY))).unwrap().unwrap();
        assert_eq!(staged.current, set.current);
        let next = staged.next.clone().unwrap();
        assert_eq!(
            split(&staged.trust),
            vec![set.current.cert.trim().to_string(), next.cert.trim().to_string()]
        );
        assert_eq!(due(&staged, later), Step::Keep, "staged, not yet promoted");
        // Five sixths through: promote; the first CA stays trusted until it expires.
        let later = now() + year * 5 / 6 + 3600;
        assert_eq!(due(&staged, later), Step::Promote);
        let promoted = apply(&staged, Step::Promote, later, || Err(())).unwrap().unwrap();
        assert_eq!(promoted.current, next);
        assert!(promoted.next.is_none());
        assert_eq!(
            split(&promoted.trust),
            vec![next.cert.trim().to_string(), set.current.cert.trim().to_string()]
        );
        // Once the first has expired it leaves the bundle.
        let after = now() + year + 7200;
        assert_eq!(split(&bundle(&promoted, &promoted.trust, after)), vec![next.cert.trim().to_string()]);
    }
}
