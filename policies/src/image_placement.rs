//! Placement of the image run: what share of a job's images its trainers' hosts make, rather
//! than the workers.
//!
//! A pipeline that ends in a fused image run (decode, crop or resize, flip) can have its
//! consumers make the images: the workers plan each one from its JPEG header and send the plan
//! with the JPEG, and the client executes the plan with the workers' own code (the same bytes).
//! The decode is most of an image pipeline's CPU, so a trainer's idle cores add to the workers'
//! (Pecan, ATC'24). The dispatcher gives every lease the job's share, and the worker plans that
//! share of the split's images, spread over its elements; a worker that cannot (an older one) is
//! given a share of the leases instead, marked by [`ShareMarks`].
//!
//! The rule, per job, from its consumers' heartbeats:
//! - a consumer that does not execute plans, or asks for none, keeps every image on the
//!   workers; when every consumer asks for all of them, they all go to the clients;
//! - a host that cannot measure its idle cores gets none: images are not moved blind;
//! - while the final normalization runs on the workers (the hosts are busy), none;
//! - otherwise the share steers each host's idle cores (which count what its client makes
//!   already) to [`IMAGE_TARGET_IDLE_CORES`]: the normalization's reserve and a margin. Within
//!   [`IMAGE_HOLD_CORES`] of it the share holds. Off it, the share moves by the cores a host is
//!   off over the cores a whole share costs it: what its client spends finishing now over its
//!   share now, an overestimate (it counts the normalization too) that keeps the steps short.
//!   (Exact steps, from the images' cores alone, move the share faster than the workers' rate
//!   is measured: in the simulator the autoscaler then needed a third decision to settle.)
//!   Before that cost is known (no share yet), the share moves by [`IMAGE_SHARE_STEP`] up and
//!   twice that down. A step moves at least [`IMAGE_MIN_STEP`], and up at most
//!   [`IMAGE_MAX_STEP_UP`]. The host with the least room decides;
//! - a step up waits [`IMAGE_STEP_MS`] after the last move, until that move shows in the hosts'
//!   figures; a step down waits half that, unless a host is under the reserve.

use crate::placement::{HostLoad, Place, RESERVE_CORES};

/// How much the share moves in one step up before the hosts' cost is known (down moves twice
/// as far).
pub const IMAGE_SHARE_STEP: f64 = 0.125;
/// The least a step moves once the cost is known: fine enough for a host whose idle cores
/// make only a sliver of a large job's images.
pub const IMAGE_MIN_STEP: f64 = 1.0 / 32.0;
/// The most the share grows in one step.
pub const IMAGE_MAX_STEP_UP: f64 = 0.25;
/// The idle cores the share steers every host to: the reserve the final normalization keeps,
/// and half a core more for the trainer's own bursts.
pub const IMAGE_TARGET_IDLE_CORES: f64 = RESERVE_CORES + 0.5;
/// How far a host's idle cores may be from the target before the share moves.
pub const IMAGE_HOLD_CORES: f64 = 0.25;
/// Least time between a move and the next step up of a job's share: a step shows in the hosts'
/// idle cores only once the leases it marked are computed and their parts made, a second or so
/// later. A step down waits half of it.
pub const IMAGE_STEP_MS: u64 = 2_000;

/// The next share of a job's images, and how long after the last move it may be taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageShare {
    /// The share, 0 to 1.
    pub share: f64,
    /// Milliseconds since the last move before this one may be taken: 0 for a move the
    /// consumers' wishes or a host under the reserve force.
    pub settle_ms: u64,
}

impl ImageShare {
    fn now(share: f64) -> ImageShare {
        ImageShare { share, settle_ms: 0 }
    }
}

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
pub fn image_share(current: f64, normalization: Place, consumers: &[(ImageWish, HostLoad)]) -> ImageShare {
    if consumers.is_empty()
        || consumers.iter().any(|(w, _)| matches!(w, ImageWish::Unsupported | ImageWish::Never))
    {
        return ImageShare::now(0.0);
    }
    if consumers.iter().all(|(w, _)| *w == ImageWish::Always) {
        return ImageShare::now(1.0);
    }
    if normalization == Place::Workers {
        return ImageShare::now(0.0);
    }
    let current = if current.is_finite() { current.clamp(0.0, 1.0) } else { 0.0 };
    let mut next = ImageShare { share: 1.0, settle_ms: IMAGE_STEP_MS };
    for (_, load) in consumers {
        let Some(idle) = load.idle_cores.filter(|i| i.is_finite()) else {
            return ImageShare::now(0.0);
        };
        let allowed = allowed_share(current, idle, load.last_finish_cores);
        if allowed.share < next.share {
            next = allowed;
        }
    }
    next
}

/// The share a host with `idle` idle cores allows, its client finishing with `finishing`
/// cores (when it last did) at `current`.
fn allowed_share(current: f64, idle: f64, finishing: Option<f64>) -> ImageShare {
    let off = idle - IMAGE_TARGET_IDLE_CORES;
    if off.abs() < IMAGE_HOLD_CORES {
        return ImageShare { share: current, settle_ms: IMAGE_STEP_MS };
    }
    // Cores the whole share costs this host, from what its share costs it now.
    let per_share = finishing.filter(|f| f.is_finite() && *f > 0.0 && current > 0.0).map(|f| f / current);
    if off > 0.0 {
        let step =
            per_share.map_or(IMAGE_SHARE_STEP, |cost| (off / cost).clamp(IMAGE_MIN_STEP, IMAGE_MAX_STEP_UP));
        return ImageShare { share: (current + step).min(1.0), settle_ms: IMAGE_STEP_MS };
    }
    let step = per_share.map_or(2.0 * IMAGE_SHARE_STEP, |cost| (-off / cost).max(IMAGE_MIN_STEP));
    let settle_ms = if idle < RESERVE_CORES { 0 } else { IMAGE_STEP_MS / 2 };
    ImageShare { share: (current - step).max(0.0), settle_ms }
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
        HostLoad { idle_cores: Some(idle), ..HostLoad::default() }
    }

    fn share(current: f64, consumers: &[(ImageWish, HostLoad)]) -> f64 {
        image_share(current, Place::Client, consumers).share
    }

    #[test]
    fn before_the_cost_is_known_the_share_steps_up_with_room_holds_near_the_target_and_backs_off_fast() {
        let auto = |idle| [(ImageWish::Auto, load(idle))];
        assert_eq!(
            image_share(0.0, Place::Client, &auto(2.0)),
            ImageShare { share: 0.125, settle_ms: 2_000 }
        );
        assert_eq!(share(0.95, &auto(2.0)), 1.0);
        assert_eq!(share(0.5, &auto(1.2)), 0.5, "within the hold band: held");
        assert_eq!(share(0.5, &auto(0.8)), 0.5);
        assert_eq!(image_share(0.5, Place::Client, &auto(0.7)), ImageShare { share: 0.25, settle_ms: 1_000 });
        assert_eq!(image_share(0.1, Place::Client, &auto(0.0)), ImageShare { share: 0.0, settle_ms: 0 });
    }

    #[test]
    fn a_known_cost_sizes_the_step_to_the_cores_a_host_is_off() {
        // Half the images cost the host 1 core: 2 cores a share.
        let with = |idle| {
            [(
                ImageWish::Auto,
                HostLoad { idle_cores: Some(idle), last_finish_cores: Some(1.0), last_image_cores: None },
            )]
        };
        // 0.4 cores over the target: 0.2 more of the share; 2 cores over: at most a quarter.
        assert!((share(0.5, &with(1.4)) - 0.7).abs() < 1e-9);
        assert_eq!(share(0.5, &with(3.0)), 0.75);
        // 0.5 cores under: 0.25 less; 0.26 under: 0.13 less.
        assert!((share(0.5, &with(0.5)) - 0.25).abs() < 1e-9);
        assert!((share(0.5, &with(0.74)) - 0.37).abs() < 1e-9);
        // At 16 cores a share, 0.3 cores under is a sliver: the least step.
        let costly = [(
            ImageWish::Auto,
            HostLoad { idle_cores: Some(0.7), last_finish_cores: Some(8.0), last_image_cores: None },
        )];
        assert_eq!(share(0.5, &costly), 0.5 - IMAGE_MIN_STEP);
        assert_eq!(image_share(0.5, Place::Client, &with(0.2)).settle_ms, 0, "under the reserve: at once");
    }

    /// A host with `free` idle cores before any image, whose client spends 0.1 cores on the
    /// normalization and `per_share` cores on a whole share of the images, run through the rule
    /// for 40 ticks; returns the share and the host's idle cores then.
    fn settle(free: f64, per_share: f64, start: f64) -> (f64, f64) {
        let mut current = start;
        let idle = |share: f64| free - 0.1 - per_share * share;
        for _ in 0..40 {
            let finishing = 0.1 + per_share * current;
            let load = HostLoad {
                idle_cores: Some(idle(current)),
                last_finish_cores: Some(finishing),
                last_image_cores: None,
            };
            current = share(current, &[(ImageWish::Auto, load)]);
        }
        (current, idle(current))
    }

    #[test]
    fn the_share_settles_near_the_target_on_any_host() {
        for free in [1.5, 2.0, 3.0, 4.0, 8.0] {
            for per_share in [0.5, 1.0, 2.0, 4.0, 16.0, 40.0] {
                for start in [0.0, 0.5, 1.0] {
                    let (share, idle) = settle(free, per_share, start);
                    let target = IMAGE_TARGET_IDLE_CORES;
                    let all = free - 0.1 - per_share;
                    let why =
                        format!("{free} free, {per_share} a share, from {start}: {share} leaves {idle}");
                    if all >= target - IMAGE_HOLD_CORES {
                        // Room for every image: all of them, or as near as the band leaves.
                        assert!(idle >= target - IMAGE_HOLD_CORES, "{why}");
                        assert!(share == 1.0 || idle < target + IMAGE_HOLD_CORES, "{why}");
                    } else {
                        assert!((idle - target).abs() < IMAGE_HOLD_CORES + 1e-9, "{why}");
                    }
                }
            }
        }
        // A trainer with 2 idle cores, 0.1 of them normalizing, gives images all but the
        // target and the band: at least 0.65 cores.
        let (share, _) = settle(2.0, 2.0, 0.0);
        assert!(2.0 * share >= 2.0 - 0.1 - IMAGE_TARGET_IDLE_CORES - IMAGE_HOLD_CORES, "{share}");
    }

    #[test]
    fn every_consumer_must_have_room() {
        let two = [(ImageWish::Auto, load(3.0)), (ImageWish::Auto, load(0.6))];
        assert_eq!(share(0.5, &two), 0.25);
        let unmeasured = [(ImageWish::Auto, load(3.0)), (ImageWish::Auto, HostLoad::default())];
        assert_eq!(share(0.5, &unmeasured), 0.0, "not moved blind");
    }

    #[test]
    fn wishes_and_a_busy_normalization_decide_before_the_loads() {
        let idle = load(8.0);
        assert_eq!(share(0.5, &[(ImageWish::Unsupported, idle)]), 0.0);
        assert_eq!(share(0.5, &[(ImageWish::Auto, idle), (ImageWish::Never, idle)]), 0.0);
        assert_eq!(image_share(0.0, Place::Workers, &[(ImageWish::Always, load(0.0))]), ImageShare::now(1.0));
        assert_eq!(image_share(0.5, Place::Workers, &[(ImageWish::Auto, idle)]), ImageShare::now(0.0));
        assert_eq!(share(0.5, &[]), 0.0);
        assert_eq!(share(f64::NAN, &[(ImageWish::Auto, idle)]), 0.125);
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
