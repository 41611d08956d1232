//! Quantities derived from one observation: trainer demand, per-worker supply, how much the
//! trainers wait, and how full the worker buffers are. Pure functions, shared by the policies and
//! the simulator's reports.

use serde::{Deserialize, Serialize};

use crate::inputs::{JobMetrics, JobMode, Observation, WorkerMetrics, sane};

/// Batches per second the job's consumers would take if they never waited, or `None` when no
/// consumer reported a step time. Data-parallel peers run in lockstep, so the job runs at its
/// consumers' mean step time: `consumers / step` batches per second when distributed,
/// `1 / step` when replicated.
pub fn job_demand(job: &JobMetrics) -> Option<f64> {
    let steps: Vec<f64> = job.consumers.iter().map(|c| sane(c.step_seconds)).filter(|s| *s > 0.0).collect();
    if steps.is_empty() {
        return if job.consumers.is_empty() { Some(0.0) } else { None };
    }
    let mean_step = steps.iter().sum::<f64>() / steps.len() as f64;
    let peers = match job.mode {
        JobMode::Distributed => job.consumers.len() as f64,
        JobMode::Replicated => 1.0,
    };
    let demand = peers / mean_step;
    demand.is_finite().then_some(demand)
}

/// Demand of the whole pool: the sum over jobs, or `None` when any job's demand is unknown.
pub fn demand(obs: &Observation) -> Option<f64> {
    let mut total = 0.0;
    for job in &obs.jobs {
        total += job_demand(job)?;
    }
    total.is_finite().then_some(total)
}

/// Fraction of a step the trainers spend waiting: each job's mean over its consumers, weighted by
/// the job's demand (so it is the share of the pool's demand that goes unserved), or `None` when
/// no consumer finished a step or waited.
pub fn wait_fraction(obs: &Observation) -> Option<f64> {
    let mut weighted = 0.0;
    let mut weights = 0.0;
    let mut plain = Vec::new();
    for job in &obs.jobs {
        let fractions: Vec<f64> = job
            .consumers
            .iter()
            .filter_map(|c| {
                let (step, wait) = (sane(c.step_seconds), sane(c.wait_seconds));
                let whole = step + wait;
                (whole > 0.0 && whole.is_finite()).then(|| wait / whole)
            })
            .collect();
        if fractions.is_empty() {
            continue;
        }
        let mean = fractions.iter().sum::<f64>() / fractions.len() as f64;
        plain.push(mean);
        let weight = job_demand(job).unwrap_or(0.0);
        weighted += weight * mean;
        weights += weight;
    }
    if plain.is_empty() {
        return None;
    }
    let w = if weights > 0.0 && weighted.is_finite() {
        weighted / weights
    } else {
        plain.iter().sum::<f64>() / plain.len() as f64
    };
    Some(w.clamp(0.0, 1.0))
}

/// Fraction of the workers' buffer capacity in use, or `None` when no worker has a buffer.
pub fn buffer_fill(obs: &Observation) -> Option<f64> {
    let used: f64 = obs.workers.iter().map(|w| f64::from(w.buffered_parts)).sum();
    let capacity: f64 = obs.workers.iter().map(|w| f64::from(w.buffer_capacity)).sum();
    (capacity > 0.0).then(|| (used / capacity).min(1.0))
}

/// Fraction of the workers' cores kept busy computing: elements produced per second times the
/// compute seconds per element (all stages and any finishing), over the cores; `None` without
/// stage times. Well under 1 means the workers wait on their consumers: supply exceeds demand,
/// even when the backlog sits in transport windows and client buffers rather than in the
/// workers' queues.
pub fn busy_fraction(obs: &Observation) -> Option<f64> {
    let mut busy = 0.0;
    let mut cores = 0.0;
    for w in &obs.workers {
        let per_element = compute_seconds_per_element(w);
        if w.cores == 0 {
            continue;
        }
        if w.elements_per_second <= 0.0 {
            // Computed nothing in the interval (so no stage times either): idle.
        } else if per_element > 0.0 {
            busy += w.elements_per_second * per_element;
        } else {
            // Output without stage times: unknown, left out.
            continue;
        }
        cores += f64::from(w.cores);
    }
    (cores > 0.0).then(|| (busy / cores).min(1.0))
}

/// A worker's compute seconds per element: its stages, and the finishing it does for its
/// consumers when placement puts that on the workers.
pub fn compute_seconds_per_element(w: &WorkerMetrics) -> f64 {
    w.stages.iter().map(|s| sane(s.seconds_per_element)).sum::<f64>() + sane(w.finish_seconds_per_element)
}

/// Where a per-worker rate estimate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RateSource {
    /// Measured output while the workers were the bottleneck (buffers not filling, cores busy).
    Measured,
    /// Cores divided by the per-stage compute time of a batch (workers not saturated).
    Stages,
    /// Measured output scaled to all cores by the CPU in use (no stage times).
    CpuScaled,
}

/// A per-worker production capacity in batches per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateEstimate {
    /// Batches per second one worker can make.
    pub per_worker: f64,
    /// How it was estimated.
    pub source: RateSource,
}

/// A worker's measured output in batches per second.
fn measured(w: &WorkerMetrics, elements_per_batch: u32) -> f64 {
    sane(w.elements_per_second) / f64::from(elements_per_batch.max(1))
}

/// A worker's capacity from its stage times: its cores over the compute time of one batch.
fn from_stages(w: &WorkerMetrics, elements_per_batch: u32) -> Option<f64> {
    let per_element = compute_seconds_per_element(w);
    let per_batch = per_element * f64::from(elements_per_batch.max(1));
    (per_batch > 0.0 && w.cores > 0).then(|| f64::from(w.cores) / per_batch)
}

/// A worker's capacity from its output scaled to all its cores by the CPU it used.
fn cpu_scaled(w: &WorkerMetrics, elements_per_batch: u32) -> Option<f64> {
    let used = sane(w.cpu_cores_used);
    let output = measured(w, elements_per_batch);
    (used > 0.0 && output > 0.0 && w.cores > 0).then(|| output * f64::from(w.cores) / used)
}

/// Workers whose cores are busier than this are the bottleneck (see [`busy_fraction`]).
pub const BUSY_SATURATED: f64 = 0.8;

/// Capacity of one worker, averaged over the reporting workers. When the workers' buffers are
/// less than `saturated_below` full and their cores are busy (at least [`BUSY_SATURATED`], when
/// stage times tell) they are the bottleneck and their measured output is their capacity;
/// otherwise their output only follows demand, and capacity comes from stage times (or, lacking
/// those, from output scaled by CPU use). Idle cores matter because a slow consumer's backlog may
/// sit in transport windows and client buffers, leaving the workers' queues empty. `None` when
/// nothing usable was reported.
pub fn worker_rate(obs: &Observation, saturated_below: f64) -> Option<RateEstimate> {
    let b = obs.config.elements_per_batch;
    let saturated = buffer_fill(obs).is_none_or(|f| f < saturated_below)
        && busy_fraction(obs).is_none_or(|busy| busy >= BUSY_SATURATED);
    let (rates, source): (Vec<f64>, RateSource) = if saturated {
        (obs.workers.iter().map(|w| measured(w, b)).filter(|r| *r > 0.0).collect(), RateSource::Measured)
    } else {
        let stages: Vec<f64> = obs.workers.iter().filter_map(|w| from_stages(w, b)).collect();
        if stages.is_empty() {
            (obs.workers.iter().filter_map(|w| cpu_scaled(w, b)).collect(), RateSource::CpuScaled)
        } else {
            (stages, RateSource::Stages)
        }
    };
    if rates.is_empty() {
        return None;
    }
    let per_worker = rates.iter().sum::<f64>() / rates.len() as f64;
    (per_worker > 0.0 && per_worker.is_finite()).then_some(RateEstimate { per_worker, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{ConsumerMetrics, PoolConfig, StageTime};

    fn consumer(step: f64, wait: f64) -> ConsumerMetrics {
        ConsumerMetrics { step_seconds: step, wait_seconds: wait, ..Default::default() }
    }

    #[test]
    fn distributed_peers_add_up_and_replicas_do_not() {
        let mut job =
            JobMetrics { consumers: vec![consumer(0.1, 0.0), consumer(0.1, 0.0)], ..Default::default() };
        assert_eq!(job_demand(&job), Some(20.0));
        job.mode = JobMode::Replicated;
        assert_eq!(job_demand(&job), Some(10.0));
        job.consumers = vec![consumer(0.0, 1.0)];
        assert_eq!(job_demand(&job), None);
    }

    #[test]
    fn rate_source_follows_the_buffers() {
        let worker = WorkerMetrics {
            elements_per_second: 256.0,
            // 256 elements/s × 1/64 s each = 4 cores busy: saturated.
            stages: vec![StageTime { stage: "decode".into(), seconds_per_element: 1.0 / 64.0 }],
            buffered_parts: 1,
            buffer_capacity: 8,
            cpu_cores_used: 1.0,
            cores: 4,
            ..Default::default()
        };
        let mut obs = Observation {
            workers: vec![worker],
            config: PoolConfig { elements_per_batch: 256, ..Default::default() },
            ..Default::default()
        };
        let measured = worker_rate(&obs, 0.5).map(|r| (r.source, r.per_worker));
        assert_eq!(measured, Some((RateSource::Measured, 1.0)));
        // Empty buffers but idle cores: the backlog is elsewhere, capacity comes from stages.
        obs.workers[0].elements_per_second = 64.0;
        let r = worker_rate(&obs, 0.5).map(|r| (r.source, r.per_worker));
        assert_eq!(r, Some((RateSource::Stages, 1.0)));
        obs.workers[0].elements_per_second = 256.0;
        obs.workers[0].buffered_parts = 8;
        let r = worker_rate(&obs, 0.5).map(|r| r.source);
        assert_eq!(r, Some(RateSource::Stages));
        obs.workers[0].stages.clear();
        let r = worker_rate(&obs, 0.5).map(|r| (r.source, r.per_worker));
        assert_eq!(r, Some((RateSource::CpuScaled, 4.0)));
    }

    #[test]
    fn waiting_is_weighted_by_demand() {
        // Job one: 1/0.3 batches/s, waits 25%; job two: 1/0.1 batches/s (three times more), never.
        let obs = Observation {
            jobs: vec![
                JobMetrics { consumers: vec![consumer(0.3, 0.1)], ..Default::default() },
                JobMetrics { consumers: vec![consumer(0.1, 0.0)], ..Default::default() },
            ],
            ..Default::default()
        };
        let w = wait_fraction(&obs).unwrap_or(0.0);
        assert!((w - 0.0625).abs() < 1e-9, "{w}");
    }
}
