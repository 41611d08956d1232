//! The cache profile: what each legal cut would cost and save, measured on the pipeline's first
//! elements and a probe of the cache store. The dispatcher's autocacher decides from it.
//!
//! On one thread, beside the first splits (which compute meanwhile), for a sample of elements:
//! the source read, each stage as it runs, and at every cut the record encoding; then (up to a
//! byte budget per cut) the sample's records are written and read back through the entry format
//! in memory, which gives the compressed size and the encode and decode costs of exactly the code
//! that writes and reads real entries. Costs leave out the time the thread waits for a core, so
//! that the cores it shares with the running splits do not inflate them. The store's read and write throughput
//! come from writing, reading and deleting a probe object.

use super::{EngineCache, record};
use crate::element::Element;
use crate::executor::Plan;
use crate::ops::Fate;
use crate::seed::SeededRng;
use crate::source::Source;
use bytes::Bytes;
use granary_proto::v1 as pb;
use granary_store::cache::{CacheStore, Fingerprint};
use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How much to measure.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most elements to run.
    pub elements: usize,
    /// Stop sampling after this long (at least two elements are run).
    pub time: Duration,
    /// Size of the store probe object.
    pub probe_bytes: usize,
    /// Most record bytes per cut written and read back to measure compression.
    pub cut_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { elements: 24, time: Duration::from_millis(250), probe_bytes: 8 << 20, cut_bytes: 16 << 20 }
    }
}

/// What a profile measures, owned, so that it runs on a thread of its own.
pub struct Profiler {
    pub(crate) source: Arc<Source>,
    pub(crate) plan: Arc<Plan>,
    pub(crate) threads: usize,
    pub(crate) rt: Handle,
}

impl Profiler {
    /// Measures the profile (nothing when the pipeline does not cache).
    pub fn measure(&self, limits: Limits) -> Option<pb::CacheProfile> {
        let cache = self.plan.cache.as_deref()?;
        Some(measure(&self.source, &self.plan, cache, self.threads, limits, &self.rt))
    }
}

/// A stopwatch for this thread that runs while it computes or waits on I/O, but not while it
/// waits for a core (Linux's per-thread run-queue delay, `/proc/thread-self/schedstat`): what
/// the work would take with a core of its own, although the running splits share the cores.
/// Where the delay cannot be read it is the wall clock.
struct Stopwatch {
    wall: Instant,
    delay: Duration,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch { delay: run_queue_delay(), wall: Instant::now() }
    }

    fn elapsed(&self) -> Duration {
        let wall = self.wall.elapsed();
        let computed = wall.saturating_sub(run_queue_delay().saturating_sub(self.delay));
        // The kernel accounts the delay at context switches, so on a loaded machine a short
        // interval can read as all delay; work takes time, so that reading falls back to the wall.
        if computed.is_zero() { wall } else { computed }
    }
}

/// Time this thread has spent runnable but not running.
fn run_queue_delay() -> Duration {
    let Ok(text) = std::fs::read_to_string("/proc/thread-self/schedstat") else { return Duration::ZERO };
    let waited = text.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_nanos(waited)
}

/// Measures the profile; failures are reported in its `error` field.
fn measure(
    source: &Source,
    plan: &Plan,
    cache: &EngineCache,
    threads: usize,
    limits: Limits,
    rt: &Handle,
) -> pb::CacheProfile {
    let mut profile = pb::CacheProfile { cores: threads.max(1) as u32, ..pb::CacheProfile::default() };
    if let Err(e) = sample(source, plan, cache, limits, rt, &mut profile) {
        profile.error = e;
        return profile;
    }
    // A small probe first: a slow store is measured in a moment, a fast one with a full-size
    // object (small ones measure the latency rather than the throughput).
    let small = (limits.probe_bytes / 16).max(1);
    let probe = rt.block_on(async {
        let rates = cache.store.probe(small).await?;
        let seconds = small as f64 / rates.read_bytes_per_s.min(rates.write_bytes_per_s).max(1.0);
        if seconds < 0.05 { cache.store.probe(limits.probe_bytes).await } else { Ok(rates) }
    });
    match probe {
        Ok(rates) => {
            profile.read_bytes_per_second = rates.read_bytes_per_s;
            profile.write_bytes_per_second = rates.write_bytes_per_s;
        }
        Err(e) => profile.error = format!("cannot probe the cache store `{}`: {e}", cache.store.url()),
    }
    profile
}

/// Sampled elements: (split id, index in the split, element).
type Sample = Vec<(u64, u64, Element)>;

/// Reads the sample, and the seconds it took.
fn read_sample(source: &Source, limits: Limits, rt: &Handle) -> Result<(Sample, f64), String> {
    let start = Stopwatch::start();
    let mut sample = Vec::new();
    for split in source.splits() {
        let mut index = 0u64;
        source
            .read_split(split, rt, &mut |element| {
                sample.push((split.id, index, element));
                index += 1;
                sample.len() < limits.elements && (sample.len() < 2 || start.elapsed() < limits.time / 4)
            })
            .map_err(|e| e.to_string())?;
        if sample.len() >= limits.elements || (sample.len() >= 2 && start.elapsed() >= limits.time / 4) {
            break;
        }
    }
    Ok((sample, start.elapsed().as_secs_f64()))
}

fn sample(
    source: &Source,
    plan: &Plan,
    cache: &EngineCache,
    limits: Limits,
    rt: &Handle,
    profile: &mut pb::CacheProfile,
) -> Result<(), String> {
    let (elements, read_seconds) = read_sample(source, limits, rt)?;
    if elements.is_empty() {
        return Err("the source has no elements to measure".into());
    }
    let cuts: Vec<(usize, usize)> =
        cache.cuts.iter().filter_map(|c| plan.stage_at_cut(c.index).map(|j| (c.index, j))).collect();
    let mut stage_nanos = vec![0u128; plan.stages.len()];
    let mut kept = Kept::new(cuts.len());
    let started = Stopwatch::start();
    let mut n = 0usize;
    for (split_id, index, mut element) in elements {
        if n >= 2 && started.elapsed() > limits.time {
            break;
        }
        let mut rng = SeededRng::for_element(plan.seed, 0, split_id, index);
        // A filter that drops the element ends its run, as in the executor: the stages after it
        // cost nothing for it, so their time per sampled element counts only the survivors.
        let mut dropped = false;
        // `text.pack` and what follows it run on whole splits' rows, not on single elements.
        let stages = &plan.stages[..plan.element_stages()];
        for (j, (stage, nanos)) in stages.iter().zip(stage_nanos.iter_mut()).enumerate() {
            kept.at(&cuts, j, &element, limits.cut_bytes);
            let t = Stopwatch::start();
            let fate = stage
                .op
                .run(&mut element, &mut rng)
                .map_err(|e| format!("{} failed on `{}`: {}", stage.path, element.key, e.0))?;
            *nanos += t.elapsed().as_nanos();
            if fate == Fate::Drop {
                dropped = true;
                break;
            }
        }
        if !dropped {
            kept.at(&cuts, stages.len(), &element, limits.cut_bytes);
        }
        n += 1;
    }
    let Kept { records, serialize_nanos, .. } = kept;
    let per = |nanos: u128| nanos as f64 / 1e9 / n as f64;
    let read_s = read_seconds / n as f64;
    let stage_s: Vec<f64> = stage_nanos.iter().map(|t| per(*t)).collect();
    profile.sampled_elements = n as u64;
    profile.compute_seconds_per_element = read_s + stage_s.iter().sum::<f64>();
    for (c, (k, j)) in cuts.iter().enumerate() {
        let Some(cut) = cache.cut(*k) else { continue };
        let kept = records[c].len().max(1) as f64;
        let (stored, encode, decode) = round_trip(cut.fingerprint(), &records[c], rt)?;
        profile.boundaries.push(pb::CacheBoundary {
            index: *k as u32,
            stage: cut.stage.clone(),
            fingerprint: cut.fingerprint().to_string(),
            source_fingerprints: cut.fingerprints.iter().map(|f| f.to_string()).collect(),
            prefix_seconds_per_element: read_s + stage_s[..*j].iter().sum::<f64>(),
            suffix_seconds_per_element: stage_s[*j..].iter().sum::<f64>(),
            bytes_per_element: stored as f64 / kept,
            encode_seconds_per_element: per(serialize_nanos[c]) + encode / kept,
            decode_seconds_per_element: decode / kept,
        });
    }
    Ok(())
}

/// Per cut: the records kept to measure compression (up to a byte budget), their bytes, and
/// the serialization time over every sampled element.
struct Kept {
    records: Vec<Vec<Bytes>>,
    bytes: Vec<usize>,
    serialize_nanos: Vec<u128>,
}

impl Kept {
    fn new(cuts: usize) -> Kept {
        Kept { records: vec![Vec::new(); cuts], bytes: vec![0; cuts], serialize_nanos: vec![0; cuts] }
    }

    /// Serializes `element` for every cut at plan stage `j`; `cuts` are (cut, plan stage).
    fn at(&mut self, cuts: &[(usize, usize)], j: usize, element: &Element, budget: usize) {
        for (c, (_, at)) in cuts.iter().enumerate() {
            if *at != j {
                continue;
            }
            let t = Stopwatch::start();
            let r = record::to_bytes(element);
            self.serialize_nanos[c] += t.elapsed().as_nanos();
            if self.records[c].is_empty() || self.bytes[c] + r.len() <= budget {
                self.bytes[c] += r.len();
                self.records[c].push(Bytes::from(r));
            }
        }
    }
}

/// Writes `records` as one split of an entry in memory and reads it back: (stored bytes, seconds
/// to write, seconds to read and decode).
fn round_trip(fp: &Fingerprint, records: &[Bytes], rt: &Handle) -> Result<(u64, f64, f64), String> {
    let store =
        CacheStore::new(Arc::new(InMemory::new()), StorePath::from("profile"), "memory://profile/".into());
    let t = Stopwatch::start();
    let manifest = rt.block_on(async {
        let mut w = store.split_writer(fp, 0, "profile");
        for r in records {
            w.push(r).await?;
        }
        w.finish().await
    });
    let manifest = manifest.map_err(|e| format!("cannot encode the sample: {e}"))?;
    let encode = t.elapsed().as_secs_f64();
    let t = Stopwatch::start();
    for i in 0..manifest.chunks.len() {
        let chunk = rt
            .block_on(store.read_chunk(fp, &manifest, i))
            .map_err(|e| format!("cannot decode the sample: {e}"))?;
        for r in &chunk {
            record::decode(r).map_err(|e| e.to_string())?;
        }
    }
    Ok((manifest.stored_bytes(), encode, t.elapsed().as_secs_f64()))
}
