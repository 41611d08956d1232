//! Placement of the image run: what share of a job's images its trainers' hosts make, rather
//! than the workers.
//!
//! A pipeline that ends in a fused image run (decode, crop or resize, flip) can have its
//! consumers make the images: the workers plan each one from its JPEG header and send the plan
//! with the JPEG, and the client executes the plan with the workers' own code (the same bytes).
//! The decode is most of an image pipeline's CPU, so a trainer's idle cores add to the workers'
//! (Pecan, ATC'24). The unit is a lease: the dispatcher marks a share of a job's leases for its
//! clients.
//!
//! The rule, per job, at most once every [`IMAGE_STEP_MS`], from its consumers' heartbeats:
//! - a consumer that does not execute plans, or asks for none, keeps every image on the
//!   workers; when every consumer asks for all of them, they all go to the clients;
//! - otherwise the share follows the hosts' idle cores (which count what the clients make
//!   already): up by [`IMAGE_SHARE_STEP`] while every host keeps more than the normalization's
//!   reserve plus [`IMAGE_ROOM_CORES`] idle, down by twice that as soon as one keeps less than
//!   the reserve plus [`IMAGE_BACKOFF_CORES`], so that the hosts stay above the point where the
//!   final normalization would move to the workers;
//! - a host that cannot measure its idle cores gets none: images are not moved blind;
//! - while the final normalization runs on the workers (the hosts are busy), none.

use crate::placement::{HostLoad, Place, RESERVE_CORES};

/// How much the share moves in one step up (down moves twice as far).
pub const IMAGE_SHARE_STEP: f64 = 0.125;
/// Idle cores above the reserve every host must keep for the share to grow.
pub const IMAGE_ROOM_CORES: f64 = 1.0;
/// Idle cores above the reserve below which a host gives images back.
pub const IMAGE_BACKOFF_CORES: f64 = 0.5;
/// Least time between two steps of a job's share: a step shows in the hosts' idle cores only
/// once the leases it marked are computed and their parts made, a second or so later.
pub const IMAGE_STEP_MS: u64 = 2_000;

/// Where a consumer wants the images made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ImageWish {
    /// Its client cannot execute plans.
    #[default]
    Unsupported,
    /// As the rule decides.
    Auto,
    /// All on its host.
    Always,
    /// All on the workers.
    Never,
}

/// The next share of a job's images its consumers' hosts make, from `current`, the consumers'
/// wishes and loads, and where the final normalization runs. See the module's rule.
pub fn image_share(current: f64, normalization: Place, consumers: &[(ImageWish, HostLoad)]) -> f64 {
    if consumers.is_empty()
        || consumers.iter().any(|(w, _)| matches!(w, ImageWish::Unsupported | ImageWish::Never))
    {
        return 0.0;
    }
    if consumers.iter().all(|(w, _)| *w == ImageWish::Always) {
        return 1.0;
    }
    if normalization == Place::Workers {
        return 0.0;
    }
    let current = if current.is_finite() { current.clamp(0.0, 1.0) } else { 0.0 };
    let mut least = f64::INFINITY;
    for (_, load) in consumers {
        match load.idle_cores.filter(|i| i.is_finite()) {
            Some(idle) => least = least.min(idle),
            None => return 0.0,
        }
    }
    if least >= RESERVE_CORES + IMAGE_ROOM_CORES {
        (current + IMAGE_SHARE_STEP).min(1.0)
    } else if least < RESERVE_CORES + IMAGE_BACKOFF_CORES {
        (current - 2.0 * IMAGE_SHARE_STEP).max(0.0)
    } else {
        current
    }
}

/// Marks leases at a share: each lease adds the share to a credit, and takes a mark when the
/// credit reaches a whole one, so that marks spread evenly over the leases.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShareMarks {
    credit: f64,
}

impl ShareMarks {
    /// Whether the next lease is marked, at `share` (0 to 1).
    pub fn next(&mut self, share: f64) -> bool {
        if share.is_nan() || share <= 0.0 {
            self.credit = 0.0;
            return false;
        }
        self.credit += share.min(1.0);
        if self.credit >= 1.0 - 1e-9 {
            self.credit = (self.credit - 1.0).max(0.0);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(idle: f64) -> HostLoad {
        HostLoad { idle_cores: Some(idle), last_finish_cores: None }
    }

    #[test]
    fn the_share_grows_with_room_holds_near_the_edge_and_backs_off_fast() {
        let auto = |idle| [(ImageWish::Auto, load(idle))];
        assert_eq!(image_share(0.0, Place::Client, &auto(2.0)), 0.125);
        assert_eq!(image_share(0.95, Place::Client, &auto(2.0)), 1.0);
        assert_eq!(image_share(0.5, Place::Client, &auto(1.2)), 0.5, "between the marks: held");
        assert_eq!(image_share(0.5, Place::Client, &auto(0.9)), 0.25);
        assert_eq!(image_share(0.1, Place::Client, &auto(0.0)), 0.0);
    }

    #[test]
    fn every_consumer_must_have_room() {
        let two = [(ImageWish::Auto, load(3.0)), (ImageWish::Auto, load(0.7))];
        assert_eq!(image_share(0.5, Place::Client, &two), 0.25);
        let unmeasured = [(ImageWish::Auto, load(3.0)), (ImageWish::Auto, HostLoad::default())];
        assert_eq!(image_share(0.5, Place::Client, &unmeasured), 0.0, "not moved blind");
    }

    #[test]
    fn wishes_and_a_busy_normalization_decide_before_the_loads() {
        let idle = load(8.0);
        assert_eq!(image_share(0.5, Place::Client, &[(ImageWish::Unsupported, idle)]), 0.0);
        assert_eq!(
            image_share(0.5, Place::Client, &[(ImageWish::Auto, idle), (ImageWish::Never, idle)]),
            0.0
        );
        assert_eq!(image_share(0.0, Place::Workers, &[(ImageWish::Always, load(0.0))]), 1.0);
        assert_eq!(image_share(0.5, Place::Workers, &[(ImageWish::Auto, idle)]), 0.0);
        assert_eq!(image_share(0.5, Place::Client, &[]), 0.0);
        assert_eq!(image_share(f64::NAN, Place::Client, &[(ImageWish::Auto, idle)]), 0.125);
    }

    #[test]
    fn marks_spread_evenly_at_the_share() {
        let mut marks = ShareMarks::default();
        let marked: Vec<bool> = (0..8).map(|_| marks.next(0.25)).collect();
        assert_eq!(marked, [false, false, false, true, false, false, false, true]);
        assert!((0..5).all(|_| marks.next(1.0)));
        assert!((0..5).all(|_| !marks.next(0.0)));
        let mut marks = ShareMarks::default();
        assert_eq!((0..1000).filter(|_| marks.next(0.3)).count(), 300);
        assert!(!marks.next(f64::NAN));
    }
}
