//! A crash at each step of the journal loses nothing: a store that fails every operation after
//! the N-th (before or after carrying it out, as when a reply is lost) runs a script of
//! appends, two compactions and a second writer taking over, for every N; after each crash the
//! journal is reopened on the real store underneath, and every acknowledged event is there
//! exactly once (the one in flight at most once), and the state rebuilds identically.

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use granary_dispatcher::Timing;
use granary_dispatcher::journal::{Journal, JournalError};
use granary_dispatcher::state::{Event, State};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Carries out `budget` operations, then fails every one; with `after`, the failing operation
/// itself is carried out first (its reply is what is lost).
#[derive(Debug)]
struct Crashing {
    inner: Arc<dyn ObjectStore>,
    budget: Arc<AtomicI64>,
    after: bool,
}

impl std::fmt::Display for Crashing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crashing({})", self.inner)
    }
}

fn crash() -> object_store::Error {
    object_store::Error::Generic { store: "crashing", source: "simulated crash".into() }
}

/// Whether the next operation runs, and whether it then fails.
fn step(budget: &AtomicI64, after: bool) -> (bool, bool) {
    let left = budget.fetch_sub(1, Ordering::SeqCst);
    match (left > 0, left == 0 && after) {
        (true, _) => (true, false),
        (false, true) => (true, true),
        (false, false) => (false, true),
    }
}

impl Crashing {
    fn step(&self) -> (bool, bool) {
        step(&self.budget, self.after)
    }

    async fn run<T>(&self, op: impl Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
        match self.step() {
            (true, false) => op.await,
            (true, true) => {
                let _ = op.await;
                Err(crash())
            }
            (false, _) => Err(crash()),
        }
    }
}

#[async_trait]
impl ObjectStore for Crashing {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.run(self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.run(self.inner.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &StorePath, options: GetOptions) -> object_store::Result<GetResult> {
        self.run(self.inner.get_opts(location, options)).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        // Each deletion is a step of its own.
        let (budget, after, inner) = (Arc::clone(&self.budget), self.after, Arc::clone(&self.inner));
        locations
            .then(move |location| {
                let (budget, inner) = (Arc::clone(&budget), Arc::clone(&inner));
                async move {
                    let location = location?;
                    match step(&budget, after) {
                        (true, fails) => {
                            let deleted = inner.delete(&location).await;
                            if fails { Err(crash()) } else { deleted.map(|()| location) }
                        }
                        (false, _) => Err(crash()),
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&StorePath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.step() {
            (true, false) => self.inner.list(prefix),
            _ => futures::stream::once(async { Err(crash()) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&StorePath>) -> object_store::Result<ListResult> {
        self.run(self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(
        &self,
        from: &StorePath,
        to: &StorePath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.run(self.inner.copy_opts(from, to, options)).await
    }
}

const STORE: &str = "s3://cache/";

/// The `n`-th event of the script: one cache split written, distinct from every other.
fn event(n: u64) -> Event {
    Event::CacheSplitWritten { store: STORE.into(), fingerprint: "f".into(), split: n, bytes: n + 1 }
}

/// What the script got acknowledged, and the event in flight when it crashed.
#[derive(Default)]
struct Acknowledged {
    events: Vec<Event>,
    in_flight: Option<Event>,
}

/// Appends `events` one record each, acknowledging each once its append returned.
async fn append(
    journal: &mut Journal,
    state: &mut State,
    acked: &mut Acknowledged,
    events: std::ops::Range<u64>,
) -> Result<(), JournalError> {
    for n in events {
        acked.in_flight = Some(event(n));
        journal.append(&[event(n)]).await?;
        state.apply(&event(n));
        acked.events.push(event(n));
        acked.in_flight = None;
    }
    Ok(())
}

/// Opens, appends, compacts, appends, compacts again; then a second writer opens, appends,
/// and compacts.
async fn script(store: Arc<dyn ObjectStore>, acked: &mut Acknowledged) -> Result<(), JournalError> {
    let (mut journal, events) = Journal::open_store(Arc::clone(&store), StorePath::from("j")).await?;
    assert!(events.is_empty());
    let mut state = State::new(Timing::default(), 1);
    append(&mut journal, &mut state, acked, 0..3).await?;
    journal.compact(state.snapshot_events()).await?;
    append(&mut journal, &mut state, acked, 3..5).await?;
    journal.compact(state.snapshot_events()).await?;
    append(&mut journal, &mut state, acked, 5..6).await?;
    let (mut second, events) = Journal::open_store(store, StorePath::from("j")).await?;
    assert_eq!(sorted(events), sorted(acked.events.clone()));
    match journal.append(&[event(99)]).await {
        Err(JournalError::Fenced { .. }) => {}
        Err(e) => return Err(e),
        Ok(()) => panic!("a fenced writer appended"),
    }
    append(&mut second, &mut state, acked, 6..8).await?;
    second.compact(state.snapshot_events()).await?;
    append(&mut second, &mut state, acked, 8..9).await
}

fn sorted(events: Vec<Event>) -> Vec<String> {
    let mut out: Vec<String> = events.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    out.sort();
    out
}

/// The state `events` rebuild, as the events a snapshot of it holds.
fn rebuilt(events: &[Event]) -> Vec<String> {
    let mut state = State::new(Timing::default(), 1);
    for e in events {
        state.apply(e);
    }
    sorted(state.snapshot_events())
}

#[tokio::test]
async fn a_crash_at_any_step_loses_nothing_acknowledged() {
    let mut crashes = 0;
    for after in [false, true] {
        let mut completed = false;
        // Bounded: the script takes far fewer operations than this.
        for budget in 0..400 {
            let dir = tempfile::tempdir().unwrap();
            let real: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
            let crashing =
                Crashing { inner: Arc::clone(&real), budget: Arc::new(AtomicI64::new(budget)), after };
            let mut acked = Acknowledged::default();
            let outcome = script(Arc::new(crashing), &mut acked).await;
            let context = format!("crash after {budget} operations (the last one carried out: {after})");
            let (mut journal, events) = Journal::open_store(Arc::clone(&real), StorePath::from("j"))
                .await
                .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
            // Each acknowledged event exactly once; the one in flight at most once.
            let mut expected = acked.events.clone();
            let found = sorted(events.clone());
            if let Some(e) = &acked.in_flight
                && found.contains(&serde_json::to_string(e).unwrap())
            {
                expected.push(e.clone());
            }
            assert_eq!(found, sorted(expected.clone()), "{context}");
            assert_eq!(rebuilt(&events), rebuilt(&expected), "{context}");
            // The reopened journal carries on.
            journal.append(&[event(1000)]).await.unwrap();
            let (_, again) = Journal::open_store(real, StorePath::from("j")).await.unwrap();
            expected.push(event(1000));
            assert_eq!(sorted(again), sorted(expected), "{context}: after reopening");
            match outcome {
                Ok(()) => {
                    completed = true;
                    break;
                }
                Err(_) => crashes += 1,
            }
        }
        assert!(completed, "the script never ran to its end");
    }
    assert!(crashes > 40, "only {crashes} crash points were exercised");
}
