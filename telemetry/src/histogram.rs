//! A histogram whose observations are counted elsewhere and arrive already bucketed: trainer
//! clients count their step and wait times and send the counts with each heartbeat; the
//! dispatcher adds what is new and exposes the sum per job.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Clone, Debug, Default)]
struct Series {
    /// Per bucket (not cumulative), the last one above every bound.
    counts: Vec<u64>,
    sum: f64,
}

/// A labelled histogram family fed with bucket counts rather than single observations.
#[derive(Clone)]
pub struct CumulativeHistogramVec {
    desc: Desc,
    bounds: Vec<f64>,
    series: Arc<Mutex<BTreeMap<Vec<String>, Series>>>,
}

impl CumulativeHistogramVec {
    /// A family `name` with the variable labels `labels` and the bucket upper bounds `bounds`
    /// (ascending; `+Inf` is implied).
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        bounds: &[f64],
    ) -> Result<CumulativeHistogramVec, prometheus::Error> {
        if bounds.windows(2).any(|w| w[0] >= w[1]) || bounds.iter().any(|b| !b.is_finite()) {
            return Err(prometheus::Error::Msg(format!(
                "the bounds of `{name}` must be finite and ascending"
            )));
        }
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            HashMap::new(),
        )?;
        Ok(CumulativeHistogramVec { desc, bounds: bounds.to_vec(), series: Arc::default() })
    }

    /// The bucket upper bounds.
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    fn series(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<String>, Series>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `counts` (per bucket, one more than the bounds) observations summing to `sum` to the
    /// series `labels`, creating it. Counts of another length are refused: `false`.
    pub fn add(&self, labels: &[&str], counts: &[u64], sum: f64) -> bool {
        if counts.len() != self.bounds.len() + 1 || labels.len() != self.desc.variable_labels.len() {
            return false;
        }
        let mut all = self.series();
        let series = all
            .entry(labels.iter().map(|l| l.to_string()).collect())
            .or_insert_with(|| Series { counts: vec![0; counts.len()], sum: 0.0 });
        for (total, n) in series.counts.iter_mut().zip(counts) {
            *total += n;
        }
        if sum.is_finite() {
            series.sum += sum;
        }
        true
    }

    /// Keeps only the series whose label values `keep` accepts.
    pub fn retain(&self, keep: impl Fn(&[String]) -> bool) {
        self.series().retain(|labels, _| keep(labels));
    }
}

impl Collector for CumulativeHistogramVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut metrics = Vec::new();
        for (values, series) in self.series().iter() {
            let mut cumulative = 0;
            let mut buckets = Vec::with_capacity(self.bounds.len());
            for (bound, n) in self.bounds.iter().zip(&series.counts) {
                cumulative += n;
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(*bound);
                bucket.set_cumulative_count(cumulative);
                buckets.push(bucket);
            }
            let mut histogram = Histogram::default();
            histogram.set_bucket(buckets);
            histogram.set_sample_count(series.counts.iter().sum());
            histogram.set_sample_sum(series.sum);
            let mut metric = Metric::default();
            metric.set_label(
                self.desc
                    .variable_labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(name.clone());
                        pair.set_value(value.clone());
                        pair
                    })
                    .collect(),
            );
            metric.set_histogram(histogram);
            metrics.push(metric);
        }
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_counts_render_as_a_cumulative_histogram() {
        let h = CumulativeHistogramVec::new("granary_test_seconds", "Test.", &["job"], &[0.1, 1.0]).unwrap();
        let registry = prometheus::Registry::new();
        registry.register(Box::new(h.clone())).unwrap();
        assert!(h.add(&["a"], &[1, 2, 0], 1.5));
        assert!(h.add(&["a"], &[0, 1, 1], 10.0));
        assert!(!h.add(&["a"], &[1, 1], 1.0), "a count per bucket and one above");
        let text = crate::render(&registry);
        for line in [
            "# TYPE granary_test_seconds histogram",
            "granary_test_seconds_bucket{job=\"a\",le=\"0.1\"} 1",
            "granary_test_seconds_bucket{job=\"a\",le=\"1\"} 4",
            "granary_test_seconds_bucket{job=\"a\",le=\"+Inf\"} 5",
            "granary_test_seconds_sum{job=\"a\"} 11.5",
            "granary_test_seconds_count{job=\"a\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        h.retain(|labels| labels[0] != "a");
        assert!(!crate::render(&registry).contains("job=\"a\""));
    }

    #[test]
    fn bounds_must_ascend() {
        assert!(CumulativeHistogramVec::new("granary_x_seconds", "X.", &[], &[1.0, 0.5]).is_err());
    }
}
