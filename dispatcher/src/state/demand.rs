//! Demand: which jobs the workers produce for now.
//!
//! A job's splits are leased only while one of its consumers asks for data: its registration or
//! its latest heartbeat said it wants data (`wants_data`: fewer complete batches buffered than it
//! reads ahead), or it delivered a batch lately. A consumer that registers without asking and
//! never reads costs the workers nothing; one that stalls (a trainer writing a checkpoint) holds
//! what was produced for it, and no more is produced until it reads again or runs low. Without
//! this rule every job got its turn in the lease order, and a thousand clients that joined jobs
//! they never read made the workers compute for them and wait on their full queues while a real
//! trainer starved.
//!
//! Time only ends a consumer's asking; only its registration or a heartbeat starts it. So each
//! pipeline keeps the jobs that a consumer asked of or read for since they were last seen not
//! asked for ([`Pipeline::asking`]), and leasing looks at those alone: however many jobs sit
//! idle, a lease costs a look at the jobs asked for.

use super::{Consumer, Job, Pipeline, Timing};

/// How long a registration's or a heartbeat's `wants_data` holds without another heartbeat, in
/// heartbeat intervals: a consumer that asked and then went silent (it crashed) stops being
/// produced for.
const WANT_HOLDS: u64 = 4;
/// How long after its last delivered batch a consumer counts as reading, in heartbeat
/// intervals: a trainer that reads steadily is produced for ahead of its buffer running low.
const ACTIVE_FOR: u64 = 10;

impl Timing {
    fn intervals(&self, n: u64) -> u64 {
        u64::from(self.heartbeat_ms.max(1)).saturating_mul(n)
    }
}

/// What a consumer last said about wanting data, and when it last delivered a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// Produce for the consumer until then (the state's clock, ms).
    wants_until: u64,
    /// When its delivered position last moved on; `None` before it delivered anything here.
    progressed_at: Option<u64>,
}

impl Demand {
    /// A consumer that registered at `now`; `wants` is its registration's `wants_data` (it
    /// reads at once).
    pub(crate) fn registered(now: u64, wants: bool, timing: &Timing) -> Demand {
        let mut demand = Demand::default();
        demand.heartbeat(now, wants, false, timing);
        demand
    }

    /// A heartbeat at `now`: `wants` is its `wants_data`, `progressed` whether it delivered more
    /// than the consumer had reported. True when the consumer asks from now on.
    pub(crate) fn heartbeat(&mut self, now: u64, wants: bool, progressed: bool, timing: &Timing) -> bool {
        self.wants_until = if wants { now.saturating_add(timing.intervals(WANT_HOLDS)) } else { now };
        if progressed {
            self.progressed_at = Some(now);
        }
        wants || progressed
    }

    /// Whether the consumer asks for data at `now`.
    fn asks(&self, now: u64, timing: &Timing) -> bool {
        now < self.wants_until
            || self.progressed_at.is_some_and(|at| now < at.saturating_add(timing.intervals(ACTIVE_FOR)))
    }
}

impl Consumer {
    /// Whether the consumer will read what is produced for it now.
    fn reading(&self) -> bool {
        !self.gone && !self.finished
    }
}

impl Job {
    /// Whether any consumer of the job asks for data at `now` (see the module's rule).
    pub(crate) fn wanted(&self, now: u64, timing: &Timing) -> bool {
        self.consumers.values().any(|c| c.reading() && c.demand.asks(now, timing))
    }
}

impl Pipeline {
    /// A consumer of `job` asked for data, or read.
    pub(crate) fn asked(&mut self, job: &str) {
        if !self.asking.contains(job) {
            self.asking.insert(job.to_string());
        }
    }

    /// The jobs a consumer asks data of at `now`, in name order; those no consumer asks of any
    /// more are forgotten until one asks again.
    pub(crate) fn jobs_asked_for(&mut self, now: u64, timing: &Timing) -> Vec<String> {
        let Pipeline { asking, jobs, .. } = self;
        asking.retain(|name| jobs.get(name).is_some_and(|j| j.wanted(now, timing)));
        asking.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_asks_only_when_it_says_so_and_until_a_heartbeat_says_otherwise() {
        let timing = Timing::default();
        assert!(!Demand::registered(1_000, false, &timing).asks(1_000, &timing), "an idle registration");
        let mut d = Demand::registered(1_000, true, &timing);
        assert!(d.asks(1_000, &timing) && d.asks(2_000, &timing));
        assert!(!d.asks(1_000 + timing.intervals(WANT_HOLDS), &timing), "a registration alone expires");
        d.heartbeat(1_100, false, false, &timing);
        assert!(
            !d.asks(1_100, &timing),
            "a consumer that wants nothing and read nothing is not produced for"
        );
    }

    #[test]
    fn wanting_holds_a_while_and_reading_keeps_a_consumer_served() {
        let timing = Timing::default();
        let mut d = Demand::registered(0, true, &timing);
        d.heartbeat(500, true, false, &timing);
        assert!(d.asks(500 + timing.intervals(WANT_HOLDS) - 1, &timing));
        assert!(!d.asks(500 + timing.intervals(WANT_HOLDS), &timing), "a silent consumer stops asking");
        d.heartbeat(10_000, false, true, &timing);
        assert!(d.asks(10_000 + timing.intervals(ACTIVE_FOR) - 1, &timing), "a reading consumer is served");
        assert!(
            !d.asks(10_000 + timing.intervals(ACTIVE_FOR), &timing),
            "a stalled one is not, until it asks"
        );
    }
}
