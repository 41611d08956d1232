//! Entries per source: a pipeline mixing `spec.sources` writes and reads each source's own entry
//! by that source's split numbering, further passes of an upsampled source read their base
//! split's entry split, and a single-source pipeline over one of the sources reads what the
//! mixed one wrote.

use super::tests::{STORE, as_asked, drain, facts, fp, join, mode, profile, worker};
use crate::plan::MixPlan;
use crate::state::*;
use granary_policies::caching::Action;
use granary_proto::v1 as pb;

/// Splits of the two sources: `web` lists 3, `code` 2, of 10 elements each.
const WEB: u64 = 3;
const CODE: u64 = 2;

/// The entry of source `input` at cut `index`.
fn entry(input: u8, index: u32) -> String {
    fp(index as u8 + 16 * (input + 1))
}

/// A pipeline mixing `web` and `code` half and half into epochs of 100 elements (so `code`,
/// with 20, is drawn in several passes).
fn mixed_facts(epochs: u32) -> PipelineFacts {
    let mut f = facts("at", (WEB + CODE) as usize, epochs);
    f.mixing = Some(MixFacts {
        names: vec!["web".into(), "code".into()],
        splits: vec![WEB, CODE],
        weights: MixPlan::weights(&[0.5, 0.5]),
        block: 4,
        elements: Some(100),
    });
    f
}

/// The profile of the mixed pipeline: at each cut, one entry per source.
fn mixed_profile() -> pb::CacheProfile {
    let mut p = profile();
    for b in &mut p.boundaries {
        b.source_fingerprints = vec![entry(0, b.index), entry(1, b.index)];
        b.fingerprint = entry(0, b.index);
    }
    p
}

/// The profile of a pipeline reading `code` alone.
fn code_profile() -> pb::CacheProfile {
    let mut p = profile();
    for b in &mut p.boundaries {
        b.fingerprint = entry(1, b.index);
        b.source_fingerprints = vec![entry(1, b.index)];
    }
    p
}

#[test]
fn facts_map_split_ids_and_passes_to_each_sources_own_splits() {
    let f = mixed_facts(1);
    let got: Vec<Option<(usize, u64)>> =
        [0, 2, 3, 4, 5, 8, 9, 14].iter().map(|&s| f.entry_split(s)).collect();
    assert_eq!(got, [(0, 0), (0, 2), (1, 0), (1, 1), (0, 0), (1, 0), (1, 1), (1, 1)].map(Some));
    assert_eq!(f.inputs(), 2);
    let single = facts("at", 4, 1);
    assert_eq!((single.entry_split(3), single.inputs()), (Some((0, 3)), 1));
}

#[test]
fn a_mixed_pipeline_writes_each_source_split_once_and_a_single_source_one_reads_them() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("mix", mixed_facts(2)).unwrap();
    join(&mut s, "mix");
    let w = worker(&mut s, "mix");
    let generation = s.pipeline_info("mix").unwrap().generation;
    let d = s.cache_profile("mix", generation, mixed_profile(), BTreeMap::new(), 0).unwrap().unwrap();
    assert_eq!(d.action, Action::Write { boundary: 2 });

    let leases = drain(&mut s, &w, 0, as_asked);
    let listed = WEB + CODE;
    assert!(leases.iter().any(|l| l.split >= listed), "`code` is upsampled by further passes");
    for l in &leases {
        // Every lease names the entry of its split's source, passes included.
        let input = usize::from(l.split % listed >= WEB);
        assert_eq!(l.cache.as_ref().unwrap().fingerprint, entry(input as u8, 2), "split {}", l.split);
    }
    // One write per listed split, by each source's own numbering; everything else reads it.
    let writes: Vec<u64> =
        leases.iter().filter(|l| mode(l) == pb::CacheMode::Write).map(|l| l.split % listed).collect();
    assert_eq!(writes.len() as u64, listed, "{writes:?}");
    assert!(leases.iter().filter(|l| l.epoch == 1).all(|l| mode(l) == pb::CacheMode::Read));
    let complete = |input: u8| -> Vec<u64> {
        s.cache_entries[&(STORE.to_string(), entry(input, 2))].complete.keys().copied().collect()
    };
    assert_eq!((complete(0), complete(1)), (vec![0, 1, 2], vec![0, 1]));

    // The report and eviction see both entries.
    let report = s.cache_report("mix").unwrap();
    let sources: Vec<(&str, &str)> =
        report.sources.iter().map(|e| (e.name.as_str(), e.fingerprint.as_str())).collect();
    assert_eq!(sources, [("web", entry(0, 2).as_str()), ("code", entry(1, 2).as_str())]);
    assert_eq!(report.fingerprint, Some(entry(0, 2)));
    assert_eq!(s.cache_stores()[0].in_use, BTreeSet::from([entry(0, 2), entry(1, 2)]));

    // A pipeline reading `code` alone finds its entry complete: it reads every split.
    s.register_pipeline("code", facts("at", CODE as usize, 1)).unwrap();
    join(&mut s, "code");
    let v = worker(&mut s, "code");
    let existing =
        BTreeMap::from([(entry(1, 2), s.cache_entries[&(STORE.to_string(), entry(1, 2))].complete.clone())]);
    let generation = s.pipeline_info("code").unwrap().generation;
    let d = s.cache_profile("code", generation, code_profile(), existing, 0).unwrap().unwrap();
    assert_eq!(d.action, Action::Read { boundary: 2 });
    let read = drain(&mut s, &v, 0, as_asked);
    assert_eq!(read.len() as u64, CODE);
    assert!(
        read.iter()
            .all(|l| mode(l) == pb::CacheMode::Read && l.cache.as_ref().unwrap().fingerprint == entry(1, 2))
    );
    assert!(
        s.cache_report("code").unwrap().sources.is_empty(),
        "a single source reports `fingerprint` alone"
    );

    // The journal keeps every source's entry of the decision.
    let events = serde_json::to_string(&s.snapshot_events()).unwrap();
    let mut t = State::new(Timing::default(), 2);
    for e in serde_json::from_str::<Vec<Event>>(&events).unwrap() {
        t.apply(&e);
    }
    assert_eq!(t.pipelines["mix"].cache.decision, s.pipelines["mix"].cache.decision);
    assert_eq!(t.cache_entries, s.cache_entries);
}

#[test]
fn a_profile_with_another_number_of_source_entries_is_refused() {
    let mut s = State::new(Timing::default(), 1);
    s.register_pipeline("mix", mixed_facts(1)).unwrap();
    let generation = s.pipeline_info("mix").unwrap().generation;
    // One entry per cut, as a single-source pipeline has: the worker runs another spec.
    let err = s.cache_profile("mix", generation, code_profile(), BTreeMap::new(), 0).unwrap_err();
    assert!(
        matches!(&err, DispatchError::InvalidArgument(m) if m.contains("has 1 source entries but `mix` reads 2 sources")),
        "{err:?}"
    );
    let mut bad = mixed_profile();
    bad.boundaries[1].source_fingerprints[1] = "xyz".into();
    let err = s.cache_profile("mix", generation, bad, BTreeMap::new(), 0).unwrap_err();
    assert!(matches!(&err, DispatchError::InvalidArgument(m) if m.contains("`xyz`")), "{err:?}");
}
