//! The optimizer's rewrites keep the output: for each rule, a pipeline run with `spec.optimize`
//! on and off gives the same multiset of elements, byte for byte where the rule is exact, and
//! within the stated bound where the plan also changes how images are decoded.

mod support;

use bytes::Bytes;
use granary_optimizer::Rewrite;
use granary_worker::store::memory_store;
use granary_worker::{Batch, Engine, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One element of a batch: each field's name, shape (without the batch axis), element type
/// and bytes.
type Row = Vec<(String, Vec<usize>, String, Vec<u8>)>;

/// Every element of `batches` by epoch and key.
fn rows(batches: &[Batch]) -> BTreeMap<String, Row> {
    let mut out = BTreeMap::new();
    for b in batches {
        let n = b.len();
        for (i, key) in b.keys.iter().enumerate() {
            let row = b
                .tensors
                .iter()
                .map(|t| {
                    let width = t.data.len() / n.max(1);
                    let dtype = format!("{:?}", t.dtype);
                    (
                        t.name.clone(),
                        t.shape[1..].to_vec(),
                        dtype,
                        t.data[i * width..(i + 1) * width].to_vec(),
                    )
                })
                .collect();
            let key = format!("epoch {} {key}", b.epoch);
            assert!(out.insert(key.clone(), row).is_none(), "element `{key}` came twice");
        }
    }
    out
}

/// Runs every epoch of `yaml` (a manifest) with the optimizer on or off.
fn run(yaml: &str, optimize: bool) -> (Vec<Batch>, Engine) {
    let mut manifest =
        granary_crds::parse_manifest(yaml, Path::new("/"), &[]).unwrap_or_else(|p| panic!("{p}"));
    manifest.pipeline.spec.optimize = optimize;
    let engine = Engine::open(&manifest, EngineOptions { threads: 2, ..Default::default() })
        .unwrap_or_else(|e| panic!("{e}"));
    let epochs = manifest.pipeline.spec.epochs;
    let batches = engine.run_epochs(0..epochs).map(|b| b.unwrap_or_else(|e| panic!("{e}"))).collect();
    (batches, engine)
}

/// A fresh memory store name per case.
fn store_name(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// JSONL rows with a title of 1–`max_title` characters, a body, a label and a large unused
/// field, in `files` files.
fn jsonl(name: &str, rows: usize, files: usize, max_title: usize, seed: u64) {
    let store = memory_store(name);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for f in 0..files {
        let mut text = String::new();
        for r in (f..rows).step_by(files) {
            let len = 1 + ((r as u64 * 2654435761 + seed) % max_title as u64) as usize;
            let title: String = (0..len).map(|i| (b'a' + ((r + i) % 26) as u8) as char).collect();
            text.push_str(&format!(
                "{{\"title\": \"{title}\", \"body\": \"body {r}\", \"label\": {r}, \"meta\": \"{}\"}}\n",
                "x".repeat(200)
            ));
        }
        let path = StorePath::from(format!("data/part-{f:02}.jsonl"));
        rt.block_on(store.put(&path, Bytes::from(text).into())).unwrap();
    }
}

fn text_manifest(name: &str, stages: &str, seed: u64, shuffle: u32) -> String {
    let shuffle = if shuffle > 0 { format!("  shuffle: {{buffer: {shuffle}}}\n") } else { String::new() };
    format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: opt}}\nspec:\n  source: \
         {{url: 'memory://{name}/data/', format: jsonl}}\n  batch: {{size: 5}}\n  seed: {seed}\n  epochs: 2\n{shuffle}  \
         stages:\n{stages}"
    )
}

fn image_manifest(name: &str, stages: &str, seed: u64) -> String {
    format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: opt}}\nspec:\n  source: \
         {{url: 'memory://{name}/data/train/', format: files, labels: ../labels.jsonl, filesPerSplit: 8}}\n  \
         batch: {{size: 4}}\n  seed: {seed}\n  shuffle: {{buffer: 6}}\n  stages:\n{stages}"
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, .. ProptestConfig::default() })]

    /// Filter first: a filter moves before the maps that write none of the fields it tests (the
    /// select stays after the cast: moving it would gain nothing); the source reads only what
    /// they use.
    #[test]
    fn filters_and_selects_moved_earlier_keep_every_element_exactly(
        seed in 0u64..1000,
        max in 2u64..12,
        shuffle in 0u32..8,
        files in 1usize..4,
    ) {
        let name = store_name("opt-text");
        jsonl(&name, 40, files, 12, seed);
        let stages = format!(
            "  - {{op: table.cast, columns: {{label: float32}}}}\n  - {{op: filter, predicate: text.length, \
             field: title, unit: chars, max: {max}}}\n  - {{op: table.select, columns: [label]}}\n"
        );
        let yaml = text_manifest(&name, &stages, seed, shuffle);
        let (on, engine) = run(&yaml, true);
        let (off, plain) = run(&yaml, false);
        prop_assert_eq!(engine.optimized().origins(), vec![1, 0, 2]);
        prop_assert_eq!(plain.optimized().origins(), vec![0, 1, 2]);
        prop_assert_eq!(engine.spec().source.as_ref().and_then(|s| s.fields.clone()),
            Some(vec!["label".to_string(), "title".to_string()]));
        let (on, off) = (rows(&on), rows(&off));
        prop_assert!(!off.is_empty());
        prop_assert_eq!(on, off);
    }

    /// A flip after a HWC normalization moves before it: both plans fuse the decode and the
    /// crop, so the pixels are the same bytes.
    #[test]
    fn a_flip_moved_before_normalize_gives_the_same_bytes(seed in 0u64..1000) {
        let name = store_name("opt-flip");
        support::dataset(&name, 20);
        let stages = "  - {op: image.decode}\n  - {op: image.random_resized_crop, size: 16}\n  - {op: image.normalize, \
                      mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n  - {op: image.flip}\n";
        let yaml = image_manifest(&name, stages, seed);
        let (on, engine) = run(&yaml, true);
        let (off, _) = run(&yaml, false);
        prop_assert_eq!(engine.optimized().origins(), vec![0, 1, 3, 2]);
        let (on, off) = (rows(&on), rows(&off));
        prop_assert_eq!(on.len(), 20);
        prop_assert_eq!(on, off);
    }
}

/// Every batch in order: its epoch, keys and tensors (name, shape, element type, bytes).
fn sequence(batches: &[Batch]) -> Vec<(u32, Vec<String>, Row)> {
    batches
        .iter()
        .map(|b| {
            let tensors = b
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.shape.clone(), format!("{:?}", t.dtype), t.data.clone()));
            (b.epoch, b.keys.clone(), tensors.collect())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, .. ProptestConfig::default() })]

    /// Shuffle first: the reader shuffles each split before the stages with the assembler's
    /// draws, so the batches are the same bytes in the same order, for a buffer smaller or larger
    /// than a split, random stages included.
    #[test]
    fn shuffling_before_the_stages_gives_the_same_batches_in_order(
        seed in 0u64..1000,
        buffer in 1u32..12,
        per_split in 1usize..10,
    ) {
        let name = store_name("opt-shuffle-images");
        support::dataset(&name, 20);
        let yaml = format!(
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: opt}}\nspec:\n  source: \
             {{url: 'memory://{name}/data/train/', format: files, labels: ../labels.jsonl, filesPerSplit: {per_split}}}\n  \
             batch: {{size: 3}}\n  seed: {seed}\n  epochs: 2\n  shuffle: {{buffer: {buffer}}}\n  stages:\n  \
             - {{op: image.decode}}\n  - {{op: image.random_resized_crop, size: 12}}\n  - {{op: image.flip}}\n  \
             - {{op: image.normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}\n"
        );
        let (on, engine) = run(&yaml, true);
        let (off, _) = run(&yaml, false);
        prop_assert_eq!(&engine.optimized().rewrites, &vec![Rewrite::ShuffleFirst]);
        prop_assert_eq!(on.iter().map(Batch::len).sum::<usize>(), 40);
        prop_assert_eq!(sequence(&on), sequence(&off));
    }

    /// The same for a streamed source (JSONL lines), where the reader holds the lines it has not
    /// handed on yet.
    #[test]
    fn shuffling_lines_before_the_stages_gives_the_same_batches_in_order(
        seed in 0u64..1000,
        buffer in 1u32..30,
        files in 1usize..4,
    ) {
        let name = store_name("opt-shuffle-text");
        jsonl(&name, 40, files, 12, seed);
        let stages = "  - {op: table.cast, columns: {label: float32}}\n  - {op: table.select, columns: [label]}\n";
        let yaml = text_manifest(&name, stages, seed, buffer);
        let (on, engine) = run(&yaml, true);
        let (off, _) = run(&yaml, false);
        prop_assert!(engine.optimized().shuffles_first(), "{:?}", engine.optimized().rewrites);
        prop_assert_eq!(on.iter().map(Batch::len).sum::<usize>(), 80);
        prop_assert_eq!(sequence(&on), sequence(&off));
    }
}

/// A `uint8` HWC normalization before the crop is the identity: the crop and the flip move
/// before it, and the decode then fuses with them. The rewrite is exact; decoding only the
/// crop's window is what may change pixels, within the fused path's bound (a mean absolute
/// error of 2 per image against the separate stages).
#[test]
fn crops_moved_before_an_identity_normalize_stay_within_the_fused_bound() {
    let name = store_name("opt-crop");
    support::dataset(&name, 24);
    for (stages, size) in [
        (
            "  - {op: image.decode}\n  - {op: image.normalize, dtype: uint8}\n  - {op: image.random_resized_crop, size: 16}\n  - {op: image.flip}\n",
            16,
        ),
        (
            "  - {op: image.decode}\n  - {op: image.normalize, dtype: uint8}\n  - {op: image.center_crop, size: 20}\n  - {op: image.flip}\n",
            20,
        ),
    ] {
        let yaml = image_manifest(&name, stages, 7);
        let (on, engine) = run(&yaml, true);
        let (off, _) = run(&yaml, false);
        assert_eq!(engine.optimized().origins(), [0, 2, 3, 1]);
        let (on, off) = (rows(&on), rows(&off));
        assert_eq!(on.keys().collect::<Vec<_>>(), off.keys().collect::<Vec<_>>());
        for (key, row) in &on {
            let other = &off[key];
            for (a, b) in row.iter().zip(other) {
                assert_eq!((&a.0, &a.1, &a.2), (&b.0, &b.1, &b.2), "{key}");
                if a.0 == "image" {
                    assert_eq!(a.1, [size, size, 3]);
                    let mae = a.3.iter().zip(&b.3).map(|(x, y)| x.abs_diff(*y) as f64).sum::<f64>()
                        / a.3.len() as f64;
                    assert!(mae <= 2.0, "{key}: mean absolute error {mae:.3} over the bound of 2");
                } else {
                    assert_eq!(a.3, b.3, "{key}: {}", a.0);
                }
            }
        }
    }
}
