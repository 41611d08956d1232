//! The journal on a local folder: reopening, compaction, the first layout, and fencing.

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
    // The compaction left one snapshot and the records after it.
    let names = |folder: &str| {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("j").join(folder))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names("snapshot").len(), 1, "{:?}", names("snapshot"));
    assert!(
        names("journal").iter().all(|n| n.as_str() >= names("snapshot")[0].as_str()),
        "{:?}",
        names("journal")
    );
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

#[tokio::test]
async fn a_second_writer_fences_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().display().to_string();
    let (mut first, _) = Journal::open(&url).await.unwrap();
    first.append(&[job(1)]).await.unwrap();
    let (mut second, events) = Journal::open(&url).await.unwrap();
    assert_eq!(events, vec![job(1)]);
    assert!(second.term() > first.term());
    let e = first.append(&[job(2)]).await.unwrap_err();
    assert!(matches!(e, JournalError::Fenced { .. }), "{e}");
    assert!(first.is_fenced());
    // Fenced for good: neither appending nor compacting writes anything.
    assert!(matches!(first.append(&[job(3)]).await, Err(JournalError::Fenced { .. })));
    assert!(matches!(first.compact(vec![job(1)]).await, Err(JournalError::Fenced { .. })));
    second.append(&[job(4)]).await.unwrap();
    let (_, events) = Journal::open(&url).await.unwrap();
    assert_eq!(events, vec![job(1), job(4)]);
}

#[tokio::test]
async fn the_first_layout_is_read_and_upgraded_by_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().display().to_string();
    let snapshot = serde_json::json!({"next": 2, "events": [job(1)]});
    std::fs::write(dir.path().join("snapshot.json"), snapshot.to_string()).unwrap();
    std::fs::create_dir_all(dir.path().join("journal")).unwrap();
    // Record 1 is covered by the snapshot (a compaction cut short): skipped.
    for (sequence, event) in [(1, job(7)), (2, job(2)), (3, job(3))] {
        let body = serde_json::to_vec(&[event]).unwrap();
        std::fs::write(dir.path().join(format!("journal/{sequence:020}.json")), body).unwrap();
    }
    let (mut j, events) = Journal::open(&url).await.unwrap();
    assert_eq!(events, vec![job(1), job(2), job(3)]);
    assert_eq!(j.term(), 1);
    j.compact(events.clone()).await.unwrap();
    assert!(!dir.path().join("snapshot.json").exists());
    let (j, again) = Journal::open(&url).await.unwrap();
    assert_eq!(again, events);
    assert_eq!(j.term(), 2);
}

#[tokio::test]
async fn a_retried_append_whose_first_attempt_landed_is_not_a_fence() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().display().to_string();
    let (mut j, _) = Journal::open(&url).await.unwrap();
    // The same record written again at the same place, as after a lost reply: the journal
    // recognises its own bytes.
    let at = j.next_sequence();
    j.append(&[job(1)]).await.unwrap();
    j.next -= 1;
    j.since_snapshot -= 1;
    j.append(&[job(1)]).await.unwrap();
    assert_eq!(j.next_sequence(), at + 1);
    // Different events there are another writer's.
    j.next -= 1;
    assert!(matches!(j.append(&[job(2)]).await, Err(JournalError::Fenced { .. })));
}

/// Changes nobody waits on (split completions) linger for others to join their record: many at
/// once take a few records, not one each, and each is durable when its call returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_changes_share_records_and_are_durable_when_answered() {
    const CHANGES: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().display().to_string();
    let (journal, events) = Journal::open(&url).await.unwrap();
    let d = crate::Dispatcher::on_journal(
        Default::default(),
        std::sync::Arc::new(super::bench::NoSources),
        journal,
        events,
    );
    let calls: Vec<_> = (0..CHANGES)
        .map(|n| {
            let d = d.clone();
            tokio::spawn(async move {
                d.mutate_batched(|s, _| {
                    s.cache_evicted("s3://cache/", &format!("f{n}"));
                    Ok(())
                })
                .await
                .unwrap();
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    let (records, failed) = d.journal_writes().unwrap();
    assert_eq!(failed, 0);
    assert!(records <= CHANGES as u64 / 2, "{CHANGES} changes took {records} records");
    let (_, events) = Journal::open(&url).await.unwrap();
    assert_eq!(events.len(), CHANGES, "every answered change is in the journal");
}
