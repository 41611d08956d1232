//! Turning the simulated state into an [`Observation`], with seeded multiplicative noise on every
//! measured value, exactly as the dispatcher would report it.

use rand_chacha::rand_core::Rng;

use super::world::World;
use crate::inputs::{ConsumerMetrics, JobMetrics, JobMode, Observation, StageTime, WorkerMetrics};

/// Payload bytes per element (a decoded, cropped 224×224×3 `uint8` image).
const BYTES_PER_ELEMENT: f64 = 150_528.0;

impl World<'_> {
    /// A factor uniform in `1 ± noise`.
    fn noise(&mut self) -> f64 {
        let a = self.s.noise;
        if a <= 0.0 {
            return 1.0;
        }
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + a * (2.0 * u - 1.0)
    }

    /// The observation at the current time; starts a new measuring interval.
    pub(crate) fn observe(&mut self) -> Observation {
        let s = self.s;
        let interval = (self.t - self.interval_start).max(f64::MIN_POSITIVE);
        let running = self.running();
        let b = f64::from(s.elements_per_batch);
        let at_workers: f64 = self
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| (job.buffered - f64::from(s.prefetch_batches * s.jobs[j].consumers)).max(0.0))
            .sum();
        let buffered_parts = if running > 0 { (at_workers / f64::from(running)).round() as u32 } else { 0 };
        let active = self.active();
        let active_jobs = active.iter().filter(|a| **a).count() as u32;
        let t = self.t;
        // The share of the images the hosts make, over the jobs the workers produce for.
        let phase = s.phase_at(t);
        let (mut demand, mut made) = (0.0, 0.0);
        for (j, job) in self.jobs.iter().enumerate().filter(|(j, _)| active[*j]) {
            let d = s.job_demand(j, phase);
            demand += d;
            made += d * job.image_share;
        }
        let image_share = if demand > 0.0 { made / demand } else { 0.0 };
        let mut workers = Vec::new();
        for i in 0..self.workers.len() {
            if self.workers[i].ready_at > t {
                continue;
            }
            let w = &self.workers[i];
            let (rate, used) =
                if w.alive_s > 0.0 { (w.produced / w.alive_s, w.cpu_s / w.alive_s) } else { (0.0, 0.0) };
            // Per element it finished: the finishing's cost, when it finished any.
            let finish = if w.finish_cpu_s > 0.0 { s.finish_cpu_seconds_per_batch / b.max(1.0) } else { 0.0 };
            let out = rate * self.noise();
            let cores = f64::from(s.cores_per_worker);
            let cpu = (used * self.noise()).min(cores);
            // No draw for what is not measured: scenarios without finishing keep their noise.
            let finish_seconds_per_element = if finish > 0.0 { finish * self.noise() } else { 0.0 };
            // The stages' time per element it produced: less the images the hosts made (spread
            // over the stages, whose sum is what the autoscaler reads).
            let stages_cost = s.cpu_seconds_per_batch();
            let scale = if stages_cost > 0.0 {
                (stages_cost - s.image_cpu_seconds_per_batch() * image_share) / stages_cost
            } else {
                1.0
            };
            let stages = (0..s.stages.len())
                .map(|k| StageTime {
                    stage: s.stages[k].name.clone(),
                    seconds_per_element: s.stages[k].cpu_seconds_per_batch * scale / b.max(1.0)
                        * self.noise(),
                })
                .collect();
            workers.push(WorkerMetrics {
                elements_per_second: out * b,
                batches_per_second: out,
                bytes_per_second: out * b * BYTES_PER_ELEMENT,
                stages,
                buffered_parts: buffered_parts.min(s.buffer_parts_per_worker),
                buffer_capacity: s.buffer_parts_per_worker,
                active_leases: active_jobs,
                cpu_cores_used: cpu,
                cores: s.cores_per_worker,
                finish_seconds_per_element,
            });
        }
        for w in &mut self.workers {
            w.produced = 0.0;
            w.alive_s = 0.0;
            w.cpu_s = 0.0;
            w.finish_cpu_s = 0.0;
        }
        let mut jobs = Vec::new();
        for (j, _) in active.iter().enumerate().filter(|(_, a)| **a) {
            jobs.push(self.job_metrics(j, interval));
        }
        for job in &mut self.jobs {
            job.consumed_interval = 0.0;
            job.compute_interval = 0.0;
            job.wait_interval = 0.0;
        }
        self.interval_start = self.t;
        Observation {
            now_s: self.t,
            running_workers: running,
            desired_workers: self.target,
            workers,
            jobs,
            config: s.config.clone(),
        }
    }

    /// What job `j`'s consumers report over the last `interval` seconds.
    fn job_metrics(&mut self, j: usize, interval: f64) -> JobMetrics {
        let spec = &self.s.jobs[j];
        let job = self.jobs[j].clone();
        let k = f64::from(spec.consumers.max(1));
        // Batches each consumer received: a share when distributed, all when replicated.
        let per_consumer = match spec.mode {
            JobMode::Distributed => 1.0 / k,
            JobMode::Replicated => 1.0,
        };
        let steps = job.consumed_interval * per_consumer;
        let prefetched = job.buffered.min(f64::from(self.s.prefetch_batches) * k);
        let idle = self.measured_idle(j);
        let mut consumers = Vec::new();
        for c in 0..spec.consumers {
            let (step, wait) = if steps > 1e-9 {
                (job.compute_interval / steps * self.noise(), job.wait_interval / steps * self.noise())
            } else {
                (0.0, interval)
            };
            consumers.push(ConsumerMetrics {
                consumer_index: c,
                step_seconds: step,
                wait_seconds: wait,
                buffered_batches: (prefetched / k).round() as u32,
                prefetch_batches: self.s.prefetch_batches,
                batches_total: (job.consumed * per_consumer).floor() as u64,
                batches_per_second: steps / interval,
                host_idle_cores: idle.map(|i| i * self.noise()),
                finish_cores: if job.finish_cores > 0.0 { job.finish_cores * self.noise() } else { 0.0 },
            });
        }
        JobMetrics {
            name: spec.name.clone(),
            mode: spec.mode,
            epoch: u32::try_from((job.consumed / spec.batches_per_epoch.max(1) as f64).floor() as u64)
                .unwrap_or(u32::MAX),
            batches_per_epoch: spec.batches_per_epoch,
            consumers,
            finishing: job.place,
            image_share: job.image_share,
        }
    }
}
