//! How many splits a worker leases ahead of its engine.
//!
//! A worker asks for its next lease when fewer splits than the target are being computed. If
//! the answer takes longer than the splits in hand take to compute, the engine runs dry and
//! waits: with short splits, or a dispatcher slow to answer under load, a fixed two ahead leaves
//! cores idle. The pacer raises the target by one each time a lease arrives to an engine that
//! ran dry while the lease was asked for (it had splits when the request went out and none when
//! the answer came; an engine idle for want of work is not counted). It lowers the target by one
//! after [`CALM_GRANTS`] leases in a row that arrived in time, never below the configured floor
//! or above [`MAX_AHEAD`]. Long splits never run dry, so they stay at the floor and leave the
//! rest of an epoch to other workers.

/// The most splits a worker leases ahead, however often its engine runs dry. Splits of a few
/// milliseconds (8 small images) against a dispatcher answering in 10-80 ms on a loaded host
/// took 30 ahead to keep one compute thread fed; 16 left it idle a tenth of the time.
pub const MAX_AHEAD: usize = 64;
/// Leases in a row that found work still in hand before the target comes down by one.
pub const CALM_GRANTS: u32 = 64;

/// The lease-ahead target and what it learned so far. The worker's lease loop owns it.
pub struct Pacer {
    floor: usize,
    target: usize,
    /// Leases in a row that arrived in time.
    calm: u32,
}

impl Pacer {
    /// A pacer that keeps at least `floor` splits leased ahead (at least 1).
    pub fn new(floor: usize) -> Pacer {
        let floor = floor.clamp(1, MAX_AHEAD);
        Pacer { floor, target: floor, calm: 0 }
    }

    /// Splits to keep leased and computing now.
    pub fn target(&self) -> usize {
        self.target
    }

    /// A lease arrived. `asked_with` splits were being computed when it was asked for, and
    /// `producing` when it arrived (0 after more than 0: the engine ran dry waiting for it).
    /// Returns the new target.
    pub fn granted(&mut self, asked_with: usize, producing: usize) -> usize {
        let before = self.target;
        if asked_with > 0 && producing == 0 {
            self.calm = 0;
            self.target = (self.target + 1).min(MAX_AHEAD);
        } else {
            self.calm += 1;
            if self.calm >= CALM_GRANTS {
                self.calm = 0;
                self.target = self.target.saturating_sub(1).max(self.floor);
            }
        }
        if self.target != before {
            tracing::debug!(from = before, to = self.target, "splits leased ahead");
        }
        self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_the_floor_and_rises_by_one_per_dry_grant_up_to_the_cap() {
        let mut p = Pacer::new(2);
        assert_eq!(p.target(), 2);
        assert_eq!(p.granted(1, 0), 3);
        assert_eq!(p.granted(1, 0), 4);
        for _ in 0..100 {
            p.granted(1, 0);
        }
        assert_eq!(p.target(), MAX_AHEAD);
    }

    #[test]
    fn comes_down_one_step_per_calm_run_never_below_the_floor() {
        let mut p = Pacer::new(2);
        for _ in 0..4 {
            p.granted(1, 0);
        }
        assert_eq!(p.target(), 6);
        for _ in 0..CALM_GRANTS - 1 {
            p.granted(1, 1);
        }
        assert_eq!(p.target(), 6, "not before a whole calm run");
        p.granted(3, 3);
        assert_eq!(p.target(), 5);
        for _ in 0..CALM_GRANTS * 20 {
            p.granted(2, 2);
        }
        assert_eq!(p.target(), 2);
    }

    #[test]
    fn a_dry_grant_restarts_the_calm_run() {
        let mut p = Pacer::new(1);
        p.granted(1, 0);
        for _ in 0..CALM_GRANTS - 1 {
            p.granted(1, 1);
        }
        p.granted(1, 0);
        for _ in 0..CALM_GRANTS - 1 {
            p.granted(1, 1);
        }
        assert_eq!(p.target(), 3);
    }

    #[test]
    fn an_engine_idle_for_want_of_work_is_not_dry() {
        let mut p = Pacer::new(2);
        assert_eq!(p.granted(0, 0), 2, "the first lease, or the first after an idle spell");
    }

    #[test]
    fn the_floor_is_kept_within_one_and_the_cap() {
        assert_eq!(Pacer::new(0).target(), 1);
        assert_eq!(Pacer::new(100).target(), MAX_AHEAD);
    }
}
