//! What the chaos tests share: a seeded generator for their fault schedules, the seed itself
//! (given, to replay a failure, or fresh from the clock), and a dispatcher started with an
//! explicit environment, so that its journal can live on the S3-compatible server.

use super::{Dispatcher, granary_bin, start_serving};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The variable that replays a chaos run: its value is the seed a failed run printed.
pub const SEED_VAR: &str = "GRANARY_CHAOS_SEED";

/// The seed of this run: `GRANARY_CHAOS_SEED` when set (a failure to parse it panics, naming the
/// variable), otherwise one drawn from the clock, so that every run explores a new schedule.
pub fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(text) => text.trim().parse().unwrap_or_else(|e| {
            panic!("{SEED_VAR}=`{text}` is not a seed: give the number a failed run printed ({e})")
        }),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

/// SplitMix64: small, fast, and the same sequence for the same seed on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// A duration of `low_ms..=high_ms` milliseconds.
    pub fn millis(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(self.between(low_ms, high_ms))
    }
}

/// `granary run MANIFEST --serve LISTEN --workers 0 --journal JOURNAL` with exactly the
/// variables `env` added (the S3 server's credentials and loopback endpoint), once it printed
/// its ready line. `JOURNAL` may be any URL the dispatcher accepts (`s3://bucket/prefix`).
pub fn start_dispatcher_env(
    manifest: &Path,
    listen: &str,
    journal: &str,
    env: &[(String, String)],
) -> Dispatcher {
    let mut command = Command::new(granary_bin());
    command
        .arg("run")
        .arg(manifest)
        .args(["--serve", listen, "--workers", "0", "--journal", journal])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    start_serving(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.between(3, 9)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(draw(7).iter().all(|n| (3..=9).contains(n)));
    }
}
