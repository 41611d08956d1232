//! The dispatcher's journal: append-only, each append one immutable object written with a single
//! atomic put (`journal/<sequence>.json`), compacted into `snapshot.json`. Works on any
//! `object_store` URL or a local path, so a new leader on another node resumes from it.

use crate::state::Event;
use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;

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
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    /// Records before this sequence number are in the snapshot.
    next: u64,
    events: Vec<Event>,
}

/// An open journal.
pub struct Journal {
    store: Arc<dyn ObjectStore>,
    root: StorePath,
    next: u64,
    since_snapshot: u64,
}

/// Appends between compactions.
const COMPACT_EVERY: u64 = 1000;

impl Journal {
    /// Opens the journal at `url` (a local path, or `file://`, `s3://`, `gs://`, `az://` …;
    /// credentials come from the environment) and returns the events recorded so far, in order.
    pub async fn open(url: &str) -> Result<(Journal, Vec<Event>), JournalError> {
        let bad = |message: String| JournalError::Url { url: url.to_string(), message };
        let parsed = if url.contains("://") {
            url::Url::parse(url).map_err(|e| bad(e.to_string()))?
        } else {
            let path = std::path::absolute(url).map_err(|e| bad(e.to_string()))?;
            std::fs::create_dir_all(&path).map_err(|e| bad(format!("cannot create the folder: {e}")))?;
            url::Url::from_directory_path(&path).map_err(|()| bad("not a usable folder".into()))?
        };
        if parsed.scheme() == "file"
            && let Ok(path) = parsed.to_file_path()
        {
            std::fs::create_dir_all(&path).map_err(|e| bad(format!("cannot create the folder: {e}")))?;
        }
        let (store, root) =
            object_store::parse_url_opts(&parsed, std::env::vars()).map_err(|e| bad(e.to_string()))?;
        let mut journal = Journal { store: Arc::from(store), root, next: 0, since_snapshot: 0 };
        let events = journal.read_all().await?;
        Ok((journal, events))
    }

    /// `name` under the root; `/` separates path parts.
    fn location(&self, name: &str) -> StorePath {
        name.split('/').fold(self.root.clone(), |path, part| path.join(part))
    }

    async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        location: &StorePath,
    ) -> Result<Option<T>, JournalError> {
        let store_err =
            |source| JournalError::Store { what: "reading", location: location.to_string(), source };
        let bytes = match self.store.get(location).await {
            Ok(result) => result.bytes().await.map_err(store_err)?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(store_err(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| JournalError::Corrupt { location: location.to_string(), message: e.to_string() })
    }

    async fn read_all(&mut self) -> Result<Vec<Event>, JournalError> {
        let snapshot: Option<Snapshot> = self.read_json(&self.location("snapshot.json")).await?;
        let (mut next, mut events) = snapshot.map_or((0, Vec::new()), |s| (s.next, s.events));
        let prefix = self.location("journal");
        let mut records: Vec<(u64, StorePath)> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|source| JournalError::Store { what: "listing", location: prefix.to_string(), source })?
            .into_iter()
            .filter_map(|loc| {
                let seq = loc.filename()?.strip_suffix(".json")?.parse::<u64>().ok()?;
                Some((seq, loc))
            })
            .collect();
        records.sort();
        for (seq, location) in records {
            if seq < next {
                continue;
            }
            if let Some(mut batch) = self.read_json::<Vec<Event>>(&location).await? {
                events.append(&mut batch);
            }
            next = seq + 1;
            self.since_snapshot += 1;
        }
        self.next = next;
        Ok(events)
    }

    /// Writes `value` as JSON to `location` in one atomic put.
    async fn put_json<T: serde::Serialize>(
        &self,
        location: &StorePath,
        value: &T,
    ) -> Result<(), JournalError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| JournalError::Corrupt { location: location.to_string(), message: e.to_string() })?;
        self.store.put(location, PutPayload::from(body)).await.map_err(|source| JournalError::Store {
            what: "writing",
            location: location.to_string(),
            source,
        })?;
        Ok(())
    }

    /// Appends `events` as one record. Nothing is written for no events.
    pub async fn append(&mut self, events: &[Event]) -> Result<(), JournalError> {
        if events.is_empty() {
            return Ok(());
        }
        let location = self.location(&format!("journal/{:020}.json", self.next));
        self.put_json(&location, &events).await?;
        self.next += 1;
        self.since_snapshot += 1;
        Ok(())
    }

    /// True when enough records accumulated to compact.
    pub fn wants_compaction(&self) -> bool {
        self.since_snapshot >= COMPACT_EVERY
    }

    /// Writes `state` (every event needed to rebuild it) as the snapshot and deletes the records
    /// it covers. The snapshot is written first, so a crash in between loses nothing.
    pub async fn compact(&mut self, state: Vec<Event>) -> Result<(), JournalError> {
        let location = self.location("snapshot.json");
        self.put_json(&location, &Snapshot { next: self.next, events: state }).await?;
        for seq in self.next.saturating_sub(self.since_snapshot)..self.next {
            let old = self.location(&format!("journal/{seq:020}.json"));
            if let Err(e) = self.store.delete(&old).await
                && !matches!(e, object_store::Error::NotFound { .. })
            {
                tracing::warn!("journal compaction left `{old}`: {e}");
            }
        }
        self.since_snapshot = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mode;

    fn job(n: u32) -> Event {
        Event::Job { pipeline: "p".into(), job: format!("j{n}"), mode: Mode::Distributed, consumers: n }
    }

    #[tokio::test]
    async fn appends_survive_reopening_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("j").display().to_string();
        let (mut j, events) = Journal::open(&url).await.unwrap();
        assert!(events.is_empty());
        j.append(&[job(1), job(2)]).await.unwrap();
        j.append(&[job(3)]).await.unwrap();
        let (mut j, events) = Journal::open(&url).await.unwrap();
        assert_eq!(events, vec![job(1), job(2), job(3)]);
        j.compact(vec![job(9)]).await.unwrap();
        j.append(&[job(4)]).await.unwrap();
        let (_, events) = Journal::open(&format!("file://{url}")).await.unwrap();
        assert_eq!(events, vec![job(9), job(4)]);
    }

    #[tokio::test]
    async fn a_corrupt_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join("journal")).unwrap();
        std::fs::write(dir.path().join("journal/00000000000000000000.json"), b"{not json").unwrap();
        let e = Journal::open(&url).await.err().unwrap();
        assert!(e.to_string().contains("is corrupt"), "{e}");
    }
}
