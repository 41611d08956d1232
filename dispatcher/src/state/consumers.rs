//! The client-facing rules: consumers joining jobs, resuming, heartbeats, plans and replays.

use super::demand::Demand;
use super::placement::image_wish;
use super::tallies::{SessionSeen, TrainerTotals};
use super::{Consumer, DispatchError, ImagePlacement, Job, MixFacts, Replay, SplitStatus, State, check_name};
use crate::plan::{Mode, PlanSettings};
use granary_policies::placement::{HostLoad, Place};
use granary_proto::v1 as pb;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

fn mode_of(mode: i32) -> Result<Mode, DispatchError> {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Unspecified | pb::Mode::Distributed) => Ok(Mode::Distributed),
        Ok(pb::Mode::Replicated) => Ok(Mode::Replicated),
        Err(_) => Err(DispatchError::InvalidArgument(format!(
            "`mode` {mode} is unknown; use MODE_DISTRIBUTED or MODE_REPLICATED"
        ))),
    }
}

/// Most consumers one job may declare: with one client session each, also the most clients a
/// job holds at once (a new session for a place replaces the previous one).
pub const MAX_CONSUMERS: u32 = 4096;

/// Longest job name, in bytes (as a DNS subdomain, like the pipeline names).
pub const MAX_JOB_NAME_BYTES: usize = 253;

/// Most jobs one pipeline holds at once; jobs nobody reads are collected after
/// [`super::Timing::job_gc_ms`], or sooner when the pipeline is full.
pub const MAX_JOBS_PER_PIPELINE: usize = 1024;

/// Refuses a job name that is too long or holds control characters, naming the limit.
fn check_job_name(job: &str) -> Result<(), DispatchError> {
    if job.len() > MAX_JOB_NAME_BYTES {
        return Err(DispatchError::InvalidArgument(format!(
            "`job` is {} bytes long; job names have at most {MAX_JOB_NAME_BYTES}: use a shorter name",
            job.len()
        )));
    }
    if job.chars().any(char::is_control) {
        return Err(DispatchError::InvalidArgument(
            "`job` holds control characters; use letters, digits, `-`, `.` or `/`".into(),
        ));
    }
    Ok(())
}

impl State {
    /// Creates a job unless it exists; `journaled` says whether its record is in the journal
    /// already (a replayed one), else it is written with the job's first lease.
    pub(crate) fn ensure_job(
        &mut self,
        pipeline: &str,
        job: &str,
        mode: Mode,
        consumers: u32,
        journaled: bool,
    ) -> Result<(), DispatchError> {
        let p = self
            .pipelines
            .get_mut(pipeline)
            .ok_or_else(|| DispatchError::NotFound(format!("no pipeline `{pipeline}`")))?;
        if let Some(existing) = p.jobs.get(job) {
            if existing.mode != mode {
                return Err(DispatchError::FailedPrecondition(format!(
                    "job `{job}` of pipeline `{pipeline}` runs in {:?} mode, not {mode:?}; use another job name",
                    existing.mode
                )));
            }
            if existing.settings.consumers != consumers {
                return Err(DispatchError::FailedPrecondition(format!(
                    "job `{job}` of pipeline `{pipeline}` has {} consumers, not {consumers}; every consumer of a job declares the same num_consumers",
                    existing.settings.consumers
                )));
            }
            return Ok(());
        }
        let f = &p.facts;
        let settings = PlanSettings {
            counts: f.counts.clone(),
            counts_known: f.counts_known,
            batch: f.batch,
            consumers,
            mode,
            drop_remainder: f.drop_remainder,
            shuffle: f.shuffle,
            seed: f.seed,
            mixing: f.mixing.as_ref().map(MixFacts::plan),
        };
        p.jobs.insert(
            job.to_string(),
            Job {
                mode,
                settings,
                consumers: BTreeMap::new(),
                epochs: BTreeMap::new(),
                replays: VecDeque::new(),
                trainer: TrainerTotals::default(),
                failures: BTreeMap::new(),
                last_alive: 0,
                journaled,
                place: Place::default(),
                images: ImagePlacement::default(),
            },
        );
        Ok(())
    }

    /// A consumer joins a job, or resumes its place from a position.
    pub fn register_client(
        &mut self,
        req: &pb::RegisterClientRequest,
        now: u64,
    ) -> Result<pb::RegisterClientResponse, DispatchError> {
        check_name("pipeline", &req.pipeline)?;
        let (epochs, batch, max_part_bytes) = {
            let p = self.pipeline(&req.pipeline)?;
            if let Some(why) = &p.failed {
                return Err(DispatchError::FailedPrecondition(format!(
                    "pipeline `{}` failed: {why}",
                    req.pipeline
                )));
            }
            (p.facts.epochs, p.facts.batch, p.facts.max_part_bytes())
        };
        let job_name = if req.job.is_empty() { req.pipeline.clone() } else { req.job.clone() };
        check_job_name(&job_name)?;
        let mode = mode_of(req.mode)?;
        let k = req.num_consumers.max(1);
        if k > MAX_CONSUMERS {
            return Err(DispatchError::InvalidArgument(format!(
                "`num_consumers` is {k}; at most {MAX_CONSUMERS} consumers share a job"
            )));
        }
        if let Some(i) = req.consumer_index
            && i >= k
        {
            return Err(DispatchError::InvalidArgument(format!(
                "`consumer_index` {i} is out of range: the job has {k} consumers (0..{k})"
            )));
        }
        self.make_room_for(&req.pipeline, &job_name, now)?;
        self.ensure_job(&req.pipeline, &job_name, mode, k, false)?;
        let client_id = self.fresh_id("client");
        let p = self
            .pipelines
            .get_mut(&req.pipeline)
            .ok_or_else(|| DispatchError::NotFound(req.pipeline.clone()))?;
        let job = p.jobs.get_mut(&job_name).ok_or_else(|| DispatchError::NotFound(job_name.clone()))?;
        let index = match req.consumer_index {
            Some(i) => i,
            None => (0..k).find(|i| job.consumers.get(i).is_none_or(|c| c.gone)).ok_or_else(|| {
                DispatchError::ResourceExhausted(format!(
                    "job `{job_name}` already has its {k} consumers; give this one another job name, or declare consumer_index and num_consumers"
                ))
            })?,
        };
        let fingerprint = job.settings.fingerprint();
        let (epoch, delivered) = match &req.resume {
            Some(r) => {
                if r.plan_fingerprint != fingerprint {
                    return Err(DispatchError::FailedPrecondition(format!(
                        "the position was taken under another plan of `{}` (different source, batch size, consumers or mode); it cannot be resumed",
                        req.pipeline
                    )));
                }
                if r.epoch > epochs {
                    return Err(DispatchError::InvalidArgument(format!(
                        "the position's epoch {} is past the pipeline's {epochs} epochs",
                        r.epoch
                    )));
                }
                let mut last = 0;
                for range in &r.delivered {
                    if range.start < last || range.end < range.start {
                        return Err(DispatchError::InvalidArgument(
                            "the position's delivered ranges must be sorted and disjoint".into(),
                        ));
                    }
                    last = range.end;
                }
                (r.epoch, r.delivered.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>())
            }
            None => (0, Vec::new()),
        };
        // Whatever this consumer was sent before may be lost: replay every split that holds an
        // undelivered part of it and is not pending (pending splits come in order anyway).
        if epoch < epochs {
            queue_replays(job, index, epoch, |slot| !delivered.iter().any(|&(a, z)| slot >= a && slot < z));
            // Only the epochs begun: a pipeline may declare millions of them.
            let begun: Vec<u32> = job.epochs.range(epoch + 1..epochs).map(|(&later, _)| later).collect();
            for later in begun {
                queue_replays(job, index, later, |_| true);
            }
        }
        let finished = epoch >= epochs;
        job.last_alive = job.last_alive.max(now);
        job.consumers.insert(
            index,
            Consumer {
                client_id: client_id.clone(),
                last_seen: now,
                epoch,
                delivered: delivered.iter().map(|(a, z)| z - a).sum(),
                finished,
                gone: false,
                metrics: None,
                seen: SessionSeen::default(),
                demand: Demand::registered(now, req.wants_data, &self.timing),
                host: HostLoad::default(),
                images: image_wish(req.image_plans),
            },
        );
        // A consumer that asks for every image on its host gets them from the first lease.
        job.place_images(&req.pipeline, &job_name, now);
        if req.wants_data {
            p.asked(&job_name);
            self.leasable = true;
        }
        let workers = self.workers_of(&req.pipeline);
        Ok(pb::RegisterClientResponse {
            client_id,
            job: job_name,
            consumer_index: index,
            num_consumers: k,
            mode: match mode {
                Mode::Distributed => pb::Mode::Distributed as i32,
                Mode::Replicated => pb::Mode::Replicated as i32,
            },
            epochs,
            batch_size: batch as u32,
            heartbeat_interval_ms: self.timing.heartbeat_ms,
            plan_fingerprint: fingerprint,
            workers,
            max_part_bytes,
            ..Default::default()
        })
    }

    fn consumer_mut(
        &mut self,
        client_id: &str,
        pipeline: &str,
        job: &str,
        index: u32,
    ) -> Result<(&mut Job, u32), DispatchError> {
        let unknown = || {
            DispatchError::NotFound(format!(
                "unknown client `{client_id}` for consumer {index} of job `{job}` of pipeline `{pipeline}`; register again"
            ))
        };
        let p = self.pipelines.get_mut(pipeline).ok_or_else(unknown)?;
        let epochs = p.facts.epochs;
        let j = p.jobs.get_mut(job).ok_or_else(unknown)?;
        match j.consumers.get(&index) {
            Some(c) if c.client_id == client_id => Ok((j, epochs)),
            Some(_) => Err(DispatchError::FailedPrecondition(format!(
                "consumer {index} of job `{job}` was taken over by a newer client session; this one must stop"
            ))),
            None => Err(unknown()),
        }
    }

    /// Records a consumer's heartbeat; answers with the workers to read from.
    pub fn client_heartbeat(
        &mut self,
        req: &pb::ClientHeartbeatRequest,
        now: u64,
    ) -> Result<pb::ClientHeartbeatResponse, DispatchError> {
        let timing = self.timing;
        let (job, epochs) = self.consumer_mut(&req.client_id, &req.pipeline, &req.job, req.consumer_index)?;
        if req.epoch > epochs {
            return Err(DispatchError::InvalidArgument(format!(
                "`epoch` {} is past the pipeline's {epochs} epochs",
                req.epoch
            )));
        }
        job.last_alive = job.last_alive.max(now);
        let (mut asks, mut advanced) = (false, false);
        if let Some(c) = job.consumers.get_mut(&req.consumer_index) {
            c.last_seen = now;
            c.gone = false;
            if let Some(metrics) = &req.metrics {
                job.trainer.absorb(&mut c.seen, metrics);
            }
            // A session's heartbeats travel on separate calls and can arrive out of order; one
            // that is behind what this session already reported must not move it back (a late
            // epoch-start heartbeat would otherwise undo `finished`).
            let progressed = (req.finished, req.epoch, req.delivered) > (c.finished, c.epoch, c.delivered);
            asks = c.demand.heartbeat(now, req.wants_data, progressed, &timing);
            c.host = c.host.reported(req.host_idle_cores, req.finish_cores, req.image_cores);
            if (req.finished, req.epoch, req.delivered) >= (c.finished, c.epoch, c.delivered) {
                // Epochs are leased a bounded number ahead of the slowest consumer: a new epoch
                // may open the next one to leasing.
                advanced = (req.finished, req.epoch) > (c.finished, c.epoch);
                c.epoch = req.epoch;
                c.delivered = req.delivered;
                c.finished = req.finished;
                // The histograms went into the job's totals; the policies read the means.
                c.metrics = req.metrics.as_ref().map(|m| pb::ClientMetrics {
                    step_histogram: None,
                    wait_histogram: None,
                    ..m.clone()
                });
            }
        }
        job.place_normalization(&req.pipeline, &req.job);
        job.place_images(&req.pipeline, &req.job, now);
        // Epochs every consumer is past are no longer needed.
        let slowest = job.slowest_epoch(epochs);
        job.epochs.retain(|&e, _| e + 1 >= slowest);
        if asks && let Some(p) = self.pipelines.get_mut(&req.pipeline) {
            p.asked(&req.job);
        }
        self.leasable |= asks || advanced;
        let failed = self.failure(&req.pipeline).unwrap_or_default();
        Ok(pb::ClientHeartbeatResponse {
            workers: self.workers_of(&req.pipeline),
            failed,
            ..Default::default()
        })
    }

    /// The consumers that will not read again (gone, or finished) of the jobs `worker` produces
    /// for: those of the leases it holds, and `queued`, the jobs it says it holds queued parts
    /// for. Only their queues can still receive or hold parts; a worker drops its other queues
    /// once they are empty, so naming every finished consumer of every job at each heartbeat
    /// would only grow the answer.
    pub fn gone_consumers(&self, worker: &str, queued: &[pb::JobRef]) -> Vec<pb::ConsumerRef> {
        let Some(w) = self.workers.get(worker) else { return Vec::new() };
        let leased = w.leases.iter().filter_map(|id| self.leases.get(id));
        let mut jobs: BTreeSet<(&str, &str)> =
            leased.map(|l| (l.pipeline.as_str(), l.job.as_str())).collect();
        for j in queued.iter().take(MAX_JOBS_PER_PIPELINE) {
            jobs.insert((j.pipeline.as_str(), j.job.as_str()));
        }
        let mut gone = Vec::new();
        for (pipeline, job) in jobs {
            if w.pipeline.as_deref().is_some_and(|only| only != pipeline) {
                continue;
            }
            let Some(j) = self.pipelines.get(pipeline).and_then(|p| p.jobs.get(job)) else { continue };
            for (index, c) in &j.consumers {
                if c.gone || c.finished {
                    gone.push(pb::ConsumerRef {
                        pipeline: pipeline.to_string(),
                        job: job.to_string(),
                        consumer_index: *index,
                    });
                }
            }
        }
        gone
    }

    /// A consumer's batches in `epoch` and the split ranges that make each.
    pub fn epoch_plan(&mut self, req: &pb::GetEpochPlanRequest) -> Result<pb::EpochPlan, DispatchError> {
        let p = self
            .pipelines
            .get_mut(&req.pipeline)
            .ok_or_else(|| DispatchError::NotFound(format!("no pipeline named `{}`", req.pipeline)))?;
        let epochs = p.facts.epochs;
        let sources = p.facts.mixing.as_ref().map(MixFacts::plan_sources).unwrap_or_default();
        let job = p.jobs.get_mut(&req.job).ok_or_else(|| {
            DispatchError::NotFound(format!(
                "pipeline `{}` has no job `{}`; register a client first",
                req.pipeline, req.job
            ))
        })?;
        if req.epoch >= epochs {
            return Err(DispatchError::InvalidArgument(format!(
                "`epoch` {} is out of range: the pipeline runs {epochs} epochs (0..{epochs})",
                req.epoch
            )));
        }
        if req.consumer_index >= job.settings.consumers {
            return Err(DispatchError::InvalidArgument(format!(
                "`consumer_index` {} is out of range: the job has {} consumers",
                req.consumer_index, job.settings.consumers
            )));
        }
        let fingerprint = job.settings.fingerprint();
        let plan = &job.epoch(req.epoch).plan;
        let slots = plan
            .consumer_slots_from(req.consumer_index, req.from_slot)
            .into_iter()
            .zip(req.from_slot..)
            .map(|(parts, slot)| pb::Slot {
                slot,
                parts: parts
                    .into_iter()
                    .map(|p| pb::SlotPart { split: p.split, lo: p.lo, hi: p.hi })
                    .collect(),
            })
            .collect();
        Ok(pb::EpochPlan {
            epoch: req.epoch,
            slots,
            plan_fingerprint: fingerprint,
            partial: !plan.is_complete(),
            sources,
        })
    }

    /// Queues replays of produced splits for one consumer; returns the splits queued.
    pub fn request_replay(&mut self, req: &pb::RequestReplayRequest) -> Result<Vec<u64>, DispatchError> {
        let (job, epochs) = self.consumer_mut(&req.client_id, &req.pipeline, &req.job, req.consumer_index)?;
        if req.epoch >= epochs {
            return Err(DispatchError::InvalidArgument(format!(
                "`epoch` {} is out of range: the pipeline runs {epochs} epochs",
                req.epoch
            )));
        }
        let n = job.settings.max_splits();
        if req.splits.len() as u64 > n {
            return Err(DispatchError::InvalidArgument(format!(
                "`splits` lists {} splits; the plan has {n} split ids: list each at most once",
                req.splits.len()
            )));
        }
        if let Some(bad) = req.splits.iter().find(|&&s| s >= n) {
            return Err(DispatchError::InvalidArgument(format!(
                "split {bad} does not exist; the plan has {n} split ids"
            )));
        }
        let index = req.consumer_index;
        let state = job.epoch(req.epoch);
        let produced: Vec<u64> =
            req.splits.iter().copied().filter(|&s| state.status.get(s) == SplitStatus::Done).collect();
        let mut queued = Vec::new();
        for split in produced {
            let replay = Replay { epoch: req.epoch, split, only: Some(index) };
            if !job.replays.contains(&replay) {
                job.replays.push_back(replay);
                queued.push(split);
            }
        }
        Ok(queued)
    }
}

/// Queues consumer-only replays of every non-pending split of `epoch` holding a wanted slot.
fn queue_replays(job: &mut Job, index: u32, epoch: u32, wanted: impl Fn(u64) -> bool) {
    let state = job.epoch(epoch);
    let splits = state.plan.splits_for(index, wanted);
    let replays: Vec<Replay> = splits
        .into_iter()
        .filter(|&s| state.status.get(s) != SplitStatus::Pending)
        .map(|split| Replay { epoch, split, only: Some(index) })
        .collect();
    for r in replays {
        if !job.replays.contains(&r) {
            job.replays.push_back(r);
        }
    }
}
