//! The autocaching policies on measured inputs: a table of cases with the decision expected,
//! focused checks of figures and exclusions, and properties on arbitrary input.

use granary_policies::caching::{
    self, Action, Boundary, CacheCosts, CacheDecision, CacheInputs, Candidate, MARGIN, StoreRates, cachew,
};
use proptest::prelude::*;

/// A cut with no encode or decode cost and nothing stored yet.
fn cut(index: usize, stage: &str, bytes: f64, suffix: f64) -> Boundary {
    Boundary {
        index,
        stage: stage.into(),
        prefix_s_per_element: 0.0,
        suffix_s_per_element: suffix,
        bytes_per_element: bytes,
        encode_s_per_element: 0.0,
        decode_s_per_element: 0.0,
        existing_fraction: 0.0,
    }
}

const FREE: CacheCosts = CacheCosts { time_per_hour: 0.0, storage_per_gb_month: 0.0, retention_hours: 0.0 };
const FAST_STORE: StoreRates = StoreRates { read_bytes_per_s: 1e9, write_bytes_per_s: 5e8 };

/// ImageNet-style: read JPEG (110 kB), decode (expensive, 400 kB stored), resize (150 kB
/// stored), then random crop and flip (not deterministic). 16 cores compute 1103 items/s.
fn imagenet() -> CacheInputs {
    CacheInputs {
        boundaries: vec![
            cut(0, "source", 110e3, 0.014),
            Boundary {
                encode_s_per_element: 0.001,
                decode_s_per_element: 0.0005,
                ..cut(1, "decode", 400e3, 0.004)
            },
            Boundary {
                encode_s_per_element: 0.0005,
                decode_s_per_element: 0.0003,
                ..cut(2, "resize", 150e3, 0.002)
            },
        ],
        compute_s_per_element: 0.0145,
        cores: 16.0,
        readers: 16.0,
        elements_per_epoch: 100_000,
        remaining_epochs: 3,
        store: FAST_STORE,
        costs: FREE,
        max_bytes: None,
    }
}

/// The same pipeline with a heavier prefix (50 ms per element) behind a slow store (20 MB/s).
fn heavy_slow_store() -> CacheInputs {
    let mut i = imagenet();
    i.compute_s_per_element = 0.05;
    i.boundaries[0].suffix_s_per_element = 0.0495;
    i.boundaries[1].suffix_s_per_element = 0.01;
    i.store = StoreRates { read_bytes_per_s: 2e7, write_bytes_per_s: 2e7 };
    i
}

/// Text: tokenize (expensive) then truncate; `second_bytes` is what the later cut stores.
fn text(second_bytes: f64) -> CacheInputs {
    let tok = Boundary {
        encode_s_per_element: 1e-5,
        decode_s_per_element: 1e-5,
        ..cut(1, "tokenize", 4e3, 0.0005)
    };
    let trunc = Boundary {
        encode_s_per_element: 1e-5,
        decode_s_per_element: 1e-5,
        ..cut(2, "truncate", second_bytes, 1e-4)
    };
    CacheInputs {
        boundaries: vec![tok, trunc],
        compute_s_per_element: 0.008,
        cores: 8.0,
        readers: 8.0,
        elements_per_epoch: 1_000_000,
        remaining_epochs: 5,
        store: FAST_STORE,
        costs: FREE,
        max_bytes: None,
    }
}

/// One CPU second per element; one cut whose suffix costs `suffix` seconds; 2 epochs left.
fn margin(suffix: f64) -> CacheInputs {
    CacheInputs {
        boundaries: vec![cut(1, "parse", 1e3, suffix)],
        compute_s_per_element: 1.0,
        cores: 1.0,
        readers: 1.0,
        elements_per_epoch: 1000,
        remaining_epochs: 2,
        store: StoreRates { read_bytes_per_s: 1e9, write_bytes_per_s: 1e9 },
        costs: FREE,
        max_bytes: None,
    }
}

fn priced(mut i: CacheInputs, per_hour: f64) -> CacheInputs {
    i.costs = CacheCosts { time_per_hour: per_hour, storage_per_gb_month: 0.023, retention_hours: 720.0 };
    i
}

fn with(mut i: CacheInputs, change: impl FnOnce(&mut CacheInputs)) -> CacheInputs {
    change(&mut i);
    i
}

fn write(boundary: usize) -> Action {
    Action::Write { boundary }
}

fn read(boundary: usize) -> Action {
    Action::Read { boundary }
}

/// The candidate for `action`.
fn candidate(d: &CacheDecision, action: Action) -> &Candidate {
    d.candidates
        .iter()
        .find(|c| c.action == action)
        .unwrap_or_else(|| panic!("no candidate {action:?} in {d:#?}"))
}

fn excluded(d: &CacheDecision, action: Action) -> String {
    candidate(d, action).excluded.clone().unwrap_or_default()
}

struct Case {
    name: &'static str,
    inputs: CacheInputs,
    expect: Action,
    /// Words the reason must contain.
    says: &'static str,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "expensive prefix, small output: write at the deepest cheap cut",
            inputs: imagenet(),
            expect: write(2),
            says: "write the output of `resize` (cut 2) this epoch and read it in the 2 after: 3404 items/s reading vs 1103 computing",
        },
        Case {
            name: "cheap compute, large output: compute",
            inputs: CacheInputs {
                boundaries: vec![Boundary { decode_s_per_element: 1e-4, ..cut(1, "parse", 200e3, 2e-4) }],
                compute_s_per_element: 0.001,
                cores: 16.0,
                readers: 16.0,
                elements_per_epoch: 1_000_000,
                remaining_epochs: 10,
                store: FAST_STORE,
                costs: FREE,
                max_bytes: None,
            },
            expect: Action::Compute,
            says: "compute: reading the best cut (`parse`, cut 1, 200 kB/element) would give 4571 items/s vs 16000 computing",
        },
        Case {
            name: "slow store: compute",
            inputs: with(imagenet(), |i| i.store.read_bytes_per_s = 1e7),
            expect: Action::Compute,
            says: "items/s vs 1103 computing",
        },
        Case {
            name: "later cut over maxBytes: the earlier cut",
            inputs: with(text(8e3), |i| i.max_bytes = Some(5_000_000_000)),
            expect: write(1),
            says: "write the output of `tokenize` (cut 1)",
        },
        Case {
            name: "every cut over maxBytes: compute",
            inputs: with(imagenet(), |i| i.max_bytes = Some(12_000_000_000)),
            expect: Action::Compute,
            says: "over spec.cache.maxBytes 12 GB",
        },
        Case {
            name: "complete entry: read it",
            inputs: with(priced(imagenet(), 10.0), |i| i.boundaries[2].existing_fraction = 1.0),
            expect: read(2),
            says: "read the complete entry of `resize` (cut 2) already in the store for the 3 epochs left",
        },
        Case {
            name: "half an entry: write the rest",
            inputs: with(imagenet(), |i| i.boundaries[2].existing_fraction = 0.5),
            expect: write(2),
            says: "write the rest of the output of `resize` (cut 2; 50% already stored)",
        },
        Case {
            name: "one epoch left: compute",
            inputs: with(imagenet(), |i| i.remaining_epochs = 1),
            expect: Action::Compute,
            says: "only this epoch is left, so caching cannot pay back within this run",
        },
        Case {
            name: "one epoch left, 90% stored: finishing the entry pays at once",
            inputs: with(imagenet(), |i| {
                i.remaining_epochs = 1;
                i.boundaries[2].existing_fraction = 0.9;
            }),
            expect: write(2),
            says: "in this last epoch",
        },
        Case {
            name: "storage too dear for the time saved: compute although faster",
            inputs: priced(imagenet(), 1.0),
            expect: Action::Compute,
            says: "no gain: $0.39 ($0.34 of it storage) vs $0.08 computing",
        },
        Case {
            name: "time dear enough to pay for the storage: write",
            inputs: priced(imagenet(), 100.0),
            expect: write(2),
            says: "storage",
        },
        Case {
            name: "two cuts, the later smaller and cheaper to read: the later",
            inputs: text(2e3),
            expect: write(2),
            says: "`truncate` (cut 2)",
        },
        Case {
            name: "a 3% gain is noise: compute",
            inputs: margin(0.94),
            expect: Action::Compute,
            says: "gains only 3.0% over computing",
        },
        Case {
            name: "a 7% gain: write",
            inputs: margin(0.85),
            expect: write(1),
            says: "write the output of `parse`",
        },
        Case {
            name: "no cuts: compute",
            inputs: with(imagenet(), |i| i.boundaries.clear()),
            expect: Action::Compute,
            says: "no cut to cache",
        },
        Case {
            name: "no epochs left: compute",
            inputs: with(imagenet(), |i| i.remaining_epochs = 0),
            expect: Action::Compute,
            says: "no epochs are left",
        },
        Case {
            name: "compute time unmeasured: compute",
            inputs: with(imagenet(), |i| i.compute_s_per_element = f64::NAN),
            expect: Action::Compute,
            says: "no usable measurement of compute time",
        },
        Case {
            name: "zero bytes measured at the best cut: another",
            inputs: with(text(2e3), |i| i.boundaries[1].bytes_per_element = 0.0),
            expect: write(1),
            says: "`tokenize` (cut 1)",
        },
    ]
}

#[test]
fn decisions_over_a_table_of_measured_inputs() {
    for case in cases() {
        let d = caching::decide(&case.inputs);
        println!("{}\n  {:?}: {}", case.name, d.action, d.reason);
        assert_eq!(d.action, case.expect, "{}: {}", case.name, d.reason);
        assert!(d.reason.contains(case.says), "{}: reason {:?} lacks {:?}", case.name, d.reason, case.says);
        assert_eq!(d.candidates.len(), case.inputs.boundaries.len() + 1, "{}", case.name);
        if d.action != Action::Compute {
            assert_eq!(candidate(&d, d.action).excluded, None, "{}", case.name);
        }
    }
}

#[test]
fn deepest_cheap_cut_predicts_rates_and_rules_out_the_rest() {
    let d = caching::decide(&imagenet());
    let t_c = 0.0145 / 16.0;
    let t_r = 150e3 / 1e9 + (0.0003 + 0.002) / 16.0;
    let t_w = (0.0145 + 0.0005) / 16.0 + 150e3 / 5e8;
    assert!((d.predicted.compute_items_per_s - 1.0 / t_c).abs() < 1e-9);
    assert!((d.predicted.read_items_per_s.unwrap_or(0.0) - 1.0 / t_r).abs() < 1e-6);
    assert!((d.predicted.write_items_per_s.unwrap_or(0.0) - 1.0 / t_w).abs() < 1e-6);
    let chosen = candidate(&d, write(2));
    assert!((chosen.seconds - 1e5 * (t_w + 2.0 * t_r)).abs() < 1e-6);
    assert!((chosen.bytes - 15e9).abs() < 1.0);
    assert!(excluded(&d, write(0)).contains("reading is slower than computing"));
    assert!(excluded(&d, write(1)).contains("no gain"), "{}", excluded(&d, write(1)));
    assert!(d.reason.contains("entry 15 GB"), "{}", d.reason);
}

#[test]
fn over_budget_names_the_need_and_the_limit() {
    let d = caching::decide(&with(text(8e3), |i| i.max_bytes = Some(5_000_000_000)));
    assert_eq!(excluded(&d, write(2)), "needs 8.0 GB, over spec.cache.maxBytes 5.0 GB");
    // Without the budget the later cut wins.
    assert_eq!(caching::decide(&text(8e3)).action, write(2));
}

#[test]
fn reading_a_complete_entry_stores_nothing() {
    let inputs = with(priced(imagenet(), 10.0), |i| i.boundaries[2].existing_fraction = 1.0);
    let d = caching::decide(&inputs);
    assert_eq!(d.action, read(2));
    let c = candidate(&d, read(2));
    assert_eq!(c.bytes, 0.0);
    assert!((c.dollars - c.seconds / 3600.0 * 10.0).abs() < 1e-12, "time only: {c:?}");
    assert!(d.reason.contains("no new storage"), "{}", d.reason);
    assert_eq!(d.predicted.write_items_per_s, None);
    assert!(d.predicted.read_items_per_s.is_some());
}

#[test]
fn a_complete_entry_wins_over_writing_a_cheaper_cut() {
    // Reading the complete decode entry beats writing resize: no write epoch to pay for.
    let inputs = with(imagenet(), |i| {
        i.boundaries[1].existing_fraction = 1.0;
        i.boundaries[1].bytes_per_element = 160e3;
    });
    assert_eq!(caching::decide(&inputs).action, read(1));
}

#[test]
fn partial_entry_writes_only_the_rest() {
    let d = caching::decide(&with(imagenet(), |i| i.boundaries[2].existing_fraction = 0.5));
    assert!((candidate(&d, write(2)).bytes - 7.5e9).abs() < 1.0);
    let t_r = 150e3 / 1e9 + (0.0003 + 0.002) / 16.0;
    let t_w = (0.0145 + 0.0005) / 16.0 + 150e3 / 5e8;
    let first = 0.5 * t_r + 0.5 * t_w;
    assert!((d.predicted.write_items_per_s.unwrap_or(0.0) - 1.0 / first).abs() < 1e-6);
}

#[test]
fn storage_price_outweighs_time_saved() {
    let d = caching::decide(&priced(imagenet(), 1.0));
    assert_eq!(d.action, Action::Compute);
    let (w, c) = (candidate(&d, write(2)), candidate(&d, Action::Compute));
    assert!(w.seconds < c.seconds, "faster: {w:?} vs {c:?}");
    assert!(w.dollars > c.dollars, "dearer: {w:?} vs {c:?}");
    // Unpriced, time alone decides and storage is free.
    let free = caching::decide(&imagenet());
    assert_eq!(free.action, write(2));
    assert!(free.candidates.iter().all(|c| c.dollars == 0.0));
}

#[test]
fn the_margin_is_five_percent_of_the_total() {
    assert_eq!(MARGIN, 0.05);
    // 1900.002 s against 2000 s computing: just short of the margin.
    assert_eq!(caching::decide(&margin(0.9)).action, Action::Compute);
    assert_eq!(caching::decide(&margin(0.89)).action, write(1));
}

#[test]
fn forced_writes_where_told_and_says_what_auto_would_do() {
    let d = caching::forced(&imagenet(), 1);
    println!("{}", d.reason);
    assert_eq!(d.action, write(1));
    assert!(
        d.reason.starts_with("set by spec.cache.at: write the output of `decode` (cut 1)"),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("the auto policy would rule it out: no gain"), "{}", d.reason);
    let t_r = 400e3 / 1e9 + (0.0005 + 0.004) / 16.0;
    assert!((d.predicted.read_items_per_s.unwrap_or(0.0) - 1.0 / t_r).abs() < 1e-6);
    assert!(d.predicted.write_items_per_s.is_some());
    assert_eq!(d.candidates.len(), 4);
}

#[test]
fn forced_reads_a_complete_entry() {
    let d = caching::forced(&with(imagenet(), |i| i.boundaries[1].existing_fraction = 1.0), 1);
    assert_eq!(d.action, read(1));
    assert!(
        d.reason.starts_with("set by spec.cache.at: read the complete entry of `decode` (cut 1)"),
        "{}",
        d.reason
    );
    assert_eq!(d.predicted.write_items_per_s, None);
    assert!(d.predicted.read_items_per_s.is_some());
}

#[test]
fn forced_at_an_unknown_cut_computes() {
    let d = caching::forced(&imagenet(), 7);
    assert_eq!(d.action, Action::Compute);
    assert!(d.reason.contains("spec.cache.at is cut 7, which is not a cut"), "{}", d.reason);
    assert!(d.reason.contains("cuts: 0, 1, 2"), "{}", d.reason);
}

#[test]
fn forced_keeps_the_cut_even_without_measurements() {
    let d = caching::forced(&with(imagenet(), |i| i.boundaries[2].bytes_per_element = f64::NAN), 2);
    assert_eq!(d.action, write(2));
    assert!(
        d.reason.contains("no prediction: no usable measurement: bytes_per_element is NaN"),
        "{}",
        d.reason
    );
}

#[test]
fn cachew_trusts_its_static_table_where_granary_measures_a_slow_store() {
    let inputs = heavy_slow_store();
    let granary = caching::decide(&inputs);
    assert_eq!(granary.action, Action::Compute, "{}", granary.reason);
    let c = cachew::decide(&inputs);
    println!("{}\n{}", granary.reason, c.reason);
    assert_eq!(c.action, write(2), "{}", c.reason);
    assert!(c.reason.starts_with("Cachew: cache the full output of `resize` (cut 2)"), "{}", c.reason);
    assert!(c.reason.contains("reads assumed at 200 MB/s"), "{}", c.reason);
    // Only computing, the source and the last cut: the middle cut is not an option.
    let actions: Vec<Action> = c.candidates.iter().map(|c| c.action).collect();
    assert_eq!(actions, vec![Action::Compute, write(0), write(2)]);
    // Time only: no budget, no dollars.
    let limited = cachew::decide(&priced(with(inputs, |i| i.max_bytes = Some(1)), 1.0));
    assert_eq!(limited.action, write(2));
    assert!(limited.candidates.iter().all(|c| c.dollars == 0.0));
}

#[test]
fn cachew_computes_when_the_table_says_so() {
    let inputs = with(imagenet(), |i| i.boundaries[2].bytes_per_element = 1e6);
    let d = cachew::decide(&inputs);
    println!("{}", d.reason);
    assert_eq!(d.action, Action::Compute, "{}", d.reason);
    assert!(d.reason.starts_with("Cachew: compute:"), "{}", d.reason);
    assert_eq!(cachew::STATIC_BYTES_PER_S, 200e6);
}

/// Any value, finite or not.
fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MIN_POSITIVE),
        Just(1e-300),
        Just(1e300),
        Just(f64::MAX),
        0.0..1.0f64,
        0.0..1e9f64,
    ]
}

/// A share, mostly in 0..=1.
fn share() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64, value()]
}

fn boundary(index: usize) -> impl Strategy<Value = Boundary> {
    (value(), value(), value(), value(), value(), share()).prop_map(move |(pre, suf, bytes, enc, dec, f)| {
        Boundary {
            index,
            stage: format!("s{index}"),
            prefix_s_per_element: pre,
            suffix_s_per_element: suf,
            bytes_per_element: bytes,
            encode_s_per_element: enc,
            decode_s_per_element: dec,
            existing_fraction: f,
        }
    })
}

fn boundaries() -> impl Strategy<Value = Vec<Boundary>> {
    prop::collection::btree_set(0usize..8, 0..5)
        .prop_flat_map(|set| set.into_iter().map(boundary).collect::<Vec<_>>())
}

fn inputs() -> impl Strategy<Value = CacheInputs> {
    (
        boundaries(),
        (value(), value()),
        prop_oneof![Just(0u64), Just(1u64), Just(u64::MAX), 0..10_000_000u64],
        prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), 0..20u32],
        (value(), value()),
        (value(), value(), value()),
        prop::option::of(prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()]),
    )
        .prop_map(|(boundaries, (compute, cores), n, e, (read, write), (hour, gb, ret), max_bytes)| {
            CacheInputs {
                boundaries,
                compute_s_per_element: compute,
                cores,
                readers: cores,
                elements_per_epoch: n,
                remaining_epochs: e,
                store: StoreRates { read_bytes_per_s: read, write_bytes_per_s: write },
                costs: CacheCosts { time_per_hour: hour, storage_per_gb_month: gb, retention_hours: ret },
                max_bytes,
            }
        })
}

/// The decision is well formed: its cut is among the inputs, every figure is finite.
fn well_formed(inputs: &CacheInputs, d: &CacheDecision) -> Result<(), TestCaseError> {
    let indices: Vec<usize> = inputs.boundaries.iter().map(|b| b.index).collect();
    match d.action {
        Action::Compute => {}
        Action::Write { boundary } | Action::Read { boundary } => {
            prop_assert!(indices.contains(&boundary), "{:?} not among {:?}", d.action, indices);
        }
    }
    prop_assert!(!d.reason.is_empty());
    let p = d.predicted;
    for x in [Some(p.compute_items_per_s), p.write_items_per_s, p.read_items_per_s].into_iter().flatten() {
        prop_assert!(x.is_finite() && x >= 0.0, "{:?}", p);
    }
    for c in &d.candidates {
        prop_assert!(c.seconds.is_finite() && c.bytes.is_finite() && c.dollars.is_finite(), "{:?}", c);
    }
    Ok(())
}

proptest! {
    #[test]
    fn decide_is_total_and_well_formed(inputs in inputs()) {
        let d = caching::decide(&inputs);
        well_formed(&inputs, &d)?;
        prop_assert_eq!(d.candidates.len(), inputs.boundaries.len() + 1);
        if d.action != Action::Compute {
            let chosen = candidate(&d, d.action);
            let compute = candidate(&d, Action::Compute);
            prop_assert_eq!(&chosen.excluded, &None);
            let priced = inputs.costs.time_per_hour.is_finite() && inputs.costs.time_per_hour > 0.0;
            let key = |c: &Candidate| if priced { c.dollars } else { c.seconds };
            prop_assert!(key(chosen) <= (1.0 - MARGIN) * key(compute), "{:?} vs {:?}", chosen, compute);
        }
        if let Action::Read { boundary } = d.action {
            let b = inputs.boundaries.iter().find(|b| b.index == boundary);
            prop_assert!(b.is_some_and(|b| b.existing_fraction >= 1.0));
        }
    }

    #[test]
    fn forced_and_cachew_are_total(inputs in inputs(), at in 0usize..9) {
        let f = caching::forced(&inputs, at);
        well_formed(&inputs, &f)?;
        let known = inputs.boundaries.iter().any(|b| b.index == at);
        prop_assert_eq!(f.action != Action::Compute, known);
        let c = cachew::decide(&inputs);
        well_formed(&inputs, &c)?;
        prop_assert!(c.reason.starts_with("Cachew: "));
    }
}

#[test]
fn decoding_entries_scales_with_workers_not_cores() {
    // Each worker decodes its entries on one thread: with 16 cores in one worker, a read-heavy
    // epoch is bounded by that thread.
    let one = with(imagenet(), |i| i.readers = 1.0);
    let many = with(imagenet(), |i| i.readers = 16.0);
    let rate = |i: &CacheInputs| caching::forced(i, 2).predicted.read_items_per_s;
    let (Some(one), Some(many)) = (rate(&one), rate(&many)) else { panic!("both read") };
    assert!(one < many, "{one} vs {many}");
    // The chosen cut is `resize`: 150 kB at 1 GB/s, 0.3 ms decoding on one thread, 2 ms of
    // suffix over 16 cores.
    let expected = 1.0 / (150e3 / 1e9 + 0.0003 + 0.002 / 16.0);
    assert!((one - expected).abs() < 1e-6 * expected, "{one} vs {expected}");
}
