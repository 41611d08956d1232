//! Placement: whether a pipeline's final `float32` `image.normalize` runs in the trainer's
//! client or on the workers.
//!
//! The normalization quadruples an image's bytes (one `uint8` per value in, one `float32` out)
//! and costs a pass over them. Run in the client, the wire carries a quarter of the bytes and the
//! workers skip the pass, which pays when the trainer's host has CPU to spare (Pecan, ATC'24,
//! reports the trainers' idle cores as most of the saving). When the host is busy (the trainer
//! itself computes on its CPUs, or other jobs share it) the pass would slow the trainer down, so
//! the workers run it. The values are the same bits either way.
//!
//! The rule, per job, from its consumers' heartbeats:
//! - while the clients finish, the job stays on them as long as every consumer's host keeps at
//!   least [`RESERVE_CORES`] idle (what the hosts measure already excludes the finishing);
//! - while the workers finish, the job moves to the clients once every consumer's host has the
//!   cores the normalization took it when it last finished (its finishing less the images it
//!   made then; or [`ASSUMED_FINISH_CORES`] before it ever did) plus the reserve plus
//!   [`HYSTERESIS_CORES`], so that a host at the edge does not flap;
//! - a consumer that reports no idle figure (its host cannot measure it) counts as having room,
//!   which is how clients that predate placement were served;
//! - while the hosts make a share of the job's images ([`crate::image_placement`]), the
//!   normalization stays on them: a busy host sheds images first (the share steps down at once
//!   under the reserve, by the cores the host lacks), and the normalization, a small part of the
//!   cost, moves only once the share is none. Moving both at once would leave the host idle and
//!   remember the images' cost as the normalization's, so that it would not come back.

use serde::{Deserialize, Serialize};

/// Where the final normalization runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Place {
    /// In the trainer's client (the default: the wire carries a quarter of the bytes).
    #[default]
    Client,
    /// On the workers.
    Workers,
}

/// Idle cores a consumer's host keeps, at least, while its client finishes tensors.
pub const RESERVE_CORES: f64 = 0.5;
/// How many more idle cores than the reserve plus the finishing's cost it takes to move work to
/// the clients.
pub const HYSTERESIS_CORES: f64 = 0.25;
/// The finishing's cost assumed for a client that never finished tensors yet.
pub const ASSUMED_FINISH_CORES: f64 = 0.25;

/// What one consumer's client reported.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostLoad {
    /// Cores its host left idle over the last interval; `None` when it cannot measure them.
    pub idle_cores: Option<f64>,
    /// Cores finishing took the client when it last finished tensors (the normalization and
    /// the images it made); `None` before it did.
    pub last_finish_cores: Option<f64>,
    /// Of those, the cores making images took, from the same report; `None` from a client that
    /// does not tell them apart.
    pub last_image_cores: Option<f64>,
}

impl HostLoad {
    /// The load after a report of `idle_cores`, and of `finish_cores` spent finishing, of which
    /// `image_cores` on images: the finishing's costs are the report's when the client was
    /// finishing (more than nothing), else those known before.
    pub fn reported(&self, idle_cores: Option<f64>, finish_cores: f64, image_cores: Option<f64>) -> HostLoad {
        if !(finish_cores.is_finite() && finish_cores > 0.0) {
            return HostLoad { idle_cores, ..*self };
        }
        let images = image_cores.filter(|c| c.is_finite()).map(|c| c.clamp(0.0, finish_cores));
        HostLoad { idle_cores, last_finish_cores: Some(finish_cores), last_image_cores: images }
    }

    /// Cores the normalization took when the client last finished: its finishing less the
    /// images it made then (all of it from a client that does not tell them apart).
    pub fn last_normalize_cores(&self) -> Option<f64> {
        let finish = self.last_finish_cores.filter(|c| c.is_finite())?;
        Some((finish - self.last_image_cores.unwrap_or(0.0)).max(0.0))
    }
}

/// Whether a host with `idle` idle cores, whose client finishes with `finishing_now` cores now,
/// keeps room for finishing that takes `need` cores: the reserve left over, plus the margin
/// when the work would move back from the workers (`current` is [`Place::Workers`]).
pub fn keeps_room(current: Place, idle: f64, finishing_now: f64, need: f64) -> bool {
    let margin = match current {
        Place::Client => 0.0,
        Place::Workers => HYSTERESIS_CORES,
    };
    idle.max(0.0) + finishing_now - need >= RESERVE_CORES + margin
}

/// Where a job's normalization runs next, from where it runs now, the share of its images its
/// hosts make now, and its consumers' loads.
pub fn place(current: Place, image_share: f64, consumers: &[HostLoad]) -> Place {
    if current == Place::Client && image_share > 0.0 {
        return Place::Client;
    }
    let fits = |load: &HostLoad| -> bool {
        let Some(idle) = load.idle_cores.filter(|i| i.is_finite()) else { return true };
        match current {
            // What the host measures already excludes the finishing it does.
            Place::Client => keeps_room(current, idle, 0.0, 0.0),
            Place::Workers => {
                let need = load.last_normalize_cores().unwrap_or(ASSUMED_FINISH_CORES);
                keeps_room(current, idle, 0.0, need.max(0.0))
            }
        }
    };
    if consumers.iter().all(fits) { Place::Client } else { Place::Workers }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(idle: f64, last: Option<f64>) -> HostLoad {
        HostLoad { idle_cores: Some(idle), last_finish_cores: last, last_image_cores: None }
    }

    #[test]
    fn an_idle_host_finishes_and_a_busy_one_leaves_it_to_the_workers() {
        assert_eq!(place(Place::Client, 0.0, &[load(2.0, Some(0.3))]), Place::Client);
        assert_eq!(
            place(Place::Client, 0.0, &[load(0.1, Some(0.3))]),
            Place::Workers,
            "the trainer took the CPU"
        );
    }

    #[test]
    fn work_comes_back_to_the_client_only_with_room_for_it_and_a_margin() {
        // Finishing took 0.4 cores: back at 0.4 + 0.5 + 0.25 idle, not before.
        assert_eq!(place(Place::Workers, 0.0, &[load(1.0, Some(0.4))]), Place::Workers);
        assert_eq!(place(Place::Workers, 0.0, &[load(1.2, Some(0.4))]), Place::Client);
        // Never finished yet: the assumed cost.
        assert_eq!(place(Place::Workers, 0.0, &[load(0.9, None)]), Place::Workers);
        assert_eq!(place(Place::Workers, 0.0, &[load(1.0, None)]), Place::Client);
    }

    #[test]
    fn the_edge_does_not_flap() {
        // 0.6 idle while finishing: stays; the same host after moving does not come back at 0.6.
        assert_eq!(place(Place::Client, 0.0, &[load(0.6, Some(0.3))]), Place::Client);
        assert_eq!(place(Place::Workers, 0.0, &[load(0.6, Some(0.3))]), Place::Workers);
    }

    #[test]
    fn every_consumer_must_have_room_and_an_unmeasured_one_has_it() {
        let busy = load(0.0, None);
        let unmeasured = HostLoad::default();
        assert_eq!(place(Place::Client, 0.0, &[load(3.0, None), busy]), Place::Workers);
        assert_eq!(place(Place::Client, 0.0, &[unmeasured]), Place::Client);
        assert_eq!(place(Place::Workers, 0.0, &[unmeasured, load(3.0, None)]), Place::Client);
        assert_eq!(place(Place::Client, 0.0, &[]), Place::Client, "no consumer yet");
        let nan = HostLoad {
            idle_cores: Some(f64::NAN),
            last_finish_cores: Some(f64::NAN),
            last_image_cores: None,
        };
        assert_eq!(
            place(Place::Workers, 0.0, &[nan]),
            Place::Client,
            "a figure that is not one is no figure"
        );
    }

    #[test]
    fn a_busy_host_sheds_images_before_the_normalization() {
        assert_eq!(
            place(Place::Client, 0.25, &[load(0.1, Some(3.0))]),
            Place::Client,
            "the share steps down first"
        );
        assert_eq!(place(Place::Client, 0.0, &[load(0.1, Some(3.0))]), Place::Workers, "none left to shed");
        assert_eq!(
            place(Place::Client, f64::NAN, &[load(0.1, None)]),
            Place::Workers,
            "no share that is one"
        );
    }

    #[test]
    fn the_finishing_cost_is_remembered_from_when_the_client_finished() {
        let first = HostLoad::default().reported(Some(2.0), 0.3, None);
        assert_eq!((first.last_finish_cores, first.last_normalize_cores()), (Some(0.3), Some(0.3)));
        let workers = first.reported(Some(1.0), 0.0, Some(0.0));
        assert_eq!(workers, HostLoad { idle_cores: Some(1.0), ..first }, "the workers finish now");
        assert_eq!(first.reported(None, f64::NAN, None).last_finish_cores, Some(0.3));
        assert_eq!(HostLoad::default().reported(None, 0.0, None).last_finish_cores, None);
    }

    #[test]
    fn the_normalization_comes_back_for_its_own_cost_not_the_images() {
        // The client last finished with 2.4 cores, 2.1 of them images: the normalization needs
        // 0.3 + 0.5 + 0.25 to come back, not 3.15.
        let load = HostLoad::default().reported(Some(1.1), 2.4, Some(2.1));
        assert!((load.last_normalize_cores().unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(place(Place::Workers, 0.0, &[load]), Place::Client);
        // A client that does not tell them apart: all of it counts.
        let old = HostLoad::default().reported(Some(1.1), 2.4, None);
        assert_eq!(place(Place::Workers, 0.0, &[old]), Place::Workers);
        // More images than finishing is noise: capped.
        assert_eq!(HostLoad::default().reported(None, 1.0, Some(3.0)).last_normalize_cores(), Some(0.0));
    }
}
