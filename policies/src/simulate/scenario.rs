//! A simulated workload: jobs and their trainers' step times over time, the pipeline's cost, the
//! worker pool's properties, and the bounds and prices.

use serde::{Deserialize, Serialize};

use crate::counts::count_at_least;
use crate::granary::cost;
use crate::image_placement::IMAGE_TARGET_IDLE_CORES;
use crate::inputs::{JobMode, PoolConfig};
use crate::placement::{self, Place};

/// One stage of the pipeline and its CPU cost per batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    /// Stage name.
    pub name: String,
    /// CPU seconds one batch costs in this stage.
    pub cpu_seconds_per_batch: f64,
}

/// One job reading from the pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job name.
    pub name: String,
    /// Its consumers (data-parallel peers when distributed).
    pub consumers: u32,
    /// Distributed or replicated.
    pub mode: JobMode,
    /// Batches the job consumes before it is done.
    pub batches: u64,
    /// Batches in one epoch.
    pub batches_per_epoch: u64,
    /// When its trainers connect, in seconds from the start (they leave when it is done).
    #[serde(default)]
    pub start_s: f64,
}

/// From `start_s` on, each job's trainer step time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Start of the phase in seconds.
    pub start_s: f64,
    /// Seconds per step of each job's consumers, in job order.
    pub step_seconds: Vec<f64>,
    /// Idle cores of each job's trainer hosts (every consumer's host alike), in job order,
    /// before they finish anything; a job without an entry has hosts that cannot measure them.
    #[serde(default)]
    pub host_idle_cores: Vec<f64>,
}

/// A complete workload for the simulator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// Short name (`steady`, `demand-double`, …).
    pub name: String,
    /// One line on what it tests.
    pub description: String,
    /// The jobs sharing the pool.
    pub jobs: Vec<JobSpec>,
    /// Step-time phases, by start time; the first starts at 0.
    pub phases: Vec<Phase>,
    /// The pipeline's stages, on the workers.
    pub stages: Vec<StageSpec>,
    /// CPU seconds per batch of the finishing (the final `float32` normalization) that
    /// placement runs in the trainers' clients while their hosts have room for it, and on the
    /// workers otherwise; 0 when the pipeline leaves none.
    #[serde(default)]
    pub finish_cpu_seconds_per_batch: f64,
    /// CPU seconds per batch of the stages' fused image run (decode, crop) that placement of the
    /// image run can leave to the trainers' hosts, the share of the images placement gives them
    /// (part of the stages' cost, not added to it); 0 when the pipeline has none.
    #[serde(default)]
    pub image_cpu_seconds_per_batch: f64,
    /// Elements per batch.
    pub elements_per_batch: u32,
    /// Cores per worker.
    pub cores_per_worker: u32,
    /// Seconds from asking for a worker until it produces.
    pub startup_delay_s: f64,
    /// Batch parts a worker may hold for consumers.
    pub buffer_parts_per_worker: u32,
    /// Batches each consumer prefetches.
    pub prefetch_batches: u32,
    /// Relative amplitude of the multiplicative metric noise (uniform in `1 ± noise`).
    pub noise: f64,
    /// Seed of the noise.
    pub seed: u64,
    /// Workers running at time 0.
    pub initial_workers: u32,
    /// Bounds and prices.
    pub config: PoolConfig,
    /// Simulation step in seconds.
    pub tick_s: f64,
    /// Seconds between policy evaluations.
    pub policy_period_s: f64,
    /// The simulation stops here even if training has not finished (and after 10⁶ ticks).
    pub max_duration_s: f64,
}

impl Scenario {
    /// CPU seconds per batch over all stages.
    pub fn cpu_seconds_per_batch(&self) -> f64 {
        self.stages.iter().map(|s| s.cpu_seconds_per_batch.max(0.0)).sum()
    }

    /// Batches per second one worker makes on all its cores.
    pub fn worker_capacity(&self) -> f64 {
        let cpu = self.cpu_seconds_per_batch();
        if cpu > 0.0 { f64::from(self.cores_per_worker) / cpu } else { 0.0 }
    }

    /// Index of the phase in force at `t`.
    pub fn phase_at(&self, t: f64) -> usize {
        self.phases.iter().rposition(|p| p.start_s <= t).unwrap_or(0)
    }

    /// End of phase `i` (infinite for the last).
    pub fn phase_end(&self, i: usize) -> f64 {
        self.phases.get(i + 1).map_or(f64::INFINITY, |p| p.start_s)
    }

    /// Batches per second job `j` takes in phase `phase` when it never waits.
    pub fn job_demand(&self, j: usize, phase: usize) -> f64 {
        let (Some(job), Some(p)) = (self.jobs.get(j), self.phases.get(phase)) else { return 0.0 };
        let step = p.step_seconds.get(j).copied().unwrap_or(0.0);
        if step <= 0.0 || !step.is_finite() {
            return 0.0;
        }
        let peers = match job.mode {
            JobMode::Distributed => f64::from(job.consumers),
            JobMode::Replicated => 1.0,
        };
        peers / step
    }

    /// Batches per second each of job `j`'s consumers takes in phase `phase` when it never
    /// waits: its share when distributed, every batch when replicated.
    pub fn consumer_demand(&self, j: usize, phase: usize) -> f64 {
        let demand = self.job_demand(j, phase);
        match self.jobs.get(j).map(|job| job.mode) {
            Some(JobMode::Distributed) => demand / f64::from(self.jobs[j].consumers.max(1)),
            _ => demand,
        }
    }

    /// Idle cores of job `j`'s trainer hosts in phase `phase`; `None` when unmeasured.
    pub fn host_idle(&self, j: usize, phase: usize) -> Option<f64> {
        self.phases.get(phase).and_then(|p| p.host_idle_cores.get(j)).copied().filter(|c| c.is_finite())
    }

    /// Where placement settles job `j`'s finishing in phase `phase` at its full demand: on the
    /// clients while their hosts keep room for it (unmeasured hosts count as room, as placement
    /// counts them), else on the workers.
    pub fn settled_place(&self, j: usize, phase: usize) -> Place {
        let need = self.finish_cpu_seconds_per_batch.max(0.0) * self.consumer_demand(j, phase);
        match self.host_idle(j, phase) {
            Some(idle) if !placement::keeps_room(Place::Client, idle, 0.0, need) => Place::Workers,
            _ => Place::Client,
        }
    }

    /// The share of job `j`'s images its hosts settle on in phase `phase` at its full demand,
    /// with its finishing at `place`: what leaves each host the share's target of idle cores
    /// once it finishes, up to all of them; none while the workers finish, or where the hosts do
    /// not measure their idle cores.
    pub fn settled_image_share(&self, j: usize, phase: usize, place: Place) -> f64 {
        let image = self.image_cpu_seconds_per_batch();
        let (Some(idle), Place::Client) = (self.host_idle(j, phase), place) else { return 0.0 };
        let demand = self.consumer_demand(j, phase);
        if image <= 0.0 || demand <= 0.0 {
            return 0.0;
        }
        let room = idle - self.finish_cpu_seconds_per_batch.max(0.0) * demand - IMAGE_TARGET_IDLE_CORES;
        (room / (image * demand)).clamp(0.0, 1.0)
    }

    /// CPU seconds per batch of the image run the hosts can make (within the stages' cost).
    pub fn image_cpu_seconds_per_batch(&self) -> f64 {
        self.image_cpu_seconds_per_batch.clamp(0.0, self.cpu_seconds_per_batch())
    }

    /// CPU seconds a worker spends on one batch of a job whose finishing runs at `place` and
    /// whose hosts make `image_share` of its images.
    pub fn cpu_seconds_per_batch_at(&self, place: Place, image_share: f64) -> f64 {
        let finish = match place {
            Place::Client => 0.0,
            Place::Workers => self.finish_cpu_seconds_per_batch.max(0.0),
        };
        self.cpu_seconds_per_batch() - image_share.clamp(0.0, 1.0) * self.image_cpu_seconds_per_batch()
            + finish
    }

    /// CPU seconds a client spends on one batch it receives: the finishing and its share of the
    /// images while the clients finish, nothing otherwise.
    pub fn client_seconds_per_batch(&self, place: Place, image_share: f64) -> f64 {
        match place {
            Place::Client => {
                self.finish_cpu_seconds_per_batch.max(0.0)
                    + image_share.clamp(0.0, 1.0) * self.image_cpu_seconds_per_batch()
            }
            Place::Workers => 0.0,
        }
    }

    /// The oracle's count for phase `phase` with the jobs marked `active`: the fewest workers
    /// within the bounds that keep every trainer from waiting, or with prices the count of least
    /// cost per batch. Each job costs the workers its finishing where placement settles it, less
    /// the share of its images its hosts settle on.
    pub fn oracle_count(&self, phase: usize, active: &[bool]) -> u32 {
        let mut demand = 0.0;
        let mut cpu = 0.0;
        let mut consumers = 0.0;
        for (j, job) in self.jobs.iter().enumerate() {
            if active.get(j).copied().unwrap_or(false) {
                let d = self.job_demand(j, phase);
                let place = self.settled_place(j, phase);
                demand += d;
                cpu += d * self.cpu_seconds_per_batch_at(place, self.settled_image_share(j, phase, place));
                consumers += f64::from(job.consumers);
            }
        }
        // Batches per second of one worker on this mix of jobs.
        let r = if demand > 0.0 && cpu > 0.0 {
            f64::from(self.cores_per_worker) * demand / cpu
        } else {
            self.worker_capacity()
        };
        let cfg = &self.config;
        let n = match cfg.prices() {
            _ if r <= 0.0 => cfg.upper(),
            Some((worker, trainer)) => {
                cost::cheapest_count(demand, r, worker, trainer * consumers, cfg.lower(), cfg.upper())
            }
            None => count_at_least(demand / r * (1.0 - 1e-9)),
        };
        cfg.clamp(n)
    }

    /// The oracle's count for phase `phase` with every job active that has started by the
    /// phase's start.
    pub fn phase_oracle(&self, phase: usize) -> u32 {
        let start = self.phases.get(phase).map_or(0.0, |p| p.start_s);
        let active: Vec<bool> = self.jobs.iter().map(|j| j.start_s <= start).collect();
        self.oracle_count(phase, &active)
    }
}
