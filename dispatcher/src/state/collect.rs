//! Collecting jobs nobody reads, as tf.data's job GC: a job with no consumer reading it (none
//! registered, or every one gone or finished) and no client request for
//! [`super::Timing::job_gc_ms`] goes, with its progress and leases. The collection of a journaled
//! job is journaled, so a restarted dispatcher does not bring it back (a job is journaled with its
//! first lease; one never leased leaves no record either way). A pipeline at
//! [`MAX_JOBS_PER_PIPELINE`] collects its longest-idle unread job early to make room, or a batch of
//! jobs nothing was produced for and nobody asks for (see `State::make_room_for`).

use super::consumers::MAX_JOBS_PER_PIPELINE;
use super::{DispatchError, Event, Job, SplitStatus, State};

/// Most jobs nothing was produced for that a full pipeline collects at once to make room.
pub(crate) const UNPRODUCED_BATCH: usize = MAX_JOBS_PER_PIPELINE / 16;

impl Job {
    /// Whether a consumer still reads the job: registered, and neither gone nor finished.
    pub(crate) fn read(&self) -> bool {
        self.consumers.values().any(|c| !c.gone && !c.finished)
    }

    /// Whether every consumer the job declared finished all `epochs`. Consumers are not
    /// journaled: a restarted dispatcher knows none until they register again, and finished ones
    /// never do. For a job with no consumer it tells from the journaled splits instead (see
    /// [`Job::delivered_every_epoch`]), so a completed pipeline stays completed across a restart.
    pub(crate) fn complete(&self, epochs: u32) -> bool {
        if self.consumers.is_empty() {
            return self.delivered_every_epoch(epochs);
        }
        self.settings.consumers > 0
            && self.consumers.values().filter(|c| c.finished).count() >= self.settings.consumers as usize
    }

    /// Whether the job delivered its last epoch: every split of every epoch it still tracks is
    /// done (a split is done once every consumer stream took its parts; epochs every consumer
    /// had passed were dropped), the last of `epochs` among them, and no replay is owed.
    pub(crate) fn delivered_every_epoch(&self, epochs: u32) -> bool {
        let Some(last) = epochs.checked_sub(1) else { return false };
        self.replays.is_empty()
            && self.epochs.contains_key(&last)
            && self
                .epochs
                .values()
                .all(|e| e.plan.order().iter().all(|&s| e.status.get(s) == SplitStatus::Done))
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
        let Some(p) = self.pipelines.get_mut(pipeline) else { return };
        let Some(j) = p.jobs.get(job) else { return };
        let journaled = j.journaled;
        p.last_collected_complete = j.complete(p.facts.epochs);
        if journaled {
            self.events.push(Event::JobCollected { pipeline: pipeline.to_string(), job: job.to_string() });
        }
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
    /// idle longest among those unread and silent past the client timeout; else, up to
    /// [`UNPRODUCED_BATCH`] of those nothing was ever produced for and no consumer asks data of,
    /// idle longest first (collecting them loses no progress: a client of one registers again
    /// and makes it anew; taking a batch, a flood of such joins looks over the jobs once per
    /// batch, not once per join). Refuses when every job is read or asked for.
    pub(crate) fn make_room_for(&mut self, pipeline: &str, job: &str, now: u64) -> Result<(), DispatchError> {
        let Some(p) = self.pipelines.get(pipeline) else { return Ok(()) };
        if p.jobs.len() < MAX_JOBS_PER_PIPELINE || p.jobs.contains_key(job) {
            return Ok(());
        }
        let timing = self.timing;
        let timeout = timing.client_timeout_ms;
        let silent = p
            .jobs
            .iter()
            .filter(|(_, j)| !j.read() && now.saturating_sub(j.last_alive) > timeout)
            .min_by_key(|(_, j)| j.last_alive)
            .map(|(name, _)| name.clone());
        if let Some(idlest) = silent {
            tracing::info!(%pipeline, job = %idlest, "job collected early: its pipeline is full");
            self.collect_job(pipeline, &idlest);
            return Ok(());
        }
        let mut unproduced: Vec<(u64, &String)> = p
            .jobs
            .iter()
            .filter(|(_, j)| !j.journaled && !j.wanted(now, &timing))
            .map(|(name, j)| (j.last_alive, name))
            .collect();
        if unproduced.is_empty() {
            return Err(DispatchError::ResourceExhausted(format!(
                "pipeline `{pipeline}` already has {MAX_JOBS_PER_PIPELINE} jobs, each read in the last \
                 {timeout} ms or asking for data: the most one pipeline holds; have the trainers of one \
                 run share a job name, or wait until unread jobs are collected"
            )));
        }
        let batch = UNPRODUCED_BATCH.min(unproduced.len());
        unproduced.select_nth_unstable(batch - 1);
        let names: Vec<String> = unproduced[..batch].iter().map(|(_, name)| (*name).clone()).collect();
        tracing::info!(%pipeline, jobs = batch, "jobs nothing was produced for collected early: the pipeline is full");
        for name in names {
            self.collect_job(pipeline, &name);
        }
        Ok(())
    }
}
