//! Write-through: while a task computes its split, the element records at the cut go to a
//! writer thread that compresses them into chunks and uploads them under the writer's own
//! prefix; at the split's end the manifest is published, last. A failed upload abandons the
//! split's entry (its chunks are deleted, nothing becomes visible) and never stops the
//! computation.

use super::{Cut, EngineCache, EntrySplit};
use crossbeam_channel::{Receiver, Sender, bounded};
use granary_store::cache::{EntryInfo, FORMAT_VERSION, Fingerprint, SplitWriter};
use std::collections::HashSet;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::runtime::Handle;

/// What writing a split's entry did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteReport {
    /// The manifest was published.
    pub written: bool,
    /// Bytes stored for the split.
    pub bytes: u64,
    /// Why it was not, if it was not.
    pub problem: Option<String>,
}

enum Msg {
    Begin { fingerprint: Fingerprint, cut: usize, stage: String, input: usize, split: u64 },
    Record(Vec<u8>),
    End(Sender<WriteReport>),
}

/// The writer thread of one execution.
pub struct WriteThread {
    tx: Option<Sender<Msg>>,
    handle: Option<JoinHandle<()>>,
}

impl WriteThread {
    /// Starts the thread; store I/O goes through `rt`.
    pub fn start(cache: Arc<EngineCache>, rt: Handle) -> std::io::Result<WriteThread> {
        let (tx, rx) = bounded::<Msg>(256);
        let handle =
            std::thread::Builder::new().name("granary-cache-writer".to_string()).spawn(move || {
                Writer { cache, rt, current: None, failed: None, described: HashSet::new() }.run(&rx)
            })?;
        Ok(WriteThread { tx: Some(tx), handle: Some(handle) })
    }

    /// Starts writing entry split `entry` of `cut` (abandoning an unfinished one).
    pub fn begin(&self, cut: &Cut, entry: EntrySplit<'_>) {
        self.send(Msg::Begin {
            fingerprint: entry.fingerprint.clone(),
            cut: cut.index,
            stage: cut.stage.clone(),
            input: entry.input,
            split: entry.split,
        });
    }

    /// The next element's record, in order.
    pub fn record(&self, record: Vec<u8>) {
        self.send(Msg::Record(record));
    }

    /// Finishes the split: uploads the last chunk and publishes the manifest; waits for it.
    pub fn end(&self) -> WriteReport {
        let (reply, answer) = bounded(1);
        self.send(Msg::End(reply));
        answer.recv().unwrap_or_else(|_| WriteReport {
            problem: Some("the cache writer thread stopped".to_string()),
            ..WriteReport::default()
        })
    }

    fn send(&self, msg: Msg) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(msg);
        }
    }
}

impl Drop for WriteThread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Writer {
    cache: Arc<EngineCache>,
    rt: Handle,
    current: Option<SplitWriter>,
    failed: Option<String>,
    /// Entries whose `entry.json` this thread made sure of.
    described: HashSet<String>,
}

impl Writer {
    fn run(mut self, rx: &Receiver<Msg>) {
        for msg in rx.iter() {
            match msg {
                Msg::Begin { fingerprint, cut, stage, input, split } => {
                    self.abandon();
                    self.failed = None;
                    if let Err(e) = self.describe(&fingerprint, cut, &stage, input) {
                        self.failed = Some(e);
                    }
                    let writer = self.cache.store.split_writer(&fingerprint, split, &self.cache.writer_id);
                    let records = granary_store::cache::CHUNK_MAX_RECORDS;
                    self.current = Some(writer.with_chunk_limits(self.cache.chunk_bytes, records));
                }
                Msg::Record(record) => {
                    if self.failed.is_some() {
                        continue;
                    }
                    if let Some(w) = self.current.as_mut()
                        && let Err(e) = self.rt.block_on(w.push(&record))
                    {
                        self.failed = Some(e.to_string());
                        self.abandon();
                    }
                }
                Msg::End(reply) => {
                    let report = self.finish();
                    if let Some(p) = &report.problem {
                        tracing::warn!("cache write abandoned: {p}; the split was computed and delivered");
                    }
                    let _ = reply.send(report);
                }
            }
        }
        self.abandon();
    }

    fn finish(&mut self) -> WriteReport {
        match (self.current.take(), self.failed.take()) {
            (Some(w), None) => match self.rt.block_on(w.finish()) {
                Ok(manifest) => WriteReport { written: true, bytes: manifest.stored_bytes(), problem: None },
                Err(e) => WriteReport { problem: Some(e.to_string()), ..WriteReport::default() },
            },
            (w, Some(problem)) => {
                if let Some(w) = w {
                    self.rt.block_on(w.abort());
                }
                WriteReport { problem: Some(problem), ..WriteReport::default() }
            }
            (None, None) => {
                WriteReport { problem: Some("no split was being written".into()), ..WriteReport::default() }
            }
        }
    }

    fn abandon(&mut self) {
        if let Some(w) = self.current.take() {
            self.rt.block_on(w.abort());
        }
    }

    /// Creates the entry's `entry.json` unless it exists; the entry is source `input`'s.
    fn describe(
        &mut self,
        fingerprint: &Fingerprint,
        cut: usize,
        stage: &str,
        input: usize,
    ) -> Result<(), String> {
        if self.described.contains(fingerprint.as_str()) {
            return Ok(());
        }
        let Some(source) = self.cache.inputs.get(input) else {
            return Err(format!("the pipeline has no source {input}"));
        };
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let info = EntryInfo {
            format_version: FORMAT_VERSION,
            fingerprint: fingerprint.to_string(),
            pipeline: self.cache.pipeline.clone(),
            source_url: source.url.clone(),
            boundary: cut,
            stage: stage.to_string(),
            stages: self.cache.stage_names.iter().take(cut).cloned().collect(),
            splits_total: source.splits.end - source.splits.start,
            created_unix_s: now,
            last_used_unix_s: now,
        };
        self.rt.block_on(self.cache.store.put_entry_info(&info)).map_err(|e| e.to_string())?;
        self.described.insert(fingerprint.to_string());
        Ok(())
    }
}
