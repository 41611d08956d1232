//! Trainer hosts as capacity: the per-worker rate the autoscaler plans with, once the trainers'
//! hosts take their share of the work.
//!
//! Placement ([`crate::placement`]) lets a job's clients finish its tensors (the final
//! normalization, and the share of the images [`crate::image_placement`] leaves to them) on
//! their hosts' idle cores, so each batch costs the workers less CPU. That
//! share holds only while the hosts keep room for it: at a higher demand each client finishes
//! more elements a second, and once a host would drop under the reserve, placement hands the
//! finishing back to the workers and every batch costs them more. The reverse holds too: a job
//! finished by the workers now, whose hosts would have room for it at the demand, will move to
//! its clients and free the workers' share.
//!
//! So the model does not take the measured rate as it is. It takes the workers' CPU per batch
//! (`cores / rate`), removes what they spend finishing now, and adds what they would spend at
//! the demand, job by job, weighted by each job's share of the demand:
//!
//! `c = cores / r − Σ_j (D_j / D) · f_j · B · [workers finish j now]
//!                + Σ_j (D_j / D) · f_j · B · [j's hosts lack room at D_j]`
//!
//! and plans with `cores / c`. `f_j` is the finishing's CPU seconds per element, as its clients
//! measured it (`finish_cores` over the elements they received, the CPU time of every thread
//! that normalized or made images) or else as the workers did. So the images the hosts make
//! count too: they are capacity while the hosts keep room, and the workers' cost per batch
//! grows by them where the hosts would lack room at the demand. A consumer's host lacks room when `idle + finishing now − f_j · elements a second at D_j` falls
//! under the reserve (plus the margin placement asks before it moves work back to clients).
//! Hosts that cannot measure their idle cores count as having room, as placement counts them.
//!
//! A job whose hosts make a share of its images gives back only what they lack: the share
//! steers each host to [`IMAGE_TARGET_IDLE_CORES`], so where a host would have `idle +
//! finishing now − target` cores for finishing at the demand and the finishing takes more, the
//! workers take the rest, not all of it. The bracket above becomes the share of `f_j` the
//! workers take, `min(1, max over hosts of (f_j · elements a second at D_j − room) / (f_j ·
//! elements a second at D_j))`.
//!
//! The share grows as well as shrinks: where every host would still have cores beyond the
//! share's band (`room −` [`IMAGE_HOLD_CORES`]) once it finishes at the demand, it makes more of
//! the images, and the workers fewer. The share of `f_j` the workers take is then negative: the
//! spare cores over `f_j · elements a second at D_j`, down to `−(1 − s) / s` at a share `s` (all
//! the images: a whole share costs a host `f_j / s` an element, an overestimate that counts the
//! normalization too). A host core spent on images spares one worker core: the hosts and the
//! workers run the same code. Hosts that do not measure their idle cores get no more images, as
//! placement gives them none.

use crate::estimate::job_demand;
use crate::image_placement::{IMAGE_HOLD_CORES, IMAGE_TARGET_IDLE_CORES};
use crate::inputs::{JobMetrics, JobMode, Observation, sane};
use crate::placement::{Place, keeps_room};
use crate::wording::rate;

/// One job's finishing, as the model sees it at the demand.
#[derive(Clone, Debug, PartialEq)]
pub struct JobFinishing {
    /// Job name.
    pub job: String,
    /// Where it runs now.
    pub now: Place,
    /// The share of the finishing's cost the workers take at the demand: 0 while the hosts keep
    /// room for all of it, 1 once it moves to the workers, between for a job whose hosts make a
    /// share of its images and would make fewer, and negative for one whose hosts would make
    /// more (the part of the finishing's cost they would add).
    pub workers_take: f64,
    /// The job's demand, batches per second.
    pub demand: f64,
    /// Cores the finishing takes on each consumer's host at that demand.
    pub cores_per_host: f64,
}

/// The per-worker rate with the trainer hosts' share counted.
#[derive(Clone, Debug, PartialEq)]
pub struct HostShare {
    /// Batches per second one worker makes once each job's finishing runs where it will at the
    /// demand.
    pub per_worker: f64,
    /// The jobs whose finishing cost is known.
    pub jobs: Vec<JobFinishing>,
}

impl JobFinishing {
    /// Where it runs at the job's demand: on the clients while the hosts keep room for any of
    /// it, on the workers once they take all of it.
    pub fn at_demand(&self) -> Place {
        if self.workers_take < 1.0 { Place::Client } else { Place::Workers }
    }
}

impl HostShare {
    /// What the hosts change, in words, for the autoscaler's reason; empty when no job defers
    /// finishing to its clients.
    pub fn describe(&self) -> String {
        let on_hosts: Vec<&JobFinishing> =
            self.jobs.iter().filter(|j| j.at_demand() == Place::Client).collect();
        let on_workers: Vec<&JobFinishing> =
            self.jobs.iter().filter(|j| j.at_demand() == Place::Workers).collect();
        let mut parts = Vec::new();
        if !on_hosts.is_empty() {
            let cores =
                on_hosts.iter().map(|j| j.cores_per_host * (1.0 - j.workers_take)).fold(0.0, f64::max);
            parts.push(format!(
                "trainer hosts finish {} on their idle cores ({cores:.2} cores each at the demand)",
                names(&on_hosts)
            ));
        }
        let fewer: Vec<&JobFinishing> = on_hosts.iter().copied().filter(|j| j.workers_take > 0.0).collect();
        if !fewer.is_empty() {
            let most = fewer.iter().map(|j| j.workers_take).fold(0.0, f64::max);
            parts.push(format!(
                "at the demand they would make fewer of {}'s images, and the workers {:.0}% of that work",
                job_names(&fewer),
                most * 100.0
            ));
        }
        let more: Vec<&JobFinishing> = on_hosts.iter().copied().filter(|j| j.workers_take < 0.0).collect();
        if !more.is_empty() {
            let most = more.iter().map(|j| -j.workers_take).fold(0.0, f64::max);
            parts.push(format!(
                "at the demand they would make more of {}'s images, {:.0}% more work than they finish now",
                job_names(&more),
                most * 100.0
            ));
        }
        if !on_workers.is_empty() {
            let demand: f64 = on_workers.iter().map(|j| j.demand).sum();
            parts.push(format!(
                "trainer hosts lack the idle cores to finish {} at {} batches/s, so the workers will",
                names(&on_workers),
                rate(demand)
            ));
        }
        parts.join("; ")
    }
}

/// The jobs' tensors, in words.
fn names(jobs: &[&JobFinishing]) -> String {
    format!("{} tensors", job_names(jobs))
}

/// The jobs, in words.
fn job_names(jobs: &[&JobFinishing]) -> String {
    jobs.iter().map(|j| format!("`{}`", j.job)).collect::<Vec<_>>().join(", ")
}

/// The finishing's CPU seconds per element for `job`: its clients' measure (cores spent over the
/// elements they received) while they finish, else the workers' while they do.
fn finish_seconds_per_element(job: &JobMetrics, obs: &Observation, batch: f64) -> Option<f64> {
    let (cores, elements) = job.consumers.iter().fold((0.0, 0.0), |(c, e), m| {
        let (f, bps) = (sane(m.finish_cores), sane(m.batches_per_second));
        if f > 0.0 && bps > 0.0 { (c + f, e + bps * batch) } else { (c, e) }
    });
    if cores > 0.0 && elements > 0.0 {
        return Some(cores / elements);
    }
    let workers: Vec<f64> =
        obs.workers.iter().map(|w| sane(w.finish_seconds_per_element)).filter(|s| *s > 0.0).collect();
    (!workers.is_empty()).then(|| workers.iter().sum::<f64>() / workers.len() as f64)
}

/// Whether every consumer's host keeps room for finishing `cores_per_host` more, from where the
/// finishing runs now (a move back to the clients asks for placement's margin too).
fn hosts_have_room(job: &JobMetrics, cores_per_host: f64) -> bool {
    job.consumers.iter().all(|c| {
        let Some(idle) = c.host_idle_cores.filter(|i| i.is_finite()) else { return true };
        let finishing_now = match job.finishing {
            Place::Client => sane(c.finish_cores),
            Place::Workers => 0.0,
        };
        keeps_room(job.finishing, idle, finishing_now, cores_per_host)
    })
}

/// The share of `job`'s finishing the workers take at the demand, where each consumer's host
/// finishes `cores_per_host`: all of it or none, by placement's rule, but for a job whose hosts
/// make a share of its images. Such hosts give back only what they lack; and where every host
/// would have cores to spare beyond the share's band, the share grows into them (up to all the
/// images), and the workers take less than none: a negative share, the part of the finishing's
/// cost the hosts add.
fn workers_take(job: &JobMetrics, cores_per_host: f64) -> f64 {
    let share = job.image_share;
    if !(job.finishing == Place::Client && share > 0.0 && cores_per_host > 0.0) {
        return if hosts_have_room(job, cores_per_host) { 0.0 } else { 1.0 };
    }
    // Each host's room for finishing at the demand: its idle cores and what it finishes now,
    // less the idle cores the share steers it to. The host with the least room decides, as it
    // does for the share.
    let rooms: Vec<Option<f64>> = job
        .consumers
        .iter()
        .map(|c| {
            let idle = c.host_idle_cores.filter(|i| i.is_finite())?;
            Some(idle + sane(c.finish_cores) - IMAGE_TARGET_IDLE_CORES)
        })
        .collect();
    let least = rooms.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    if least < cores_per_host {
        return ((cores_per_host - least.max(0.0)) / cores_per_host).clamp(0.0, 1.0);
    }
    // Room to spare: the share grows only while every host is measured and above the band, and
    // by no more than the rest of the images. A whole share costs a host `cores_per_host /
    // share` (it counts the normalization too), so the rest costs `(1 − share) / share` of the
    // finishing now.
    if rooms.iter().any(Option::is_none) || share >= 1.0 {
        return 0.0;
    }
    let spare = (least - IMAGE_HOLD_CORES - cores_per_host).max(0.0) / cores_per_host;
    -spare.min((1.0 - share) / share)
}

/// The per-worker rate to plan with, from the measured (or estimated) `per_worker` batches per
/// second; `None` when nothing defers finishing, or the batch size, the workers' cores or the
/// demand is unknown, and the rate stands as it is.
pub fn host_share(obs: &Observation, per_worker: f64) -> Option<HostShare> {
    let batch = f64::from(obs.config.elements_per_batch);
    let cores: Vec<f64> = obs.workers.iter().map(|w| f64::from(w.cores)).filter(|c| *c > 0.0).collect();
    if batch <= 0.0 || cores.is_empty() || !(per_worker > 0.0 && per_worker.is_finite()) {
        return None;
    }
    let cores = cores.iter().sum::<f64>() / cores.len() as f64;
    let demands: Vec<(f64, &JobMetrics)> =
        obs.jobs.iter().filter_map(|j| Some((job_demand(j)?, j))).filter(|(d, _)| *d > 0.0).collect();
    let total: f64 = demands.iter().map(|(d, _)| d).sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let mut cpu_per_batch = cores / per_worker;
    let (mut removed, mut added) = (0.0, 0.0);
    let mut jobs = Vec::new();
    for (demand, job) in demands {
        let Some(f) = finish_seconds_per_element(job, obs, batch) else { continue };
        let per_host_elements = match job.mode {
            JobMode::Distributed => demand * batch / job.consumers.len().max(1) as f64,
            JobMode::Replicated => demand * batch,
        };
        let cores_per_host = f * per_host_elements;
        let take = workers_take(job, cores_per_host);
        let share = demand / total * f * batch;
        if job.finishing == Place::Workers {
            removed += share;
        }
        added += share * take;
        jobs.push(JobFinishing {
            job: job.name.clone(),
            now: job.finishing,
            workers_take: take,
            demand,
            cores_per_host,
        });
    }
    if jobs.is_empty() {
        return None;
    }
    // What the workers spend finishing now cannot exceed what they spend in all, nor can the
    // hosts take more than that: a measure that says so is noise, and a tenth of the batch's CPU
    // is kept for the rest (reading, planning, sending).
    let floor = cpu_per_batch * 0.1;
    cpu_per_batch = ((cpu_per_batch - removed).max(floor) + added).max(floor);
    Some(HostShare { per_worker: cores / cpu_per_batch, jobs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{ConsumerMetrics, PoolConfig, WorkerMetrics};

    /// One job of `consumers` trainers stepping at `step` s, one 4-core worker, batches of 100:
    /// finishing costs 1 ms an element, the workers' own work 4 ms.
    fn obs(consumers: u32, step: f64, idle: Option<f64>, finishing: Place) -> Observation {
        let finish_cores = |bps: f64| if finishing == Place::Client { bps * 100.0 * 0.001 } else { 0.0 };
        let bps = 1.0 / step;
        Observation {
            workers: vec![WorkerMetrics {
                cores: 4,
                finish_seconds_per_element: if finishing == Place::Workers { 0.001 } else { 0.0 },
                ..Default::default()
            }],
            jobs: vec![JobMetrics {
                name: "train".into(),
                finishing,
                consumers: (0..consumers)
                    .map(|i| ConsumerMetrics {
                        consumer_index: i,
                        step_seconds: step,
                        batches_per_second: bps,
                        host_idle_cores: idle,
                        finish_cores: finish_cores(bps),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            config: PoolConfig { elements_per_batch: 100, ..Default::default() },
            ..Default::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn hosts_with_room_keep_the_workers_rate_and_hosts_without_it_lower_it() {
        // The workers make 10 batches/s (0.4 CPU-s each) while the clients finish.
        // Two trainers at 4 steps/s each finish 400 elements/s = 0.4 cores each: 2 idle is room.
        let share = host_share(&obs(2, 0.25, Some(2.0), Place::Client), 10.0).unwrap();
        assert!(close(share.per_worker, 10.0), "{share:?}");
        assert_eq!(share.jobs[0].at_demand(), Place::Client);
        assert!(close(share.jobs[0].cores_per_host, 0.4));
        assert!(share.describe().contains("trainer hosts finish `train` tensors"), "{}", share.describe());
        // 0.1 idle: 0.1 + 0.4 − 0.4 < 0.5, the finishing goes to the workers: 0.5 CPU-s a batch.
        let share = host_share(&obs(2, 0.25, Some(0.1), Place::Client), 10.0).unwrap();
        assert!(close(share.per_worker, 8.0), "{share:?}");
        assert!(share.describe().contains("lack the idle cores"), "{}", share.describe());
    }

    #[test]
    fn a_demand_the_hosts_cannot_finish_counts_the_finishing_on_the_workers() {
        let share = host_share(&obs(2, 0.25, Some(1.2), Place::Client), 10.0).unwrap();
        assert_eq!(share.jobs[0].at_demand(), Place::Client, "at 4 steps/s there is room");
        // The trainers now step 4× faster but still receive 4 batches/s each (they wait): at
        // the demand each finishes 1,600 elements/s, 1.6 cores, and 1.2 idle + 0.4 finishing
        // now leaves nothing.
        let mut o = obs(2, 0.0625, Some(1.2), Place::Client);
        o.jobs[0].consumers.iter_mut().for_each(|c| {
            c.batches_per_second = 4.0;
            c.finish_cores = 0.4;
        });
        let share = host_share(&o, 10.0).unwrap();
        assert!(close(share.jobs[0].cores_per_host, 1.6));
        assert_eq!(share.jobs[0].at_demand(), Place::Workers);
        assert!(close(share.per_worker, 8.0));
    }

    #[test]
    fn hosts_that_make_images_give_back_only_what_they_lack_at_the_demand() {
        // Half the images on the hosts: finishing costs 1 ms an element (as above), 0.4 cores a
        // host at 4 batches/s. The trainers would step 4× faster: 1.6 cores a host.
        let at = |idle: f64| {
            let mut o = obs(2, 0.0625, Some(idle), Place::Client);
            o.jobs[0].image_share = 0.5;
            o.jobs[0].consumers.iter_mut().for_each(|c| {
                c.batches_per_second = 4.0;
                c.finish_cores = 0.4;
            });
            host_share(&o, 10.0).unwrap()
        };
        // 2.45 idle + 0.4 finishing − 1.0 target = 1.85 cores of room: all of it stays, and
        // within the band's 0.25 the share holds.
        let roomy = at(2.45);
        assert_eq!((roomy.jobs[0].at_demand(), roomy.jobs[0].workers_take), (Place::Client, 0.0));
        assert!(close(roomy.per_worker, 10.0), "{roomy:?}");
        // 1.8 idle: 1.2 cores of room for 1.6: the workers take a quarter, 0.025 CPU-s a batch
        // more (0.1 for all of it), where the rule for the normalization alone gave all back.
        let short = at(1.8);
        assert_eq!(short.jobs[0].at_demand(), Place::Client);
        assert!(close(short.jobs[0].workers_take, 0.25), "{short:?}");
        assert!(close(short.per_worker, 4.0 / 0.425), "{short:?}");
        assert!(short.describe().contains("the workers 25% of that work"), "{}", short.describe());
        // No room at all: everything goes back, as for the normalization.
        let busy = at(0.2);
        assert_eq!((busy.jobs[0].at_demand(), busy.jobs[0].workers_take), (Place::Workers, 1.0));
        assert!(close(busy.per_worker, 8.0), "{busy:?}");
    }

    #[test]
    fn hosts_with_cores_to_spare_make_more_of_the_images_up_to_all_of_them() {
        // As above: half the images on the hosts, 1.6 cores a host at the demand.
        let at = |share: f64, idle: [Option<f64>; 2]| {
            let mut o = obs(2, 0.0625, None, Place::Client);
            o.jobs[0].image_share = share;
            o.jobs[0].consumers.iter_mut().zip(idle).for_each(|(c, idle)| {
                c.batches_per_second = 4.0;
                c.finish_cores = 0.4;
                c.host_idle_cores = idle;
            });
            host_share(&o, 10.0).unwrap()
        };
        // 3.25 idle: 2.65 room, 0.8 beyond the band and the 1.6 at the demand, half of 1.6 more:
        // the workers spend 0.05 CPU-s a batch less (0.1 for all the finishing).
        let more = at(0.5, [Some(3.25), Some(4.0)]);
        assert!(close(more.jobs[0].workers_take, -0.5), "{more:?}");
        assert_eq!(more.jobs[0].at_demand(), Place::Client);
        assert!(close(more.per_worker, 4.0 / 0.35), "{more:?}");
        assert!(
            more.describe().contains("would make more of `train`'s images, 50% more work"),
            "{}",
            more.describe()
        );
        // Hosts with 8 idle cores: the rest of the images, no more (a whole share costs twice
        // what half of it does).
        let all = at(0.5, [Some(8.0), Some(8.0)]);
        assert!(close(all.jobs[0].workers_take, -1.0), "{all:?}");
        assert!(close(all.per_worker, 4.0 / 0.3), "{all:?}");
        // A host that does not measure gets none; a share of 1 has none left to take.
        assert_eq!(at(0.5, [Some(8.0), None]).jobs[0].workers_take, 0.0);
        assert_eq!(at(1.0, [Some(8.0), Some(8.0)]).jobs[0].workers_take, 0.0);
        // The host with the least room decides: 1.8 idle here is short, as alone.
        assert!(close(at(0.5, [Some(8.0), Some(1.8)]).jobs[0].workers_take, 0.25));
    }

    #[test]
    fn finishing_on_the_workers_with_idle_hosts_counts_the_hosts_cores() {
        // The workers finish now, 0.5 CPU-s a batch (8/s); hosts with 2 idle cores take 0.4 each
        // with the margin to spare, so the workers will make 10/s.
        let share = host_share(&obs(2, 0.25, Some(2.0), Place::Workers), 8.0).unwrap();
        assert_eq!(share.jobs[0].at_demand(), Place::Client);
        assert!(close(share.per_worker, 10.0), "{share:?}");
        // Hosts at 1.0 idle: 1.0 − 0.4 is under reserve plus margin; it stays on the workers.
        let share = host_share(&obs(2, 0.25, Some(1.0), Place::Workers), 8.0).unwrap();
        assert!(close(share.per_worker, 8.0), "{share:?}");
    }

    #[test]
    fn unmeasured_hosts_have_room_and_replicas_each_finish_every_batch() {
        let share = host_share(&obs(2, 0.25, None, Place::Workers), 8.0).unwrap();
        assert!(close(share.per_worker, 10.0));
        // Replicated: each of 4 trainers finishes all 4 batches/s (0.4 cores), not a quarter.
        let mut o = obs(4, 0.25, Some(0.85), Place::Client);
        o.jobs[0].mode = JobMode::Replicated;
        let share = host_share(&o, 10.0).unwrap();
        assert!(close(share.jobs[0].cores_per_host, 0.4));
        assert_eq!(share.jobs[0].at_demand(), Place::Client, "0.85 + 0.4 − 0.4 ≥ 0.5");
    }

    #[test]
    fn nothing_to_count_without_finishing_batch_size_cores_or_demand() {
        let mut none = obs(2, 0.25, Some(2.0), Place::Client);
        none.jobs[0].consumers.iter_mut().for_each(|c| c.finish_cores = 0.0);
        assert_eq!(host_share(&none, 10.0), None, "nothing deferred");
        let mut no_batch = obs(2, 0.25, Some(2.0), Place::Client);
        no_batch.config.elements_per_batch = 0;
        assert_eq!(host_share(&no_batch, 10.0), None);
        let mut no_cores = obs(2, 0.25, Some(2.0), Place::Client);
        no_cores.workers[0].cores = 0;
        assert_eq!(host_share(&no_cores, 10.0), None);
        let mut no_demand = obs(2, 0.25, Some(2.0), Place::Client);
        no_demand.jobs[0].consumers.iter_mut().for_each(|c| c.step_seconds = 0.0);
        assert_eq!(host_share(&no_demand, 10.0), None);
        assert_eq!(host_share(&obs(2, 0.25, Some(2.0), Place::Client), f64::NAN), None);
    }

    #[test]
    fn a_finishing_measure_larger_than_the_batch_leaves_a_floor() {
        // The workers "spend" 5 CPU-s a batch finishing but 0.5 in all: noise; the rate stays
        // finite and positive.
        let mut o = obs(2, 0.25, Some(2.0), Place::Workers);
        o.workers[0].finish_seconds_per_element = 0.05;
        let share = host_share(&o, 8.0).unwrap();
        assert!(share.per_worker.is_finite() && share.per_worker > 0.0);
    }
}
