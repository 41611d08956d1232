//! Running totals kept for metrics only (not journaled; they start again with the dispatcher):
//! worker registrations and losses per pipeline, and what the trainers of each job report.

use granary_proto::TRAINER_SECONDS_BUCKETS;
use granary_proto::v1 as pb;

/// Workers of one pipeline since this dispatcher started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Registrations (a worker starting, or registering again after a dispatcher restart).
    pub registrations: u64,
    /// Workers dropped after missing their heartbeats: crashed, killed, or cut off.
    pub lost: u64,
}

/// Observations in the buckets of [`TRAINER_SECONDS_BUCKETS`], and their sum.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketTotals {
    /// Per bucket (not cumulative); the last one is above every bound.
    pub counts: Vec<u64>,
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl Default for BucketTotals {
    fn default() -> Self {
        BucketTotals { counts: vec![0; TRAINER_SECONDS_BUCKETS.len() + 1], sum: 0.0 }
    }
}

impl BucketTotals {
    /// Observations counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds what `now` holds beyond `seen` (both one session's cumulative histograms) and
    /// remembers `now`. A histogram with other bounds, or not ahead of `seen` (it arrived late),
    /// adds nothing.
    fn absorb(&mut self, seen: &mut Option<pb::LatencyHistogram>, now: Option<&pb::LatencyHistogram>) {
        let Some(now) = now else { return };
        if now.bounds != TRAINER_SECONDS_BUCKETS || now.counts.len() != self.counts.len() {
            return;
        }
        let (before_counts, before_sum, before_count) = match seen.as_ref() {
            Some(s) => (s.counts.as_slice(), s.sum, s.count),
            None => (&[][..], 0.0, 0),
        };
        if now.count <= before_count {
            return;
        }
        for (i, total) in self.counts.iter_mut().enumerate() {
            let before = before_counts.get(i).copied().unwrap_or(0);
            *total += now.counts[i].saturating_sub(before);
        }
        let added = now.sum - before_sum;
        if added.is_finite() && added > 0.0 {
            self.sum += added;
        }
        *seen = Some(now.clone());
    }
}

/// What the trainers of one job reported, summed over their sessions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainerTotals {
    /// Batches delivered.
    pub batches: u64,
    /// Trainer step times (outside the client).
    pub step: BucketTotals,
    /// Waits for a batch.
    pub wait: BucketTotals,
}

/// The latest cumulative figures of one consumer session, to count only what is new.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionSeen {
    batches: u64,
    step: Option<pb::LatencyHistogram>,
    wait: Option<pb::LatencyHistogram>,
}

impl TrainerTotals {
    /// Adds what a heartbeat's metrics hold beyond what this session reported before.
    pub(crate) fn absorb(&mut self, seen: &mut SessionSeen, metrics: &pb::ClientMetrics) {
        if metrics.batches_total > seen.batches {
            self.batches += metrics.batches_total - seen.batches;
            seen.batches = metrics.batches_total;
        }
        self.step.absorb(&mut seen.step, metrics.step_histogram.as_ref());
        self.wait.absorb(&mut seen.wait, metrics.wait_histogram.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(counts: &[(usize, u64)], sum: f64) -> pb::LatencyHistogram {
        let mut all = vec![0; TRAINER_SECONDS_BUCKETS.len() + 1];
        for &(i, n) in counts {
            all[i] = n;
        }
        pb::LatencyHistogram {
            bounds: TRAINER_SECONDS_BUCKETS.to_vec(),
            count: all.iter().sum(),
            counts: all,
            sum,
        }
    }

    fn metrics(batches: u64, wait: pb::LatencyHistogram) -> pb::ClientMetrics {
        pb::ClientMetrics { batches_total: batches, wait_histogram: Some(wait), ..Default::default() }
    }

    #[test]
    fn sessions_add_what_is_new_and_late_reports_add_nothing() {
        let mut totals = TrainerTotals::default();
        let (mut a, mut b) = (SessionSeen::default(), SessionSeen::default());
        totals.absorb(&mut a, &metrics(2, histogram(&[(0, 2)], 0.001)));
        totals.absorb(&mut a, &metrics(5, histogram(&[(0, 2), (4, 3)], 0.031)));
        // The first report again, late: nothing new.
        totals.absorb(&mut a, &metrics(2, histogram(&[(0, 2)], 0.001)));
        totals.absorb(&mut b, &metrics(1, histogram(&[(14, 1)], 20.0)));
        assert_eq!(totals.batches, 6);
        let mut expected = vec![0; TRAINER_SECONDS_BUCKETS.len() + 1];
        expected[0] = 2;
        expected[4] = 3;
        expected[14] = 1;
        assert_eq!(totals.wait.counts, expected);
        assert_eq!(totals.wait.count(), 6);
        assert!((totals.wait.sum - 20.031).abs() < 1e-9);
        assert_eq!(totals.step, BucketTotals::default(), "no step histogram was sent");
    }

    #[test]
    fn other_bounds_are_ignored() {
        let mut totals = TrainerTotals::default();
        let mut seen = SessionSeen::default();
        let odd = pb::LatencyHistogram { bounds: vec![1.0], counts: vec![1, 0], sum: 0.5, count: 1 };
        totals.absorb(&mut seen, &metrics(1, odd));
        assert_eq!((totals.batches, totals.wait.count()), (1, 0));
    }
}
