//! The worker-facing rules: registration, heartbeats, and split leases.

use super::consumers::MAX_JOBS_PER_PIPELINE;
use super::{DispatchError, Event, LeaseEntry, MAX_SPLIT_ATTEMPTS, Replay, SplitStatus, State, WorkerEntry};
use granary_proto::v1 as pb;
use std::collections::BTreeSet;

impl State {
    /// Registers a worker (again, with the leases it holds, after a dispatcher restart). Returns
    /// its id and the held leases taken back because their split is done or leased elsewhere.
    pub fn register_worker(
        &mut self,
        req: &pb::RegisterWorkerRequest,
        now: u64,
    ) -> Result<(String, Vec<u64>), DispatchError> {
        if req.address.is_empty() {
            return Err(DispatchError::InvalidArgument(
                "`address` is empty; a worker registers the host:port clients should use".into(),
            ));
        }
        if !req.pipeline.is_empty() && !self.pipelines.contains_key(&req.pipeline) {
            tracing::info!(pipeline = %req.pipeline, "worker serves a pipeline not registered yet");
        }
        let id = if req.worker_id.is_empty() { self.fresh_id("worker") } else { req.worker_id.clone() };
        if let Some(old) = self.workers.remove(&id) {
            // The same worker again: what it no longer lists goes back to the queue.
            for lease in old.leases {
                if !req.leases.iter().any(|l| l.lease_id == lease) {
                    self.requeue(lease);
                }
            }
        }
        let pipeline = (!req.pipeline.is_empty()).then(|| req.pipeline.clone());
        self.count_worker(pipeline.as_deref(), |c| c.registrations += 1);
        self.workers.insert(
            id.clone(),
            WorkerEntry {
                address: req.address.clone(),
                metrics_address: (!req.metrics_address.is_empty()).then(|| req.metrics_address.clone()),
                pipeline,
                last_seen: now,
                leases: BTreeSet::new(),
                metrics: None,
                plans_image_shares: req.plans_image_shares,
            },
        );
        let mut revoked = Vec::new();
        for lease in &req.leases {
            if !self.adopt(&id, lease, now) {
                revoked.push(lease.lease_id);
            }
        }
        Ok((id, revoked))
    }

    /// Takes back a lease a worker held before a restart, unless the split moved on.
    fn adopt(&mut self, worker: &str, lease: &pb::Lease, now: u64) -> bool {
        if let Some(existing) = self.leases.get(&lease.lease_id) {
            return existing.worker == worker;
        }
        let Some(job) = self.pipelines.get_mut(&lease.pipeline).and_then(|p| p.jobs.get_mut(&lease.job))
        else {
            return false;
        };
        if lease.split >= job.settings.max_splits() {
            return false;
        }
        let replay = Replay { epoch: lease.epoch, split: lease.split, only: lease.only_consumer };
        if replay.only.is_none() {
            let epoch = job.epoch(lease.epoch);
            if epoch.status.get(lease.split) != SplitStatus::Pending {
                return false;
            }
            epoch.status.set(lease.split, SplitStatus::Leased(lease.lease_id));
            job.replays.retain(|r| *r != replay);
        }
        self.leases.insert(
            lease.lease_id,
            LeaseEntry {
                worker: worker.to_string(),
                pipeline: lease.pipeline.clone(),
                job: lease.job.clone(),
                replay,
                deadline: now + self.timing.lease_ms,
                cache: lease.cache.clone(),
            },
        );
        if let Some(task) = &lease.cache {
            self.adopt_cache_task(&lease.pipeline, task, lease.split, lease.lease_id);
        }
        self.next_lease = self.next_lease.max(lease.lease_id + 1);
        if let Some(w) = self.workers.get_mut(worker) {
            w.leases.insert(lease.lease_id);
        }
        true
    }

    fn worker_mut(&mut self, id: &str) -> Result<&mut WorkerEntry, DispatchError> {
        self.workers.get_mut(id).ok_or_else(|| {
            DispatchError::NotFound(format!("unknown worker `{id}`; register (again) with RegisterWorker"))
        })
    }

    /// Records a heartbeat: renews the listed leases and answers with the ones the worker lost
    /// and the consumers that will not read again (gone, or finished) of the jobs it produces
    /// for ([`State::gone_consumers`]). A finished consumer's
    /// queue can still receive replayed or duplicate parts (a resumed consumer gets replays of
    /// splits it may already have had), and nothing would drain them: a producer waiting on
    /// that full queue would hold its worker, and every job the worker serves, forever.
    pub fn worker_heartbeat(
        &mut self,
        req: &pb::WorkerHeartbeatRequest,
        now: u64,
    ) -> Result<pb::WorkerHeartbeatResponse, DispatchError> {
        let revoked = self.renew(&req.worker_id, &req.leases, now)?;
        self.worker_mut(&req.worker_id)?.metrics = req.metrics.clone();
        let gone = self.gone_consumers(&req.worker_id, &req.queued);
        Ok(pb::WorkerHeartbeatResponse { revoked, gone })
    }

    /// Extends the deadlines of `leases`; returns those the worker does not hold.
    pub fn renew(&mut self, worker: &str, leases: &[u64], now: u64) -> Result<Vec<u64>, DispatchError> {
        let deadline = now + self.timing.lease_ms;
        self.worker_mut(worker)?.last_seen = now;
        let mut revoked = Vec::new();
        for id in leases {
            match self.leases.get_mut(id) {
                Some(l) if l.worker == worker => l.deadline = deadline,
                _ => revoked.push(*id),
            }
        }
        Ok(revoked)
    }

    /// The next split for `worker`: replays first, then each job's epochs in order, one job after
    /// another, among the jobs whose consumers ask for data ([`super::demand`]). `None` when
    /// there is nothing to do now.
    pub fn lease(&mut self, worker: &str, now: u64) -> Result<Option<pb::Lease>, DispatchError> {
        self.lease_avoiding(worker, &[], now)
    }

    /// [`State::lease`], skipping the jobs in `backed_up`: a consumer of each holds a full queue
    /// on `worker` (only the first [`MAX_JOBS_PER_PIPELINE`] listed are read).
    pub fn lease_avoiding(
        &mut self,
        worker: &str,
        backed_up: &[pb::JobRef],
        now: u64,
    ) -> Result<Option<pb::Lease>, DispatchError> {
        let avoid: BTreeSet<(&str, &str)> = backed_up
            .iter()
            .take(MAX_JOBS_PER_PIPELINE)
            .map(|j| (j.pipeline.as_str(), j.job.as_str()))
            .collect();
        let filter = self.worker_mut(worker)?.pipeline.clone();
        let names: Vec<String> = self
            .pipelines
            .iter()
            .filter(|(name, p)| filter.as_deref().is_none_or(|f| f == name.as_str()) && p.failed.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        // Only the jobs asked for are taken in turn: the others, however many, cost nothing.
        let timing = self.timing;
        let mut jobs: Vec<(String, String)> = Vec::new();
        for name in names {
            self.cache_profile_timeout(&name, now);
            if let Some(p) = self.pipelines.get_mut(&name) {
                let asked = p.jobs_asked_for(now, &timing);
                let open = asked.into_iter().filter(|job| !avoid.contains(&(name.as_str(), job.as_str())));
                jobs.extend(open.map(|job| (name.clone(), job)));
            }
        }
        if jobs.is_empty() {
            return Ok(None);
        }
        for i in 0..jobs.len() {
            let (pipeline, job) = &jobs[(self.turn + i) % jobs.len()];
            if let Some(replay) = self.next_work(pipeline, job, now) {
                self.turn = (self.turn + i + 1) % jobs.len();
                return Ok(Some(self.grant(worker, pipeline, job, replay, now)));
            }
        }
        Ok(None)
    }

    /// The next split of `job_name` to lease, if any of its consumers asks for data at `now`.
    fn next_work(&mut self, pipeline: &str, job_name: &str, now: u64) -> Option<Replay> {
        let window = count_window(self.workers.len());
        let timing = self.timing;
        let p = self.pipelines.get_mut(pipeline)?;
        let epochs = p.facts.epochs;
        let job = p.jobs.get_mut(job_name)?;
        if !job.wanted(now, &timing) {
            return None;
        }
        while let Some(replay) = job.replays.pop_front() {
            // A whole-split re-lease is stale once the split was taken back or finished.
            if replay.only.is_some()
                || job.epoch(replay.epoch).status.get(replay.split) == SplitStatus::Pending
            {
                return Some(replay);
            }
        }
        let first = job.epochs.keys().next().copied().unwrap_or(0);
        let ahead = epochs_ahead(job.epoch(first).plan.order().len(), timing.min_splits_ahead);
        let limit = job.slowest_epoch(epochs).saturating_add(ahead).min(epochs.saturating_sub(1));
        for epoch in first..=limit {
            let state = job.epoch(epoch);
            // Splits counted but not yet placeable are held by their workers: lease only so far
            // past the first uncounted split (replays, above, are always handed out).
            if state.cursor >= state.plan.counted_splits() + window {
                continue;
            }
            while state.cursor < state.plan.order().len() {
                let split = state.plan.order()[state.cursor];
                state.cursor += 1;
                if state.status.get(split) == SplitStatus::Pending {
                    return Some(Replay { epoch, split, only: None });
                }
            }
        }
        None
    }

    fn grant(&mut self, worker: &str, pipeline: &str, job_name: &str, replay: Replay, now: u64) -> pb::Lease {
        self.next_lease += 1;
        let id = self.next_lease;
        let lease_ms = self.timing.lease_ms;
        // A split whose output count is not known yet is leased without parts: the worker
        // counts it first (`CountSplit`) and gets its parts then.
        let (generation, parts, elements, listed, normalize_on_worker) =
            match self.pipelines.get_mut(pipeline) {
                Some(p) => {
                    let generation = p.generation;
                    let job = p.jobs.get_mut(job_name);
                    match job {
                        Some(job) => {
                            // The job's record goes before anything produced for it (see
                            // `Job::journaled`).
                            if !job.journaled {
                                job.journaled = true;
                                self.events.push(Event::Job {
                                    pipeline: pipeline.to_string(),
                                    job: job_name.to_string(),
                                    mode: job.mode,
                                    consumers: job.settings.consumers,
                                });
                            }
                            let consumers = job.settings.consumers;
                            let read = job.settings.listed_split(replay.split);
                            let listed = job.settings.counts.get(read as usize).copied().unwrap_or(0);
                            let state = job.epoch(replay.epoch);
                            if replay.only.is_none() {
                                state.status.set(replay.split, SplitStatus::Leased(id));
                            }
                            let elements = state.plan.count(replay.split).unwrap_or(0);
                            let parts = state.plan.parts_of_split(replay.split, consumers);
                            (generation, parts, elements, listed, job.normalize_on_worker())
                        }
                        None => (generation, Some(Vec::new()), 0, 0, false),
                    }
                }
                None => (0, Some(Vec::new()), 0, 0, false),
            };
        let count_first = parts.is_none();
        let cache = self.cache_task(pipeline, replay.split, replay.only.is_some(), id, now);
        // A split that writes a cache entry makes its images (the entry holds computed elements),
        // and takes none of the job's share.
        let shares = self.workers.get(worker).is_some_and(|w| w.plans_image_shares);
        let client_image_share = match self.pipelines.get_mut(pipeline).and_then(|p| p.jobs.get_mut(job_name))
        {
            // As the wire carries it: a share too small for an `f32` is none, not (as 0 reads to a
            // worker) every image.
            Some(job) if cache.mode != pb::CacheMode::Write as i32 => job.client_image_share(shares) as f32,
            _ => 0.0,
        };
        let images_on_client = client_image_share > 0.0;
        let normalize_on_worker = normalize_on_worker && !images_on_client;
        self.count_splits(pipeline, |c| c.leased += 1);
        self.leases.insert(
            id,
            LeaseEntry {
                worker: worker.to_string(),
                pipeline: pipeline.to_string(),
                job: job_name.to_string(),
                replay,
                deadline: now + lease_ms,
                cache: Some(cache.clone()),
            },
        );
        if let Some(w) = self.workers.get_mut(worker) {
            w.leases.insert(id);
        }
        pb::Lease {
            lease_id: id,
            pipeline: pipeline.to_string(),
            generation,
            job: job_name.to_string(),
            epoch: replay.epoch,
            split: replay.split,
            elements,
            parts: parts.unwrap_or_default().into_iter().map(part_message).collect(),
            duration_ms: lease_ms as u32,
            only_consumer: replay.only,
            cache: Some(cache),
            count_first,
            listed,
            normalize_on_worker,
            images_on_client,
            // An older worker reads only `images_on_client`.
            client_image_share: if shares { client_image_share } else { 0.0 },
        }
    }

    /// A worker computed a leased split whose output count was unknown: the plan learns the
    /// count, and the split's parts are returned once the plan can tell them (`None`: ask
    /// again). A count that differs from one learnt before for the same split and epoch fails the
    /// pipeline: its filters or packing do not decide the same way under the same seed.
    pub fn count_split(
        &mut self,
        worker: &str,
        lease: u64,
        elements: u64,
    ) -> Result<Option<Vec<pb::Part>>, DispatchError> {
        let entry = match self.leases.get(&lease) {
            Some(l) if l.worker == worker => l,
            _ => {
                return Err(DispatchError::NotFound(format!(
                    "worker `{worker}` holds no lease {lease}; it was revoked"
                )));
            }
        };
        let (pipeline, job_name, replay) = (entry.pipeline.clone(), entry.job.clone(), entry.replay);
        let p = self
            .pipelines
            .get_mut(&pipeline)
            .ok_or_else(|| DispatchError::NotFound(format!("no pipeline `{pipeline}`")))?;
        let epochs = p.facts.epochs;
        let job = p.jobs.get_mut(&job_name).ok_or_else(|| {
            DispatchError::NotFound(format!("pipeline `{pipeline}` has no job `{job_name}`"))
        })?;
        if replay.epoch >= epochs {
            return Err(DispatchError::InvalidArgument(format!("epoch {} is past the last", replay.epoch)));
        }
        let consumers = job.settings.consumers;
        let state = job.epoch(replay.epoch);
        match state.plan.learn(replay.split, elements) {
            Ok(true) => self.events.push(Event::SplitCounted {
                pipeline: pipeline.clone(),
                job: job_name,
                epoch: replay.epoch,
                split: replay.split,
                elements,
            }),
            Ok(false) => {}
            Err(mismatch) => {
                let message = format!(
                    "split {} of epoch {} yielded {} elements, and {} when it was computed before: a filter or \
                     packing stage decided differently under the same seed (a `python.filter` that draws \
                     randomness from anything but its `rng`?)",
                    replay.split, replay.epoch, mismatch.now, mismatch.first
                );
                tracing::error!(pipeline = %pipeline, "{message}");
                if p.failed.is_none() {
                    p.failed = Some(message.clone());
                }
                return Err(DispatchError::FailedPrecondition(message));
            }
        }
        Ok(state
            .plan
            .parts_of_split(replay.split, consumers)
            .map(|parts| parts.into_iter().map(part_message).collect()))
    }

    /// A worker finished a split. Unknown leases (from before a restart) still count when they
    /// name a real split.
    pub fn complete(&mut self, req: &pb::CompleteSplitRequest) -> Result<(), DispatchError> {
        if let Some(held) = self.leases.get(&req.lease_id)
            && held.worker != req.worker_id
        {
            return Err(DispatchError::PermissionDenied(format!(
                "lease {} is held by another worker; only its holder completes it",
                req.lease_id
            )));
        }
        let lease = self.leases.remove(&req.lease_id);
        if let Some(l) = &lease
            && let Some(w) = self.workers.get_mut(&l.worker)
        {
            w.leases.remove(&req.lease_id);
        }
        let (pipeline, job_name, replay, task) = match lease {
            Some(l) => (l.pipeline, l.job, l.replay, l.cache),
            None => (
                req.pipeline.clone(),
                req.job.clone(),
                Replay { epoch: req.epoch, split: req.split, only: None },
                None,
            ),
        };
        self.cache_complete(&pipeline, task.as_ref(), req, replay.epoch, replay.split);
        if self.pipelines.contains_key(&pipeline) {
            self.count_splits(&pipeline, |c| c.completed += 1);
        }
        let p = self.pipelines.get_mut(&pipeline).ok_or_else(|| {
            DispatchError::NotFound(format!(
                "lease {} names pipeline `{pipeline}`, which is not registered",
                req.lease_id
            ))
        })?;
        let job = p.jobs.get_mut(&job_name).ok_or_else(|| {
            DispatchError::NotFound(format!(
                "lease {} names job `{job_name}`, which does not exist",
                req.lease_id
            ))
        })?;
        let read = job.settings.listed_split(replay.split);
        let listed = job
            .settings
            .counts
            .get(read as usize)
            .copied()
            .filter(|_| replay.split < job.settings.max_splits())
            .ok_or_else(|| {
                DispatchError::InvalidArgument(format!(
                    "split {} does not exist; the source has {} splits",
                    replay.split,
                    job.settings.counts.len()
                ))
            })?;
        // A split of a filtering pipeline was counted before it was routed; one that was not
        // (a lease from before a restart) is counted now.
        let expected = if job.settings.counts_known || replay.epoch >= p.facts.epochs {
            listed
        } else {
            let state = job.epoch(replay.epoch);
            if state.plan.learn(replay.split, req.elements) == Ok(true) {
                self.events.push(Event::SplitCounted {
                    pipeline: pipeline.clone(),
                    job: job_name.clone(),
                    epoch: replay.epoch,
                    split: replay.split,
                    elements: req.elements,
                });
            }
            state.plan.count(replay.split).unwrap_or(req.elements)
        };
        if req.elements != expected && p.failed.is_none() {
            let message = format!(
                "split {} yielded {} elements but the plan expects {expected}: the source changed while the pipeline ran; register it again",
                replay.split, req.elements
            );
            tracing::error!(pipeline = %pipeline, "{message}");
            p.failed = Some(message);
        }
        if replay.only.is_none() && replay.epoch < p.facts.epochs {
            let state = job.epoch(replay.epoch);
            if state.status.get(replay.split) != SplitStatus::Done {
                state.status.set(replay.split, SplitStatus::Done);
                self.events.push(Event::SplitDone {
                    pipeline: pipeline.clone(),
                    job: job_name,
                    epoch: replay.epoch,
                    split: replay.split,
                    skipped: req.skipped,
                    skip_error: (req.skipped > 0 && !req.skip_error.is_empty())
                        .then(|| req.skip_error.clone()),
                });
                // Skips count once per split, epoch and job: a split produced again (a replay for
                // one consumer) skips the same elements.
                self.add_skips(&pipeline, req.skipped, Some(&req.skip_error));
            }
        }
        Ok(())
    }

    /// A worker gives a lease back unfinished; `error` says why when producing the split failed.
    /// The split goes back to the queue, unless it failed [`MAX_SPLIT_ATTEMPTS`] times: then the
    /// pipeline fails with the last cause, rather than retrying forever.
    pub fn give_back(&mut self, worker: &str, lease: u64, error: Option<&str>) -> Result<(), DispatchError> {
        let entry = match self.leases.get(&lease) {
            Some(l) if l.worker == worker => l,
            Some(_) => {
                return Err(DispatchError::PermissionDenied(format!(
                    "lease {lease} is held by another worker; only its holder gives it back"
                )));
            }
            None => return Err(DispatchError::NotFound(format!("worker `{worker}` holds no lease {lease}"))),
        };
        if let Some(error) = error.filter(|e| !e.is_empty()) {
            let (pipeline, job, replay) = (entry.pipeline.clone(), entry.job.clone(), entry.replay);
            if self.pipelines.get(&pipeline).and_then(|p| p.jobs.get(&job)).is_some() {
                self.events.push(Event::SplitFailed {
                    pipeline: pipeline.clone(),
                    job: job.clone(),
                    epoch: replay.epoch,
                    split: replay.split,
                    worker: worker.to_string(),
                    error: error.to_string(),
                });
            }
            self.count_failure(&pipeline, &job, replay.epoch, replay.split, worker, error);
        }
        self.requeue(lease);
        Ok(())
    }

    /// Counts a failed attempt at a split; the pipeline fails at the limit.
    pub(crate) fn count_failure(
        &mut self,
        pipeline: &str,
        job: &str,
        epoch: u32,
        split: u64,
        worker: &str,
        error: &str,
    ) {
        let Some(p) = self.pipelines.get_mut(pipeline) else { return };
        let Some(j) = p.jobs.get_mut(job) else { return };
        let entry = j.failures.entry((epoch, split)).or_default();
        entry.count += 1;
        entry.worker = worker.to_string();
        entry.error = error.to_string();
        let attempts = entry.count;
        tracing::warn!(%pipeline, epoch, split, attempts, %worker, "a split failed: {error}");
        if attempts >= MAX_SPLIT_ATTEMPTS && p.failed.is_none() {
            let message = format!(
                "split {split} of epoch {epoch} failed {attempts} times (the last on worker `{worker}`): {error}"
            );
            tracing::error!(%pipeline, "{message}; it is not retried again");
            p.failed = Some(message);
        }
    }

    /// Puts a lease's split back at the front of its job's queue.
    pub(crate) fn requeue(&mut self, lease: u64) {
        let Some(l) = self.leases.remove(&lease) else { return };
        self.leasable = true;
        if let Some(w) = self.workers.get_mut(&l.worker) {
            w.leases.remove(&lease);
        }
        self.cache_release(&l.pipeline, l.cache.as_ref(), l.replay.split, lease);
        self.count_splits(&l.pipeline, |c| c.requeued += 1);
        let Some(job) = self.pipelines.get_mut(&l.pipeline).and_then(|p| p.jobs.get_mut(&l.job)) else {
            return;
        };
        if l.replay.only.is_none() {
            let state = job.epoch(l.replay.epoch);
            if state.status.get(l.replay.split) != SplitStatus::Leased(lease) {
                return;
            }
            state.status.set(l.replay.split, SplitStatus::Pending);
        }
        if !job.replays.contains(&l.replay) {
            job.replays.push_front(l.replay);
        }
    }
}

/// The wire form of a planned part.
fn part_message(p: crate::plan::Part) -> pb::Part {
    pb::Part { lo: p.lo, hi: p.hi, slot: p.slot, consumers: p.consumers }
}

/// The fewest splits a job may run ahead of the epoch its slowest consumer is in, by default
/// ([`super::Timing::min_splits_ahead`]). Epochs are leased one ahead of that consumer, which
/// bounds what its client holds for later epochs to an epoch's parts. An epoch of a few splits
/// (a small or cached dataset, a few large shards) then left a worker a few splits to compute
/// while the consumer's epoch start travelled to the dispatcher and the next lease back: on a
/// loaded host that took longer than the splits, and the worker waited at every epoch's end.
/// Such a job runs as many epochs ahead as hold this many splits, so its client holds at most
/// about twice what an epoch of this many could make it hold; an epoch of at least this many is
/// leased one ahead, as before.
pub const MIN_SPLITS_AHEAD: usize = 32;

/// Epochs a job may run ahead of its slowest consumer, for epochs of `splits` splits: one, or
/// as many as hold `min_splits` splits.
pub(crate) fn epochs_ahead(splits: usize, min_splits: usize) -> u32 {
    u32::try_from(min_splits.div_ceil(splits.max(1))).unwrap_or(u32::MAX).max(1)
}

/// How many splits of an epoch past its first uncounted one may be leased, for pipelines whose
/// counts are learnt: each worker holds its counted splits until the ones before them are
/// counted, and this bounds that memory (a few splits a worker) without limiting parallelism.
fn count_window(workers: usize) -> usize {
    8 + 4 * workers
}
