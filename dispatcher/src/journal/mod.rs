//! The dispatcher's journal on any `object_store` URL or a local path, so that a new leader on
//! another node resumes from it. Every object is written create-only (`PutMode::Create`: a local
//! file's atomic no-clobber, S3's `If-None-Match: *`), which fences writers:
//!
//! - opening the journal replays it, then claims a new **term** with a record at the next free
//!   sequence number (re-reading and moving on when another writer got there first);
//! - each append writes the next sequence number; if that object exists, another writer opened
//!   the journal since, and this one is [`JournalError::Fenced`] for good;
//! - compaction writes `snapshot/<next>.json` create-only, and only once it is durable deletes
//!   the records and older snapshots it covers; replay takes the highest snapshot and the
//!   records from its `next` on, so a compaction cut short at any point replays the same.
//!
//! A write counts only once it is durable: an object store's PUT is; on a local file system the
//! file and its folder are flushed first ([`durable`]).
//!
//! The object layout is in [`layout`]; the first layout (`snapshot.json`, records without a
//! term) is still read, so existing journals carry on.

#[cfg(test)]
mod bench;
mod commit;
mod durable;
mod layout;
#[cfg(test)]
mod tests;

pub(crate) use commit::{Batch, Committer, RETRY_FOR, Urgency};

use crate::state::Event;
use bytes::Bytes;
use futures::TryStreamExt;
use layout::{RecordIn, RecordOut, Snapshot};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A failure reading or writing the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The URL is not usable.
    #[error("--journal `{url}`: {message}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The store failed.
    #[error("journal {what} `{location}`: {source}")]
    Store {
        /// What was being done.
        what: &'static str,
        /// Object path.
        location: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// An object is not a journal record.
    #[error("journal object `{location}` is corrupt: {message}")]
    Corrupt {
        /// Object path.
        location: String,
        /// The parse error.
        message: String,
    },
    /// Another writer opened the journal after this one: this one must stop writing (and its
    /// dispatcher stop serving); reopening replays what both wrote.
    #[error(
        "journal `{location}` was written by another dispatcher: this one (term {term}) is fenced off \
         and stops; restart it to replay the journal"
    )]
    Fenced {
        /// The object another writer created first.
        location: String,
        /// This writer's term.
        term: u64,
    },
    /// A record written to a local file system could not be flushed to the disk.
    #[error("journal: flushing `{location}` to the disk: {source}")]
    Flush {
        /// Object path.
        location: String,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
    /// Opening kept losing the race for the next sequence number.
    #[error("journal: could not claim a term after {attempts} attempts: other writers keep appending")]
    Contended {
        /// Attempts made.
        attempts: u32,
    },
}

/// An open journal: the one writer of its term.
pub struct Journal {
    store: Arc<dyn ObjectStore>,
    root: StorePath,
    /// The next sequence number this writer writes.
    next: u64,
    /// This writer's term.
    term: u64,
    since_snapshot: u64,
    fenced: bool,
    /// The journal's folder when the store is this machine's file system: each object written
    /// is flushed to the disk before it counts as durable.
    local: Option<durable::LocalFolder>,
}

/// Appends between compactions.
const COMPACT_EVERY: u64 = 1000;

/// Tries to claim a term before giving up.
const CLAIM_ATTEMPTS: u32 = 32;

/// Full replays tried when objects vanish under the reader (a concurrent compaction).
const REPLAY_ATTEMPTS: u32 = 8;

/// What replaying found.
struct Replayed {
    events: Vec<Event>,
    /// The first free sequence number.
    next: u64,
    /// The highest term seen.
    term: u64,
    /// Records read after the snapshot.
    records: u64,
}

/// Why a read came back empty-handed.
enum ReadError {
    /// An object listed a moment ago is gone: a compaction deleted it; read again.
    Vanished,
    /// Anything else.
    Failed(JournalError),
}

impl From<JournalError> for ReadError {
    fn from(e: JournalError) -> Self {
        ReadError::Failed(e)
    }
}

/// Why a create-only write did not land.
enum CreateError {
    /// Another writer's object is there.
    Taken,
    /// The store failed; the object may or may not be there.
    Failed(JournalError),
}

impl Journal {
    /// Opens the journal at `url` (a local path, or `file://`, `s3://`, `gs://`, `az://` …;
    /// credentials come from the environment), claims a new term and returns the events
    /// recorded so far, in order.
    pub async fn open(url: &str) -> Result<(Journal, Vec<Event>), JournalError> {
        let bad = |message: String| JournalError::Url { url: url.to_string(), message };
        let parsed = if url.contains("://") {
            url::Url::parse(url).map_err(|e| bad(e.to_string()))?
        } else {
            let path = std::path::absolute(url).map_err(|e| bad(e.to_string()))?;
            std::fs::create_dir_all(&path).map_err(|e| bad(format!("cannot create the folder: {e}")))?;
            url::Url::from_directory_path(&path).map_err(|()| bad("not a usable folder".into()))?
        };
        let mut local = None;
        if parsed.scheme() == "file"
            && let Ok(path) = parsed.to_file_path()
        {
            std::fs::create_dir_all(&path).map_err(|e| bad(format!("cannot create the folder: {e}")))?;
            local = Some(durable::LocalFolder { folder: path });
        }
        let (store, root) =
            object_store::parse_url_opts(&parsed, std::env::vars()).map_err(|e| bad(e.to_string()))?;
        Journal::open_with(Arc::from(store), root, local).await
    }

    /// Opens the journal under `root` in `store`, claims a new term and returns the events
    /// recorded so far, in order.
    pub async fn open_store(
        store: Arc<dyn ObjectStore>,
        root: StorePath,
    ) -> Result<(Journal, Vec<Event>), JournalError> {
        Journal::open_with(store, root, None).await
    }

    /// [`Journal::open_store`], flushing each object to the disk of `local` when it is there.
    async fn open_with(
        store: Arc<dyn ObjectStore>,
        root: StorePath,
        local: Option<durable::LocalFolder>,
    ) -> Result<(Journal, Vec<Event>), JournalError> {
        let mut journal = Journal { store, root, next: 0, term: 0, since_snapshot: 0, fenced: false, local };
        let writer = writer_nonce();
        let mut replayed = journal.replay().await?;
        for _ in 0..CLAIM_ATTEMPTS {
            let term = replayed.term + 1;
            let location = journal.location(&layout::record_name(replayed.next));
            let body = json(&location, &RecordOut { term, writer: Some(&writer), events: &[] })?;
            match journal.create(&location, body.clone(), |found| *found == body).await {
                Ok(()) => {
                    journal.term = term;
                    journal.next = replayed.next + 1;
                    journal.since_snapshot = replayed.records + 1;
                    tracing::info!(
                        term,
                        sequence = replayed.next,
                        "journal opened: this dispatcher writes it now"
                    );
                    return Ok((journal, replayed.events));
                }
                Err(CreateError::Failed(e)) => return Err(e),
                Err(CreateError::Taken) => match journal.read_records(&mut replayed).await {
                    Ok(()) => {}
                    Err(ReadError::Vanished) => replayed = journal.replay().await?,
                    Err(ReadError::Failed(e)) => return Err(e),
                },
            }
        }
        Err(JournalError::Contended { attempts: CLAIM_ATTEMPTS })
    }

    /// This writer's term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The sequence number of the next record.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// True once another writer took the journal over.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// `name` under the root; `/` separates path parts.
    fn location(&self, name: &str) -> StorePath {
        name.split('/').fold(self.root.clone(), |path, part| path.join(part))
    }

    /// The object at `location`; `None` when there is none.
    async fn read(&self, location: &StorePath) -> Result<Option<Bytes>, JournalError> {
        let store_err =
            |source| JournalError::Store { what: "reading", location: location.to_string(), source };
        match self.store.get(location).await {
            Ok(result) => result.bytes().await.map(Some).map_err(store_err),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(e)),
        }
    }

    /// Sequence-named objects under `folder`, in order.
    async fn list(&self, folder: &str) -> Result<Vec<(u64, StorePath)>, JournalError> {
        let prefix = self.location(folder);
        let mut found: Vec<(u64, StorePath)> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|source| JournalError::Store { what: "listing", location: prefix.to_string(), source })?
            .into_iter()
            .filter_map(|location| Some((layout::sequence_of(&location)?, location)))
            .collect();
        found.sort();
        Ok(found)
    }

    /// Replays from the highest snapshot, again from the start when a concurrent compaction
    /// deletes what was listed.
    async fn replay(&self) -> Result<Replayed, JournalError> {
        for _ in 0..REPLAY_ATTEMPTS {
            match self.try_replay().await {
                Ok(replayed) => return Ok(replayed),
                Err(ReadError::Failed(e)) => return Err(e),
                Err(ReadError::Vanished) => {
                    tracing::info!("journal compacted while being read: reading again")
                }
            }
        }
        Err(JournalError::Contended { attempts: REPLAY_ATTEMPTS })
    }

    async fn try_replay(&self) -> Result<Replayed, ReadError> {
        let mut snapshot: Option<Snapshot> = None;
        if let Some((_, location)) = self.list(layout::SNAPSHOTS).await?.pop() {
            let bytes = self.read(&location).await?.ok_or(ReadError::Vanished)?;
            snapshot = Some(parse(&location, &bytes)?);
        }
        let legacy = self.location(layout::LEGACY_SNAPSHOT);
        if let Some(bytes) = self.read(&legacy).await? {
            let old: Snapshot = parse(&legacy, &bytes)?;
            if snapshot.as_ref().is_none_or(|s| s.next < old.next) {
                snapshot = Some(old);
            }
        }
        let mut replayed = match snapshot {
            Some(s) => Replayed { events: s.events, next: s.next, term: s.term, records: 0 },
            None => Replayed { events: Vec::new(), next: 0, term: 0, records: 0 },
        };
        self.read_records(&mut replayed).await?;
        Ok(replayed)
    }

    /// Reads the records from `replayed.next` on into `replayed`.
    async fn read_records(&self, replayed: &mut Replayed) -> Result<(), ReadError> {
        for (sequence, location) in self.list(layout::RECORDS).await? {
            if sequence < replayed.next {
                continue;
            }
            let bytes = self.read(&location).await?.ok_or(ReadError::Vanished)?;
            let (term, mut events) = parse::<RecordIn>(&location, &bytes)?.into_parts();
            replayed.events.append(&mut events);
            replayed.term = replayed.term.max(term);
            replayed.next = sequence + 1;
            replayed.records += 1;
        }
        Ok(())
    }

    /// Writes `body` at `location` unless an object is there, and returns once it is durable. An
    /// object that `ours` recognises (this writer's own, from an attempt whose reply was lost)
    /// counts as written.
    async fn create(
        &self,
        location: &StorePath,
        body: Bytes,
        ours: impl FnOnce(&Bytes) -> bool,
    ) -> Result<(), CreateError> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(location, PutPayload::from(body), options).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => match self.read(location).await {
                Ok(Some(found)) if ours(&found) => {}
                Ok(_) => return Err(CreateError::Taken),
                Err(e) => return Err(CreateError::Failed(e)),
            },
            Err(source) => {
                return Err(CreateError::Failed(JournalError::Store {
                    what: "writing",
                    location: location.to_string(),
                    source,
                }));
            }
        }
        match &self.local {
            Some(local) => local.sync(&self.root, location).await.map_err(|source| {
                CreateError::Failed(JournalError::Flush { location: location.to_string(), source })
            }),
            None => Ok(()),
        }
    }

    fn fence(&mut self, location: &StorePath) -> JournalError {
        self.fenced = true;
        JournalError::Fenced { location: location.to_string(), term: self.term }
    }

    /// Appends `events` as one record at the next sequence number; nothing is written for no
    /// events. A store error leaves the journal as it was: the same append may be tried again.
    /// [`JournalError::Fenced`] when another writer took the journal over.
    pub async fn append(&mut self, events: &[Event]) -> Result<(), JournalError> {
        if events.is_empty() {
            return Ok(());
        }
        let location = self.location(&layout::record_name(self.next));
        if self.fenced {
            return Err(self.fence(&location));
        }
        let body = json(&location, &RecordOut { term: self.term, writer: None, events })?;
        match self.create(&location, body.clone(), |found| *found == body).await {
            Ok(()) => {
                self.next += 1;
                self.since_snapshot += 1;
                Ok(())
            }
            Err(CreateError::Taken) => Err(self.fence(&location)),
            Err(CreateError::Failed(e)) => Err(e),
        }
    }

    /// True when enough records accumulated to compact.
    pub fn wants_compaction(&self) -> bool {
        self.since_snapshot >= COMPACT_EVERY
    }

    /// Writes `state` (every event needed to rebuild the state as of the records appended so
    /// far, and nothing else) as a snapshot, then deletes the records and snapshots it covers.
    /// A crash at any point loses nothing: until the snapshot is durable the records are all
    /// there, and after it replay skips what it covers.
    pub async fn compact(&mut self, state: Vec<Event>) -> Result<(), JournalError> {
        let at = self.next;
        let location = self.location(&layout::snapshot_name(at));
        if self.fenced {
            return Err(self.fence(&location));
        }
        let term = self.term;
        let body = json(&location, &Snapshot { next: at, term, events: state })?;
        let ours = |found: &Bytes| serde_json::from_slice::<Snapshot>(found).is_ok_and(|s| s.term == term);
        match self.create(&location, body, ours).await {
            Ok(()) => {}
            Err(CreateError::Taken) => return Err(self.fence(&location)),
            Err(CreateError::Failed(e)) => return Err(e),
        }
        self.since_snapshot = 0;
        let mut covered: Vec<StorePath> = Vec::new();
        for folder in [layout::RECORDS, layout::SNAPSHOTS] {
            match self.list(folder).await {
                Ok(found) => covered.extend(found.into_iter().filter(|(s, _)| *s < at).map(|(_, l)| l)),
                Err(e) => tracing::warn!("journal compaction: {e}"),
            }
        }
        covered.push(self.location(layout::LEGACY_SNAPSHOT));
        for old in covered {
            if let Err(e) = self.store.delete(&old).await
                && !matches!(e, object_store::Error::NotFound { .. })
            {
                tracing::warn!("journal compaction left `{old}`: {e}");
            }
        }
        Ok(())
    }
}

/// `value` as JSON.
fn json<T: serde::Serialize>(location: &StorePath, value: &T) -> Result<Bytes, JournalError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| JournalError::Corrupt { location: location.to_string(), message: e.to_string() })
}

/// The object at `location` as a `T`.
fn parse<T: serde::de::DeserializeOwned>(location: &StorePath, bytes: &[u8]) -> Result<T, JournalError> {
    serde_json::from_slice(bytes)
        .map_err(|e| JournalError::Corrupt { location: location.to_string(), message: e.to_string() })
}

/// A name for this writer no other writer shares: process, clock and a count within the
/// process.
fn writer_nonce() -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}-{}", std::process::id(), OPENED.fetch_add(1, Ordering::Relaxed))
}
