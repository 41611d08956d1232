//! The simulated pool: workers that start after a delay and produce at their CPU capacity into
//! per-job buffers, and trainers that consume at their step rate and wait when the buffers are
//! empty. Advanced in fixed ticks.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use super::scenario::Scenario;

/// One worker.
#[derive(Clone, Debug)]
pub(crate) struct SimWorker {
    /// When it starts producing.
    pub(crate) ready_at: f64,
    /// Batches produced since the last observation.
    pub(crate) produced: f64,
    /// Seconds it was running since the last observation.
    pub(crate) alive_s: f64,
}

/// One job and its trainers.
#[derive(Clone, Debug, Default)]
pub(crate) struct SimJob {
    /// Batches ready for it (worker buffers and client prefetch together).
    pub(crate) buffered: f64,
    /// Batches consumed so far.
    pub(crate) consumed: f64,
    /// Batches consumed since the last observation.
    pub(crate) consumed_interval: f64,
    /// Trainer seconds computing / waiting since the last observation.
    pub(crate) compute_interval: f64,
    pub(crate) wait_interval: f64,
    /// Trainer seconds computing / waiting in total.
    pub(crate) compute_total: f64,
    pub(crate) wait_total: f64,
    /// When it consumed its last batch.
    pub(crate) done_at: Option<f64>,
    /// When its trainers connected, and how many workers ran then.
    pub(crate) arrived: Option<(f64, u32)>,
    /// When it received its first batch.
    pub(crate) first_batch_at: Option<f64>,
}

/// The whole simulated system.
pub(crate) struct World<'s> {
    pub(crate) s: &'s Scenario,
    pub(crate) t: f64,
    pub(crate) workers: Vec<SimWorker>,
    pub(crate) target: u32,
    pub(crate) jobs: Vec<SimJob>,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) worker_seconds: f64,
    pub(crate) interval_start: f64,
}

/// Most workers the simulator will hold, whatever a policy asks.
const MAX_SIM_WORKERS: u32 = 4096;

/// Max-min fair split of `capacity` over `needs`.
fn waterfill(capacity: f64, needs: &[f64]) -> Vec<f64> {
    let mut alloc = vec![0.0; needs.len()];
    let mut left = capacity.max(0.0);
    let mut open: Vec<usize> = (0..needs.len()).filter(|&i| needs[i] > 0.0).collect();
    for _ in 0..needs.len() {
        if open.is_empty() || left <= 0.0 {
            break;
        }
        let share = left / open.len() as f64;
        let mut still = Vec::with_capacity(open.len());
        for i in open {
            let give = share.min(needs[i] - alloc[i]);
            alloc[i] += give;
            left -= give;
            if needs[i] - alloc[i] > 1e-12 {
                still.push(i);
            }
        }
        open = still;
    }
    alloc
}

impl<'s> World<'s> {
    /// Time 0: the initial workers running, empty buffers.
    pub(crate) fn new(s: &'s Scenario) -> World<'s> {
        let n = s.initial_workers.min(MAX_SIM_WORKERS);
        World {
            s,
            t: 0.0,
            workers: (0..n).map(|_| SimWorker { ready_at: 0.0, produced: 0.0, alive_s: 0.0 }).collect(),
            target: n,
            jobs: vec![SimJob::default(); s.jobs.len()],
            rng: ChaCha8Rng::seed_from_u64(s.seed),
            worker_seconds: 0.0,
            interval_start: 0.0,
        }
    }

    /// Workers producing now.
    pub(crate) fn running(&self) -> u32 {
        let n = self.workers.iter().filter(|w| w.ready_at <= self.t).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether job `j`'s trainers have connected and still consume.
    pub(crate) fn is_active(&self, j: usize) -> bool {
        let started = self.s.jobs.get(j).is_some_and(|spec| spec.start_s <= self.t);
        started && self.jobs.get(j).is_some_and(|job| job.done_at.is_none())
    }

    /// Which jobs consume now.
    pub(crate) fn active(&self) -> Vec<bool> {
        (0..self.jobs.len()).map(|j| self.is_active(j)).collect()
    }

    /// Jobs whose trainers have connected by now, done ones included.
    pub(crate) fn arrived(&self) -> usize {
        self.s.jobs.iter().filter(|spec| spec.start_s <= self.t).count()
    }

    /// True when every job is done.
    pub(crate) fn all_done(&self) -> bool {
        self.jobs.iter().all(|j| j.done_at.is_some())
    }

    /// Asks for `n` workers: new ones start after the delay; removals take starting ones first.
    pub(crate) fn scale_to(&mut self, n: u32) {
        let n = n.min(MAX_SIM_WORKERS) as usize;
        self.target = n as u32;
        let ready_at = self.t + self.s.startup_delay_s;
        while self.workers.len() < n {
            self.workers.push(SimWorker { ready_at, produced: 0.0, alive_s: 0.0 });
        }
        // Latest-starting last, so truncation removes starting workers first.
        self.workers.sort_by(|a, b| a.ready_at.total_cmp(&b.ready_at));
        self.workers.truncate(n);
    }

    /// Total demand (batches/s) of the active jobs now.
    pub(crate) fn demand(&self) -> f64 {
        let phase = self.s.phase_at(self.t);
        (0..self.jobs.len()).filter(|&j| self.is_active(j)).map(|j| self.s.job_demand(j, phase)).sum()
    }

    /// Advances one tick.
    pub(crate) fn tick(&mut self) {
        let s = self.s;
        let dt = s.tick_s;
        let phase = s.phase_at(self.t);
        let running = self.running();
        let capacity = f64::from(running) * s.worker_capacity() * dt;
        let active = self.active();
        let n_active = active.iter().filter(|a| **a).count().max(1) as f64;
        let mut wanted = vec![0.0; self.jobs.len()];
        let mut needs = vec![0.0; self.jobs.len()];
        for (j, job) in self.jobs.iter_mut().enumerate() {
            if !active[j] {
                continue;
            }
            job.arrived.get_or_insert((self.t, running));
            let remaining = (s.jobs[j].batches as f64 - job.consumed).max(0.0);
            wanted[j] = (s.job_demand(j, phase) * dt).min(remaining);
            let room = f64::from(running) * f64::from(s.buffer_parts_per_worker) / n_active
                + f64::from(s.prefetch_batches * s.jobs[j].consumers);
            needs[j] = (room - job.buffered).max(0.0) + wanted[j];
        }
        let produced = waterfill(capacity, &needs);
        for (j, job) in self.jobs.iter_mut().enumerate() {
            if !active[j] {
                continue;
            }
            let rate = s.job_demand(j, phase);
            let available = job.buffered + produced[j];
            let taken = wanted[j].min(available);
            job.buffered = available - taken;
            job.consumed += taken;
            job.consumed_interval += taken;
            if taken > 0.0 && job.first_batch_at.is_none() {
                // The first batch arrives within the tick, after the waiting part of it.
                job.first_batch_at = Some(self.t + (wanted[j] - taken) / rate.max(f64::MIN_POSITIVE));
            }
            let (compute, wait) =
                if rate > 0.0 { (taken / rate, (wanted[j] - taken) / rate) } else { (0.0, dt) };
            job.compute_interval += compute;
            job.wait_interval += wait;
            job.compute_total += compute;
            job.wait_total += wait;
            if job.consumed >= s.jobs[j].batches as f64 - 1e-9 {
                job.done_at = Some(self.t + compute + wait);
            }
        }
        let total: f64 = produced.iter().sum();
        let per_worker = if running > 0 { total / f64::from(running) } else { 0.0 };
        for w in self.workers.iter_mut().filter(|w| w.ready_at <= self.t) {
            w.produced += per_worker;
            w.alive_s += dt;
        }
        self.worker_seconds += self.workers.len() as f64 * dt;
        self.t += dt;
    }

    /// Share of trainer time spent waiting, over all jobs so far.
    pub(crate) fn wait_fraction(&self) -> f64 {
        let wait: f64 = self.jobs.iter().map(|j| j.wait_total).sum();
        let compute: f64 = self.jobs.iter().map(|j| j.compute_total).sum();
        if wait + compute > 0.0 { wait / (wait + compute) } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waterfill_is_max_min_fair() {
        assert_eq!(waterfill(10.0, &[2.0, 20.0]), vec![2.0, 8.0]);
        assert_eq!(waterfill(10.0, &[20.0, 20.0]), vec![5.0, 5.0]);
        assert_eq!(waterfill(10.0, &[1.0, 2.0]), vec![1.0, 2.0]);
    }

    #[test]
    fn workers_start_after_the_delay() {
        let s = crate::simulate::catalog::all().remove(0);
        let mut w = World::new(&s);
        w.scale_to(3);
        assert_eq!(w.running(), 1);
        for _ in 0..15 {
            w.tick();
        }
        assert_eq!(w.running(), 3);
        w.scale_to(2);
        assert_eq!(w.running(), 2);
    }
}
