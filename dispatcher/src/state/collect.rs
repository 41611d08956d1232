//! Collecting jobs nobody reads, as tf.data's job GC: a job with no consumer reading it (none
//! registered, or every one gone or finished) and no client request for
//! [`super::Timing::job_gc_ms`] goes, with its progress and leases. The collection is journaled,
//! so a restarted dispatcher does not bring the job back. A pipeline at
//! [`MAX_JOBS_PER_PIPELINE`] collects its longest-idle unread job early to make room.

use super::consumers::MAX_JOBS_PER_PIPELINE;
use super::{DispatchError, Event, Job, State};

impl Job {
    /// Whether a consumer still reads the job: registered, and neither gone nor finished.
    pub(crate) fn read(&self) -> bool {
        self.consumers.values().any(|c| !c.gone && !c.finished)
    }
}

impl State {
    /// Collects every job unread for longer than [`super::Timing::job_gc_ms`].
    pub(crate) fn collect_jobs(&mut self, now: u64) {
        let gc = self.timing.job_gc_ms;
        let idle: Vec<(String, String)> = self
            .pipelines
            .iter()
            .flat_map(|(name, p)| {
                p.jobs
                    .iter()
                    .filter(|(_, j)| !j.read() && now.saturating_sub(j.last_alive) > gc)
                    .map(move |(job, _)| (name.clone(), job.clone()))
            })
            .collect();
        for (pipeline, job) in idle {
            tracing::info!(%pipeline, %job, idle_ms = gc, "job collected: no client read it");
            self.collect_job(&pipeline, &job);
        }
    }

    fn collect_job(&mut self, pipeline: &str, job: &str) {
        self.events.push(Event::JobCollected { pipeline: pipeline.to_string(), job: job.to_string() });
        self.drop_job(pipeline, job);
    }

    /// Removes a job, its progress and its consumers; its leases end (their workers hear they
    /// were revoked at their next renewal).
    pub(crate) fn drop_job(&mut self, pipeline: &str, job: &str) {
        let Some(p) = self.pipelines.get_mut(pipeline) else { return };
        if p.jobs.remove(job).is_none() {
            return;
        }
        let ended: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.pipeline == pipeline && l.job == job)
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            let Some(lease) = self.leases.remove(&id) else { continue };
            if let Some(worker) = self.workers.get_mut(&lease.worker) {
                worker.leases.remove(&id);
            }
            self.cache_release(&lease.pipeline, lease.cache.as_ref(), lease.replay.split, id);
        }
    }

    /// Before `job` is created in `pipeline`: at [`MAX_JOBS_PER_PIPELINE`] jobs, collects the one
    /// idle longest among those unread and silent past the client timeout; refuses when every
    /// job is read.
    pub(crate) fn make_room_for(&mut self, pipeline: &str, job: &str, now: u64) -> Result<(), DispatchError> {
        let Some(p) = self.pipelines.get(pipeline) else { return Ok(()) };
        if p.jobs.len() < MAX_JOBS_PER_PIPELINE || p.jobs.contains_key(job) {
            return Ok(());
        }
        let timeout = self.timing.client_timeout_ms;
        let idlest = p
            .jobs
            .iter()
            .filter(|(_, j)| !j.read() && now.saturating_sub(j.last_alive) > timeout)
            .min_by_key(|(_, j)| j.last_alive)
            .map(|(name, _)| name.clone());
        match idlest {
            Some(idlest) => {
                tracing::info!(%pipeline, job = %idlest, "job collected early: its pipeline is full");
                self.collect_job(pipeline, &idlest);
                Ok(())
            }
            None => Err(DispatchError::ResourceExhausted(format!(
                "pipeline `{pipeline}` already has {MAX_JOBS_PER_PIPELINE} jobs, each read in the last \
                 {timeout} ms: the most one pipeline holds; have the trainers of one run share a job \
                 name, or wait until unread jobs are collected"
            ))),
        }
    }
}
