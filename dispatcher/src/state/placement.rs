//! Placement of a job's final normalization (see `granary_policies::placement`): decided at
//! each of its consumers' heartbeats, from what their hosts reported, and carried by every
//! lease of the job (`Lease.normalize_on_worker`).

use super::Job;
use granary_policies::placement::{HostLoad, Place, place};

impl Job {
    /// Decides again where the job's final normalization runs, from its reading consumers'
    /// hosts; logs a change.
    pub(crate) fn place_normalization(&mut self, pipeline: &str, job: &str) {
        let loads: Vec<HostLoad> =
            self.consumers.values().filter(|c| !c.gone && !c.finished).map(|c| c.host).collect();
        let next = place(self.place, &loads);
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

    /// Whether the workers apply the final normalization to the job's next leases.
    pub(crate) fn normalize_on_worker(&self) -> bool {
        self.place == Place::Workers
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
}
