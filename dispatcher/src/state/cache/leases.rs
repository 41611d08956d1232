//! Cache tasks of leases, and what completions and lost leases change in the entries.
//!
//! Entries are per source: a split's entry is its source's, and its split there is its index in
//! that source's listing ([`crate::state::PipelineFacts::entry_split`]), so a mixed pipeline and
//! a single-source one reading the same source keep one set of entry splits between them.

use crate::state::{Event, State};
use granary_proto::v1 as pb;

impl State {
    /// Where split `split` of `pipeline` keeps its entries: (source, entry split).
    fn entry_split_of(&self, pipeline: &str, split: u64) -> Option<(usize, u64)> {
        self.pipelines.get(pipeline)?.facts.entry_split(split)
    }

    /// The cache task of a new lease (`lease` is its id): read a complete split, write one no
    /// other lease writes, compute otherwise. Replays (one consumer's parts) never write.
    pub(crate) fn cache_task(
        &mut self,
        pipeline: &str,
        split: u64,
        replay: bool,
        lease: u64,
        now: u64,
    ) -> pb::CacheTask {
        let compute = pb::CacheTask { mode: pb::CacheMode::Compute as i32, ..Default::default() };
        let Some((input, entry_split)) = self.entry_split_of(pipeline, split) else { return compute };
        let Some(p) = self.pipelines.get_mut(pipeline) else { return compute };
        if p.cache.timed() {
            p.cache.granted.insert(lease, now);
        }
        let (Some(key), Some(chosen)) = (p.cache.entry_key(input), p.cache.decision.as_ref()) else {
            return compute;
        };
        let boundary = chosen.boundary as u32;
        let entry = self.cache_entries.entry(key.clone()).or_default();
        let mode = if entry.complete.contains_key(&entry_split) {
            if p.cache.touched.insert(key.1.clone()) {
                self.cache_touches.push(key.clone());
            }
            pb::CacheMode::Read
        } else if replay || entry.bad.contains(&entry_split) || entry.writing.contains_key(&entry_split) {
            // Another lease writes it: this pipeline's (a further pass of an upsampled source
            // in the same epoch) or another pipeline's over the same source.
            pb::CacheMode::Compute
        } else {
            entry.writing.insert(entry_split, lease);
            pb::CacheMode::Write
        };
        entry.last_used_ms = entry.last_used_ms.max(now);
        pb::CacheTask { mode: mode as i32, boundary, fingerprint: key.1 }
    }

    /// Marks a split held (again) by a lease adopted after a dispatcher restart as being written.
    pub(crate) fn adopt_cache_task(&mut self, pipeline: &str, task: &pb::CacheTask, split: u64, lease: u64) {
        if task.mode != pb::CacheMode::Write as i32 {
            return;
        }
        let Some(store) = self.pipelines.get(pipeline).and_then(|p| p.cache.config.store.clone()) else {
            return;
        };
        let Some((_, split)) = self.entry_split_of(pipeline, split) else { return };
        let entry = self.cache_entries.entry((store, task.fingerprint.clone())).or_default();
        if !entry.complete.contains_key(&split) {
            entry.writing.entry(split).or_insert(lease);
        }
    }

    /// A lease ended without completing: its split is no longer being written.
    pub(crate) fn cache_release(
        &mut self,
        pipeline: &str,
        task: Option<&pb::CacheTask>,
        split: u64,
        lease: u64,
    ) {
        if let Some(p) = self.pipelines.get_mut(pipeline) {
            p.cache.granted.remove(&lease);
        }
        let Some(task) = task else { return };
        let Some(store) = self.pipelines.get(pipeline).and_then(|p| p.cache.config.store.clone()) else {
            return;
        };
        let Some((_, split)) = self.entry_split_of(pipeline, split) else { return };
        if let Some(entry) = self.cache_entries.get_mut(&(store, task.fingerprint.clone()))
            && entry.writing.get(&split) == Some(&lease)
        {
            entry.writing.remove(&split);
        }
    }

    /// Records what the cache did for a completed split (its lease had `task`; `None` for a
    /// lease from before a restart, which counts against the pipeline's current entry of the
    /// split's source).
    pub(crate) fn cache_complete(
        &mut self,
        pipeline: &str,
        task: Option<&pb::CacheTask>,
        req: &pb::CompleteSplitRequest,
        epoch: u32,
        split: u64,
    ) {
        let outcome = req.cache.clone().unwrap_or_default();
        let located = self.entry_split_of(pipeline, split);
        let Some(p) = self.pipelines.get_mut(pipeline) else { return };
        let mode = task.map_or(pb::CacheMode::Compute as i32, |t| t.mode);
        let granted = p.cache.granted.remove(&req.lease_id);
        let timed = p.cache.timed();
        let counts = &p.facts.counts;
        let listed = split.checked_rem(counts.len() as u64).and_then(|i| counts.get(i as usize)).copied();
        let stats = p.cache.stats.entry(epoch).or_default();
        if timed {
            stats.elements += listed.unwrap_or(0);
            if let Some(t) = granted {
                stats.started_ms = Some(stats.started_ms.map_or(t, |s| s.min(t)));
            }
            p.cache.unstamped.insert(epoch);
        }
        if outcome.bad {
            stats.splits_bad += 1;
        } else if mode == pb::CacheMode::Read as i32 {
            stats.splits_read += 1;
            if outcome.recomputed > 0 {
                stats.splits_read_failed += 1;
            }
        } else if outcome.written {
            stats.splits_written += 1;
        } else {
            stats.splits_computed += 1;
        }
        stats.bytes_read += outcome.bytes_read;
        stats.bytes_written += outcome.bytes_written;
        stats.recomputed += outcome.recomputed;
        let Some((input, split)) = located else { return };
        let key = match (task, &p.cache.config.store) {
            (Some(t), Some(store)) if !t.fingerprint.is_empty() => {
                Some((store.clone(), t.fingerprint.clone()))
            }
            (Some(_), _) => None,
            (None, _) => p.cache.entry_key(input),
        };
        let Some(key) = key else { return };
        let entry = self.cache_entries.entry(key.clone()).or_default();
        if entry.writing.get(&split) == Some(&req.lease_id) || outcome.written || outcome.bad {
            entry.writing.remove(&split);
        }
        if outcome.bad {
            if !outcome.problem.is_empty() {
                tracing::warn!(pipeline, split, fingerprint = %key.1, "cache split is bad: {}", outcome.problem);
            }
            if entry.mark_bad(split) {
                self.events.push(Event::CacheSplitBad { store: key.0, fingerprint: key.1, split });
            }
        } else if outcome.written {
            if entry.written(split, outcome.bytes_written) {
                self.events.push(Event::CacheSplitWritten {
                    store: key.0,
                    fingerprint: key.1,
                    split,
                    bytes: outcome.bytes_written,
                });
            }
        } else if !outcome.problem.is_empty() {
            // The worker logged it in full; this says what became of the split.
            let what =
                if outcome.recomputed > 0 { "read failed and was recomputed" } else { "was not cached" };
            tracing::info!(pipeline, split, fingerprint = %key.1, "split {split} {what}: {}", outcome.problem);
        }
    }
}
