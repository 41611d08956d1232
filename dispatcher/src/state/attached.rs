//! Which consumers read a pipeline now: what the autoscaler counts as trainers attached.

use super::State;

impl State {
    /// The consumers of `pipeline` that are registered and neither gone nor finished, as
    /// `(job, index)`, whether or not they reported metrics yet (a trainer waiting on a pool at
    /// zero may never finish a step to report).
    pub fn attached(&self, pipeline: &str) -> Vec<(String, u32)> {
        let Some(p) = self.pipelines.get(pipeline) else { return Vec::new() };
        p.jobs
            .iter()
            .flat_map(|(name, job)| {
                job.consumers.iter().filter(|(_, c)| !c.gone && !c.finished).map(|(i, _)| (name.clone(), *i))
            })
            .collect()
    }
}
