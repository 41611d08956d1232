//! The figures a worker sends with each heartbeat: rates over the last interval, per-stage
//! compute time, buffer depth and CPU use.

use crate::executor::StageTimes;
use granary_proto::v1::{StageTime, WorkerMetrics};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Counters the producers bump.
#[derive(Debug, Default)]
pub struct Counters {
    /// Elements produced by the executors.
    pub elements: AtomicU64,
    /// Cache entry bytes read, as stored.
    pub cache_bytes_read: AtomicU64,
    /// Cache entry bytes written and published.
    pub cache_bytes_written: AtomicU64,
    /// Elements computed from the source after a failed cache read.
    pub cache_recomputed: AtomicU64,
    /// Splits whose cache read failed (a bad entry, or the store) and were recomputed.
    pub cache_fallback_splits: AtomicU64,
    /// Elements a stage failed on that were dropped (`spec.errors.policy: skip`).
    pub skipped: AtomicU64,
    /// Nanoseconds spent finishing tensors for consumers (placement put the final
    /// normalization on this worker).
    pub finish_nanos: AtomicU64,
    /// Elements finished so.
    pub finish_elements: AtomicU64,
}

/// One engine's stage timers.
pub struct StageSource {
    /// Identifies the engine across samples (`pipeline@generation`).
    pub engine: String,
    /// Stage names, in plan order.
    pub names: Vec<String>,
    /// The execution's timers.
    pub times: Arc<StageTimes>,
}

/// Everything a sample reads.
pub struct Inputs {
    /// Elements produced so far.
    pub elements_total: u64,
    /// Parts taken by consumer streams so far.
    pub parts_total: u64,
    /// Payload bytes taken by consumer streams so far.
    pub bytes_total: u64,
    /// Parts queued, and the queues' capacity.
    pub buffered: (usize, usize),
    /// Leases held.
    pub active_leases: usize,
    /// Cores the worker computes with.
    pub cores: u32,
    /// The running engines' stage timers.
    pub stages: Vec<StageSource>,
    /// Nanoseconds spent finishing tensors for consumers, and the elements finished, so far.
    pub finished: (u64, u64),
}

/// Turns running totals into per-interval rates.
pub struct Sampler {
    at: Instant,
    elements: u64,
    parts: u64,
    bytes: u64,
    cpu: Option<Duration>,
    /// Finishing nanoseconds and elements at the last sample.
    finished: (u64, u64),
    /// Per engine: stage nanoseconds and elements at the last sample.
    stages: HashMap<String, (Vec<u64>, u64)>,
    /// Per stage name, in first-seen order: nanoseconds and elements since the sampler started.
    stage_totals: Vec<StageTotal>,
}

/// Compute time of one stage since the worker started, over every engine that ran it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageTotal {
    /// Stage name.
    pub stage: String,
    /// Nanoseconds computing.
    pub nanos: u64,
    /// Elements that went through it.
    pub elements: u64,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

impl Sampler {
    /// A sampler whose first interval starts now.
    pub fn new() -> Sampler {
        Sampler {
            at: Instant::now(),
            elements: 0,
            parts: 0,
            bytes: 0,
            cpu: cpu_time(),
            finished: (0, 0),
            stages: HashMap::new(),
            stage_totals: Vec::new(),
        }
    }

    /// Per stage, compute time and elements since the sampler started, as of the last sample.
    pub fn stage_totals(&self) -> &[StageTotal] {
        &self.stage_totals
    }

    /// CPU seconds this process used, as of the last sample.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu.map_or(0.0, |c| c.as_secs_f64())
    }

    /// The metrics since the previous sample.
    pub fn sample(&mut self, inputs: Inputs) -> WorkerMetrics {
        let now = Instant::now();
        let seconds = now.duration_since(self.at).as_secs_f64().max(1e-6);
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / seconds;
        let cpu = cpu_time();
        let cpu_cores_used = match (cpu, self.cpu) {
            (Some(now), Some(before)) => now.saturating_sub(before).as_secs_f64() / seconds,
            _ => 0.0,
        };
        let metrics = WorkerMetrics {
            elements_per_second: rate(inputs.elements_total, self.elements),
            batches_per_second: rate(inputs.parts_total, self.parts),
            bytes_per_second: rate(inputs.bytes_total, self.bytes),
            stages: self.stage_times(&inputs.stages),
            buffered_parts: saturate(inputs.buffered.0),
            buffer_capacity: saturate(inputs.buffered.1),
            active_leases: saturate(inputs.active_leases),
            cpu_cores_used,
            cores: inputs.cores,
            elements_total: inputs.elements_total,
            finish_seconds_per_element: per_element(inputs.finished, self.finished),
        };
        self.finished = inputs.finished;
        self.at = now;
        self.elements = inputs.elements_total;
        self.parts = inputs.parts_total;
        self.bytes = inputs.bytes_total;
        self.cpu = cpu;
        metrics
    }

    /// Mean seconds per element of each stage over the interval, engines with the same stage
    /// names together; stages that computed nothing in the interval are left out.
    fn stage_times(&mut self, sources: &[StageSource]) -> Vec<StageTime> {
        let mut order: Vec<String> = Vec::new();
        let mut sums: HashMap<String, (u64, u64)> = HashMap::new();
        let mut seen = HashMap::new();
        for source in sources {
            let (nanos, elements) = source.times.totals();
            let (before, elements_before) =
                self.stages.get(&source.engine).cloned().unwrap_or_else(|| (vec![0; nanos.len()], 0));
            let delta_elements = elements.saturating_sub(elements_before);
            if delta_elements > 0 {
                for (i, name) in source.names.iter().enumerate() {
                    let now = nanos.get(i).copied().unwrap_or(0);
                    let then = before.get(i).copied().unwrap_or(0);
                    let sum = sums.entry(name.clone()).or_insert_with(|| {
                        order.push(name.clone());
                        (0, 0)
                    });
                    sum.0 += now.saturating_sub(then);
                    sum.1 += delta_elements;
                }
            }
            seen.insert(source.engine.clone(), (nanos, elements));
        }
        self.stages = seen;
        for stage in &order {
            let Some(&(nanos, elements)) = sums.get(stage) else { continue };
            match self.stage_totals.iter_mut().find(|t| &t.stage == stage) {
                Some(total) => {
                    total.nanos += nanos;
                    total.elements += elements;
                }
                None => self.stage_totals.push(StageTotal { stage: stage.clone(), nanos, elements }),
            }
        }
        order
            .into_iter()
            .filter_map(|stage| {
                let (nanos, elements) = sums.get(&stage).copied()?;
                Some(StageTime { seconds_per_element: nanos as f64 / 1e9 / elements as f64, stage })
            })
            .collect()
    }
}

/// Seconds per element between two (nanoseconds, elements) totals; 0 when none passed.
fn per_element(now: (u64, u64), before: (u64, u64)) -> f64 {
    let elements = now.1.saturating_sub(before.1);
    if elements == 0 { 0.0 } else { now.0.saturating_sub(before.0) as f64 / 1e9 / elements as f64 }
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// CPU time (user and system) this process and its Python stage runners used so far.
fn cpu_time() -> Option<Duration> {
    Some(own_cpu_time()? + crate::ops::python::cpu::runners_cpu_time())
}

/// CPU time (user and system) this process used so far.
fn own_cpu_time() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer it is given, which points to one.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage succeeded, so it initialized the struct (which was zeroed anyway).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(elements: u64, parts: u64, bytes: u64) -> Inputs {
        Inputs {
            elements_total: elements,
            parts_total: parts,
            bytes_total: bytes,
            buffered: (3, 8),
            active_leases: 2,
            cores: 4,
            stages: Vec::new(),
            finished: (0, 0),
        }
    }

    #[test]
    fn rates_are_per_interval() {
        let mut sampler = Sampler::new();
        std::thread::sleep(Duration::from_millis(50));
        let first = sampler.sample(inputs(100, 10, 1000));
        assert!(first.elements_per_second > 0.0);
        assert_eq!((first.buffered_parts, first.buffer_capacity, first.active_leases), (3, 8, 2));
        assert_eq!(first.elements_total, 100);
        assert_eq!(first.cores, 4);
        std::thread::sleep(Duration::from_millis(20));
        let second = sampler.sample(inputs(100, 10, 1000));
        assert_eq!(second.elements_per_second, 0.0);
        assert_eq!(second.bytes_per_second, 0.0);
        assert!(second.cpu_cores_used >= 0.0);
        assert!(cpu_time().is_some());
    }

    #[test]
    fn finishing_time_is_per_element_over_the_interval() {
        let mut sampler = Sampler::new();
        let first = sampler.sample(Inputs { finished: (4_000_000, 8), ..inputs(8, 1, 100) });
        assert!((first.finish_seconds_per_element - 0.0005).abs() < 1e-12);
        let second = sampler.sample(Inputs { finished: (7_000_000, 10), ..inputs(10, 2, 200) });
        assert!((second.finish_seconds_per_element - 0.0015).abs() < 1e-12, "3 ms over 2 elements");
        let third = sampler.sample(Inputs { finished: (7_000_000, 10), ..inputs(12, 3, 300) });
        assert_eq!(third.finish_seconds_per_element, 0.0, "finished nothing: the clients did");
    }
}
