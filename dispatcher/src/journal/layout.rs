//! Where the journal keeps what, and what each object holds.
//!
//! - `journal/<sequence:020>.json`: one record, written create-only at the next free sequence:
//!   `{"term", "events"}` (a writer's first record claims its term: no events, and a `writer`
//!   nonce so that two writers never write the same bytes). Records of the first layout are a
//!   bare array of events, with no term.
//! - `snapshot/<next:020>.json`: every event needed to rebuild the state as of the records
//!   before sequence `next`, written create-only; readers take the highest. The first layout
//!   kept one `snapshot.json`, still read.

use crate::state::Event;
use object_store::path::Path as StorePath;

/// The folder of records.
pub(super) const RECORDS: &str = "journal";
/// The folder of snapshots.
pub(super) const SNAPSHOTS: &str = "snapshot";
/// The snapshot of the first layout, overwritten in place.
pub(super) const LEGACY_SNAPSHOT: &str = "snapshot.json";

/// The record at `sequence`.
pub(super) fn record_name(sequence: u64) -> String {
    format!("{RECORDS}/{sequence:020}.json")
}

/// The snapshot covering the records before `next`.
pub(super) fn snapshot_name(next: u64) -> String {
    format!("{SNAPSHOTS}/{next:020}.json")
}

/// The sequence number in a record's or a snapshot's name; `None` for other objects.
pub(super) fn sequence_of(location: &StorePath) -> Option<u64> {
    location.filename()?.strip_suffix(".json")?.parse().ok()
}

/// A record as written.
#[derive(serde::Serialize)]
pub(super) struct RecordOut<'a> {
    /// The writer's term.
    pub term: u64,
    /// Set on the record claiming a term: who claimed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<&'a str>,
    /// The events, in the order they changed the state.
    pub events: &'a [Event],
}

/// A record as read, in either layout.
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub(super) enum RecordIn {
    /// The first layout: events alone.
    Legacy(Vec<Event>),
    /// With its writer's term.
    Termed {
        /// The writer's term.
        term: u64,
        /// The events.
        #[serde(default)]
        events: Vec<Event>,
    },
}

impl RecordIn {
    /// The term (0 in the first layout) and the events.
    pub(super) fn into_parts(self) -> (u64, Vec<Event>) {
        match self {
            RecordIn::Legacy(events) => (0, events),
            RecordIn::Termed { term, events } => (term, events),
        }
    }
}

/// A snapshot.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Snapshot {
    /// Records before this sequence number are in the snapshot.
    pub next: u64,
    /// The term of its writer (0 in the first layout).
    #[serde(default)]
    pub term: u64,
    /// The events that rebuild the state.
    pub events: Vec<Event>,
}
