//! Placement of a job's final normalization (see `granary_policies::placement`) and of its
//! image run (`granary_policies::image_placement`): decided at each of its consumers'
//! heartbeats, from what their hosts reported, and carried by the job's leases
//! (`Lease.normalize_on_worker` on every one; `Lease.images_on_client` with the share of the
//! split's images in `Lease.client_image_share`, or on a share of them for older workers).

use super::Job;
use granary_policies::image_placement::{ImageWish, image_share};
use granary_policies::placement::{HostLoad, Place, place};
use granary_proto::v1 as pb;

/// What a registration's `image_plans` asks for.
pub(crate) fn image_wish(plans: i32) -> ImageWish {
    match pb::ImagePlans::try_from(plans) {
        Ok(pb::ImagePlans::Auto) => ImageWish::Auto,
        Ok(pb::ImagePlans::Always) => ImageWish::Always,
        Ok(pb::ImagePlans::Never) => ImageWish::Never,
        Ok(pb::ImagePlans::Unsupported) | Err(_) => ImageWish::Unsupported,
    }
}

impl Job {
    /// Decides again where the job's final normalization runs, from its reading consumers'
    /// hosts; logs a change.
    pub(crate) fn place_normalization(&mut self, pipeline: &str, job: &str) {
        let loads: Vec<HostLoad> =
            self.consumers.values().filter(|c| !c.gone && !c.finished).map(|c| c.host).collect();
        let next = place(self.place, self.images.share, &loads);
        if next != self.place {
            let idle: Vec<String> = loads
                .iter()
                .map(|l| l.idle_cores.map_or_else(|| "unmeasured".to_string(), |i| format!("{i:.2}")))
                .collect();
            tracing::info!(
                pipeline,
                job,
                from = ?self.place,
                to = ?next,
                idle_cores = %idle.join(","),
                "placement: the final normalization moves"
            );
            self.place = next;
        }
    }

    /// Whether the workers apply the final normalization to the job's next leases: not for a
    /// lease whose images the consumers make, which finish them too.
    pub(crate) fn normalize_on_worker(&self) -> bool {
        self.place == Place::Workers && self.images.share < 1.0
    }

    /// Decides again the share of the job's images its reading consumers' hosts make, a step
    /// up at most once every [`IMAGE_STEP_MS`](granary_policies::image_placement::IMAGE_STEP_MS);
    /// logs a change.
    pub(crate) fn place_images(&mut self, pipeline: &str, job: &str, now: u64) {
        let consumers: Vec<(ImageWish, HostLoad)> =
            self.consumers.values().filter(|c| !c.gone && !c.finished).map(|c| (c.images, c.host)).collect();
        let images = &mut self.images;
        let decided = image_share(images.share, self.place, &consumers);
        let next = decided.share;
        // A step waits for the last move to show in the hosts' idle cores (a step down half as
        // long); a jump the consumers' wishes make, or one a host under the reserve needs, does
        // not.
        let waits = images.moved_at.is_some_and(|at| now < at.saturating_add(decided.settle_ms));
        if next == images.share || waits {
            return;
        }
        // The hosts' figures the move was decided from, to tell a settled share from one that
        // overshoots (each consumer's idle cores, and its finishing cores with those on images).
        let figure = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        let hosts: Vec<String> = consumers
            .iter()
            .map(|(_, l)| {
                let (idle, finish, image) = (l.idle_cores, l.last_finish_cores, l.last_image_cores);
                format!("{}/{}/{}", figure(idle), figure(finish), figure(image))
            })
            .collect();
        tracing::info!(
            pipeline,
            job,
            from = images.share,
            to = next,
            idle_finish_image_cores = %hosts.join(","),
            "placement: the share of images the trainers' hosts make moves"
        );
        images.share = next;
        images.moved_at = Some(now);
    }

    /// The share of the images of the job's next lease its consumers make: the job's share, to
    /// a worker that plans shares of a split (`shares`), spread over the split's elements; else
    /// all or none, the job's share spread over its leases.
    pub(crate) fn client_image_share(&mut self, shares: bool) -> f64 {
        let share = self.images.share;
        if shares {
            if share > 0.0 { share.min(1.0) } else { 0.0 }
        } else if self.images.marks.next(share) {
            1.0
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_demand::{join, setup};
    use granary_proto::v1 as pb;

    fn beat(
        s: &mut super::super::State,
        c: &pb::RegisterClientResponse,
        idle: Option<f64>,
        finish: f64,
        now: u64,
    ) {
        let req = pb::ClientHeartbeatRequest {
            client_id: c.client_id.clone(),
            pipeline: "p".into(),
            job: c.job.clone(),
            consumer_index: c.consumer_index,
            wants_data: true,
            host_idle_cores: idle,
            finish_cores: finish,
            ..Default::default()
        };
        s.client_heartbeat(&req, now).unwrap();
    }

    #[test]
    fn leases_carry_where_the_normalization_runs_as_the_trainer_host_gets_busy_and_idle_again() {
        let (mut s, w) = setup(40);
        let trainer = join(&mut s, "train", 0);
        let lease = s.lease(&w, 1).unwrap().unwrap();
        assert!(!lease.normalize_on_worker, "a client that reported nothing finishes, as before");
        beat(&mut s, &trainer, Some(1.5), 0.3, 2);
        assert!(!s.lease(&w, 3).unwrap().unwrap().normalize_on_worker, "1.5 idle cores");
        beat(&mut s, &trainer, Some(0.2), 0.3, 4);
        assert!(s.lease(&w, 5).unwrap().unwrap().normalize_on_worker, "the trainer took the host's CPU");
        // Idle again, but not by the 0.3 cores finishing took plus the reserve and margin.
        beat(&mut s, &trainer, Some(0.9), 0.0, 6);
        assert!(s.lease(&w, 7).unwrap().unwrap().normalize_on_worker);
        beat(&mut s, &trainer, Some(1.2), 0.0, 8);
        assert!(!s.lease(&w, 9).unwrap().unwrap().normalize_on_worker, "room for it again");
    }

    #[test]
    fn one_busy_host_among_the_consumers_puts_the_work_on_the_workers() {
        let (mut s, w) = setup(40);
        let req = pb::RegisterClientRequest {
            pipeline: "p".into(),
            job: "ddp".into(),
            num_consumers: 2,
            wants_data: true,
            ..Default::default()
        };
        let first = s
            .register_client(&pb::RegisterClientRequest { consumer_index: Some(0), ..req.clone() }, 0)
            .unwrap();
        let second =
            s.register_client(&pb::RegisterClientRequest { consumer_index: Some(1), ..req }, 0).unwrap();
        beat(&mut s, &first, Some(4.0), 0.2, 1);
        beat(&mut s, &second, Some(0.0), 0.2, 1);
        assert!(s.lease(&w, 2).unwrap().unwrap().normalize_on_worker);
    }

    fn join_wanting(
        s: &mut super::super::State,
        job: &str,
        plans: pb::ImagePlans,
    ) -> pb::RegisterClientResponse {
        let req = pb::RegisterClientRequest {
            pipeline: "p".into(),
            job: job.into(),
            wants_data: true,
            image_plans: plans.into(),
            ..Default::default()
        };
        s.register_client(&req, 0).unwrap()
    }

    /// Marks on the next `n` leases of the state's only worker, from `now` on.
    fn marks(s: &mut super::super::State, w: &str, n: u64, now: u64) -> Vec<bool> {
        (0..n).map(|i| s.lease(w, now + i).unwrap().unwrap().images_on_client).collect()
    }

    #[test]
    fn leases_carry_the_images_to_clients_that_ask_for_them_and_never_to_older_clients() {
        let (mut s, w) = setup(40);
        let always = join_wanting(&mut s, "always", pb::ImagePlans::Always);
        let leases: Vec<pb::Lease> = (0..4).map(|i| s.lease(&w, 1 + i).unwrap().unwrap()).collect();
        assert!(leases.iter().all(|l| l.images_on_client && !l.normalize_on_worker), "every lease, at once");
        // A busy host: the normalization stays with the images it finishes.
        beat(&mut s, &always, Some(0.0), 0.3, 10);
        assert!(marks(&mut s, &w, 2, 11).iter().all(|&m| m));
        assert!(!s.lease(&w, 20).unwrap().unwrap().normalize_on_worker);
        let (mut s, w) = setup(40);
        let older = join(&mut s, "older", 0);
        beat(&mut s, &older, Some(8.0), 0.0, 1);
        assert_eq!(marks(&mut s, &w, 4, 2), [false; 4], "a client that cannot execute plans");
        let (mut s, w) = setup(40);
        let never = join_wanting(&mut s, "never", pb::ImagePlans::Never);
        beat(&mut s, &never, Some(8.0), 0.0, 1);
        assert_eq!(marks(&mut s, &w, 4, 2), [false; 4]);
    }

    #[test]
    fn a_worker_that_plans_shares_gets_the_share_on_every_lease_and_an_older_one_whole_leases() {
        let (mut s, old) = setup(400);
        let req = pb::RegisterWorkerRequest {
            address: "127.0.0.1:2".into(),
            plans_image_shares: true,
            ..Default::default()
        };
        let new = s.register_worker(&req, 0).unwrap().0;
        let auto = join_wanting(&mut s, "auto", pb::ImagePlans::Auto);
        let lease = s.lease(&new, 1).unwrap().unwrap();
        assert!(!lease.images_on_client && lease.client_image_share == 0.0, "nothing measured yet");
        // 4 idle cores: an eighth of the images, on each of the newer worker's leases.
        beat(&mut s, &auto, Some(4.0), 0.0, 100);
        for now in 101..105 {
            let lease = s.lease(&new, now).unwrap().unwrap();
            assert!(lease.images_on_client && !lease.normalize_on_worker);
            assert_eq!(lease.client_image_share, 0.125);
        }
        // A share below an `f32`'s range is none on the wire, not 0 (which a worker reads as all).
        let job = s.pipelines.get_mut("p").and_then(|p| p.jobs.get_mut("auto")).expect("the job");
        let eighth = std::mem::replace(&mut job.images.share, 1e-60);
        let lease = s.lease(&new, 110).unwrap().unwrap();
        assert!(!lease.images_on_client && lease.client_image_share == 0.0);
        if let Some(job) = s.pipelines.get_mut("p").and_then(|p| p.jobs.get_mut("auto")) {
            job.images.share = eighth;
        }
        // The older worker's leases: every eighth, whole.
        let leases: Vec<pb::Lease> = (0..8).map(|i| s.lease(&old, 200 + i).unwrap().unwrap()).collect();
        assert_eq!(leases.iter().filter(|l| l.images_on_client).count(), 1);
        assert!(leases.iter().all(|l| l.client_image_share == 0.0));
        // Every image on the host: a share of 1.
        let always = join_wanting(&mut s, "always", pb::ImagePlans::Always);
        let leases: Vec<pb::Lease> = (0..4).map(|i| s.lease(&new, 300 + i).unwrap().unwrap()).collect();
        let of_always: Vec<&pb::Lease> = leases.iter().filter(|l| l.job == always.job).collect();
        assert!(!of_always.is_empty());
        assert!(of_always.iter().all(|l| l.images_on_client && l.client_image_share == 1.0));
    }

    #[test]
    fn an_idle_host_takes_a_growing_share_of_the_images_and_a_busy_one_gives_them_back() {
        let (mut s, w) = setup(400);
        let auto = join_wanting(&mut s, "auto", pb::ImagePlans::Auto);
        assert_eq!(marks(&mut s, &w, 8, 1), [false; 8], "nothing measured yet");
        // 4 idle cores: one step now, the next only once it could show in the host's figures.
        beat(&mut s, &auto, Some(4.0), 0.0, 100);
        assert_eq!(marks(&mut s, &w, 8, 101).iter().filter(|&&m| m).count(), 1, "an eighth");
        beat(&mut s, &auto, Some(4.0), 0.0, 600);
        assert_eq!(marks(&mut s, &w, 8, 601).iter().filter(|&&m| m).count(), 1, "too soon to step again");
        let mut now = 600;
        for _ in 0..7 {
            now += granary_policies::image_placement::IMAGE_STEP_MS;
            beat(&mut s, &auto, Some(4.0), 0.0, now);
        }
        assert_eq!(marks(&mut s, &w, 8, now + 1), [true; 8], "all of them");
        // The host gets busy: the share falls by what the host is short of, over what a whole
        // share costs it (1.6 cores), once the last move could show.
        beat(&mut s, &auto, Some(0.6), 1.6, now + 10);
        assert_eq!(marks(&mut s, &w, 8, now + 11), [true; 8], "too soon after the last step");
        beat(&mut s, &auto, Some(0.6), 1.6, now + 1_000);
        assert_eq!(marks(&mut s, &w, 8, now + 1_001).iter().filter(|&&m| m).count(), 6, "0.4 cores short");
        // Under the reserve: at once.
        beat(&mut s, &auto, Some(0.0), 0.4, now + 1_020);
        beat(&mut s, &auto, Some(0.0), 0.4, now + 1_030);
        assert_eq!(marks(&mut s, &w, 8, now + 1_031), [false; 8], "the normalization moved: no images");
    }
}
