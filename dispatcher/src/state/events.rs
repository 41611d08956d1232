//! Journal events: what must survive a dispatcher restart, and how replaying them rebuilds the
//! state. Liveness, leases and metrics are not journaled: workers and clients re-register.

use super::{PipelineFacts, SplitStatus, State};
use crate::plan::Mode;

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
    },
}

impl State {
    /// Applies a journaled event (on recovery); produces no new events.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Pipeline { name, generation, facts } => {
                self.pipelines.insert(
                    name.clone(),
                    super::Pipeline {
                        facts: facts.clone(),
                        generation: *generation,
                        jobs: Default::default(),
                        failed: None,
                    },
                );
            }
            Event::Job { pipeline, job, mode, consumers } => {
                if let Err(e) = self.ensure_job(pipeline, job, *mode, *consumers) {
                    tracing::warn!("journal: job `{job}` of `{pipeline}` skipped: {e}");
                }
            }
            Event::SplitDone { pipeline, job, epoch, split } => {
                let Some(p) = self.pipelines.get_mut(pipeline) else { return };
                let epochs = p.facts.epochs;
                if let Some(j) = p.jobs.get_mut(job)
                    && *epoch < epochs
                    && (*split as usize) < j.settings.counts.len()
                {
                    j.epoch(*epoch).status[*split as usize] = SplitStatus::Done;
                }
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
            for (job, j) in &p.jobs {
                out.push(Event::Job {
                    pipeline: name.clone(),
                    job: job.clone(),
                    mode: j.mode,
                    consumers: j.settings.consumers,
                });
                for (epoch, state) in &j.epochs {
                    for (split, status) in state.status.iter().enumerate() {
                        if *status == SplitStatus::Done {
                            out.push(Event::SplitDone {
                                pipeline: name.clone(),
                                job: job.clone(),
                                epoch: *epoch,
                                split: split as u64,
                            });
                        }
                    }
                }
            }
        }
        out
    }
}
