//! Journal events: what must survive a dispatcher restart, and how replaying them rebuilds the
//! state. Liveness, leases and metrics are not journaled: workers and clients re-register.

use super::cache::Chosen;
use super::{PipelineFacts, SplitStatus, State};
use crate::plan::Mode;
use granary_policies::caching::CacheDecision;

/// One durable change.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A pipeline was registered (or replaced: a new generation has no jobs).
    Pipeline {
        /// Pipeline name.
        name: String,
        /// Generation.
        generation: u64,
        /// Facts the plans use.
        facts: PipelineFacts,
    },
    /// A pipeline was removed (its resource deleted): its jobs and progress go with it.
    PipelineRemoved {
        /// Pipeline name.
        name: String,
    },
    /// A job was created.
    Job {
        /// Pipeline name.
        pipeline: String,
        /// Job name.
        job: String,
        /// Consumers share or replicate.
        mode: Mode,
        /// Consumers declared.
        consumers: u32,
    },
    /// A job no consumer read for `Timing::job_gc_ms` was collected with its progress.
    JobCollected {
        /// Pipeline name.
        pipeline: String,
        /// Job name.
        job: String,
    },
    /// A split of an epoch was produced for every consumer.
    SplitDone {
        /// Pipeline name.
        pipeline: String,
        /// Job name.
        job: String,
        /// Epoch.
        epoch: u32,
        /// Split id.
        split: u64,
        /// Elements a stage failed on that were skipped (`spec.errors.policy: skip`).
        #[serde(default, skip_serializing_if = "is_zero")]
        skipped: u64,
        /// With skips: the error of one of them, naming the element and the stage, so that a
        /// failure past `maxSkipped` names it after a restart too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip_error: Option<String>,
    },
    /// An attempt at producing a split failed (the worker gave it back with an error); at
    /// [`super::MAX_SPLIT_ATTEMPTS`] the pipeline fails.
    SplitFailed {
        /// Pipeline name.
        pipeline: String,
        /// Job name.
        job: String,
        /// Epoch.
        epoch: u32,
        /// Split id.
        split: u64,
        /// The worker that gave it back.
        worker: String,
        /// Why, naming the element where a stage failed.
        error: String,
    },
    /// Elements a pipeline skipped in all (written by compaction, in place of the skips of each
    /// split's completion).
    ElementsSkipped {
        /// Pipeline name.
        pipeline: String,
        /// Elements skipped.
        elements: u64,
        /// The error of the latest skip a worker described.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last: Option<String>,
    },
    /// A split of an epoch of a pipeline that filters or packs was computed: its output count,
    /// which places the splits after it in the epoch's plan.
    SplitCounted {
        /// Pipeline name.
        pipeline: String,
        /// Job name.
        job: String,
        /// Epoch.
        epoch: u32,
        /// Split id.
        split: u64,
        /// Elements it yields.
        elements: u64,
    },
    /// The autocacher decided for a pipeline's generation.
    CacheDecided {
        /// Pipeline name.
        pipeline: String,
        /// The generation decided for.
        generation: u64,
        /// The decision, with its reason.
        decision: CacheDecision,
        /// The chosen entry's fingerprint; empty when computing. Of the first source for
        /// `spec.sources`.
        fingerprint: String,
        /// With `spec.sources`: each source's entry at the chosen cut, in order; empty for a
        /// single source (and in journals from before sources were cached).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        sources: Vec<String>,
        /// The chosen cut; 0 when computing.
        boundary: usize,
        /// Name of the stage whose output is cached; empty when computing.
        stage: String,
        /// The slowest job's epoch when decided.
        epoch: u32,
    },
    /// A split of an entry was published.
    CacheSplitWritten {
        /// The cache store URL.
        store: String,
        /// The entry.
        fingerprint: String,
        /// The split of the entry: its index in its own source's listing.
        split: u64,
        /// Stored bytes.
        bytes: u64,
    },
    /// A split of an entry failed verification: it is not read again.
    CacheSplitBad {
        /// The cache store URL.
        store: String,
        /// The entry.
        fingerprint: String,
        /// Split id.
        split: u64,
    },
    /// An entry was removed from its store.
    CacheEvicted {
        /// The cache store URL.
        store: String,
        /// The entry.
        fingerprint: String,
    },
}

impl State {
    /// Applies a journaled event (on recovery); produces no new events.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Pipeline { name, generation, facts } => {
                self.pipelines.insert(name.clone(), super::Pipeline::new(facts.clone(), *generation));
            }
            Event::PipelineRemoved { name } => self.drop_pipeline(name),
            Event::Job { pipeline, job, mode, consumers } => {
                if let Err(e) = self.ensure_job(pipeline, job, *mode, *consumers, true) {
                    tracing::warn!("journal: job `{job}` of `{pipeline}` skipped: {e}");
                }
            }
            Event::JobCollected { pipeline, job } => self.drop_job(pipeline, job),
            Event::SplitDone { pipeline, job, epoch, split, skipped, skip_error } => {
                let Some(p) = self.pipelines.get_mut(pipeline) else { return };
                let epochs = p.facts.epochs;
                if let Some(j) = p.jobs.get_mut(job)
                    && *epoch < epochs
                    && *split < j.settings.max_splits()
                {
                    j.epoch(*epoch).status.set(*split, SplitStatus::Done);
                }
                self.add_skips(pipeline, *skipped, skip_error.as_deref());
            }
            Event::SplitFailed { pipeline, job, epoch, split, worker, error } => {
                self.count_failure(pipeline, job, *epoch, *split, worker, error);
            }
            Event::ElementsSkipped { pipeline, elements, last } => {
                if let Some(p) = self.pipelines.get_mut(pipeline) {
                    p.skips.total = 0;
                }
                self.add_skips(pipeline, *elements, last.as_deref());
            }
            Event::SplitCounted { pipeline, job, epoch, split, elements } => {
                let Some(p) = self.pipelines.get_mut(pipeline) else { return };
                let epochs = p.facts.epochs;
                if let Some(j) = p.jobs.get_mut(job)
                    && *epoch < epochs
                    && let Err(e) = j.epoch(*epoch).plan.learn(*split, *elements)
                {
                    tracing::warn!(
                        "journal: split {split} of epoch {epoch} of `{pipeline}` counted {} and {}",
                        e.first,
                        e.now
                    );
                }
            }
            Event::CacheDecided {
                pipeline,
                generation,
                decision,
                fingerprint,
                sources,
                boundary,
                stage,
                epoch,
            } => {
                if let Some(p) = self.pipelines.get_mut(pipeline)
                    && p.generation == *generation
                {
                    p.cache.decision = Some(Chosen {
                        decision: decision.clone(),
                        fingerprint: fingerprint.clone(),
                        sources: sources.clone(),
                        boundary: *boundary,
                        stage: stage.clone(),
                        epoch: *epoch,
                    });
                }
            }
            Event::CacheSplitWritten { store, fingerprint, split, bytes } => {
                self.cache_entries
                    .entry((store.clone(), fingerprint.clone()))
                    .or_default()
                    .written(*split, *bytes);
            }
            Event::CacheSplitBad { store, fingerprint, split } => {
                self.cache_entries.entry((store.clone(), fingerprint.clone())).or_default().mark_bad(*split);
            }
            Event::CacheEvicted { store, fingerprint } => {
                self.cache_entries.remove(&(store.clone(), fingerprint.clone()));
            }
        }
        self.events.clear();
    }

    /// Every event needed to rebuild the current durable state (for compaction).
    pub fn snapshot_events(&self) -> Vec<Event> {
        let mut out = Vec::new();
        for (name, p) in &self.pipelines {
            out.push(Event::Pipeline {
                name: name.clone(),
                generation: p.generation,
                facts: p.facts.clone(),
            });
            if let Some(c) = &p.cache.decision {
                out.push(Event::CacheDecided {
                    pipeline: name.clone(),
                    generation: p.generation,
                    decision: c.decision.clone(),
                    fingerprint: c.fingerprint.clone(),
                    sources: c.sources.clone(),
                    boundary: c.boundary,
                    stage: c.stage.clone(),
                    epoch: c.epoch,
                });
            }
            // A job with no record yet has no progress either (see `Job::journaled`).
            for (job, j) in p.jobs.iter().filter(|(_, j)| j.journaled) {
                out.push(Event::Job {
                    pipeline: name.clone(),
                    job: job.clone(),
                    mode: j.mode,
                    consumers: j.settings.consumers,
                });
                for (epoch, state) in &j.epochs {
                    if !j.settings.counts_known {
                        for &split in state.plan.order() {
                            if let Some(elements) = state.plan.count(split) {
                                out.push(Event::SplitCounted {
                                    pipeline: name.clone(),
                                    job: job.clone(),
                                    epoch: *epoch,
                                    split,
                                    elements,
                                });
                            }
                        }
                    }
                    for (split, status) in state.status.iter() {
                        if status == SplitStatus::Done {
                            out.push(Event::SplitDone {
                                pipeline: name.clone(),
                                job: job.clone(),
                                epoch: *epoch,
                                split,
                                skipped: 0,
                                skip_error: None,
                            });
                        }
                    }
                }
                for (&(epoch, split), attempts) in &j.failures {
                    for _ in 0..attempts.count {
                        out.push(Event::SplitFailed {
                            pipeline: name.clone(),
                            job: job.clone(),
                            epoch,
                            split,
                            worker: attempts.worker.clone(),
                            error: attempts.error.clone(),
                        });
                    }
                }
            }
            if p.skips.total > 0 {
                out.push(Event::ElementsSkipped {
                    pipeline: name.clone(),
                    elements: p.skips.total,
                    last: p.skips.last.clone(),
                });
            }
        }
        for ((store, fingerprint), entry) in &self.cache_entries {
            for (&split, &bytes) in &entry.complete {
                out.push(Event::CacheSplitWritten {
                    store: store.clone(),
                    fingerprint: fingerprint.clone(),
                    split,
                    bytes,
                });
            }
            for &split in &entry.bad {
                out.push(Event::CacheSplitBad {
                    store: store.clone(),
                    fingerprint: fingerprint.clone(),
                    split,
                });
            }
        }
        out
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
