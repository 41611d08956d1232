//! Each rewrite rule on small specs: what moves, what does not, and why.

use granary_crds::{InputPipelineSpec, parse_manifest};
use granary_optimizer::{Equivalence, Rewrite, optimize};
use std::path::Path;

fn spec(format: &str, stages: &str) -> InputPipelineSpec {
    let yaml = format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  source: \
         {{url: 'file:///data/', format: {format}}}\n  batch: {{size: 4}}\n  stages:\n{stages}"
    );
    match parse_manifest(&yaml, Path::new("/"), &[]) {
        Ok(m) => m.pipeline.spec,
        Err(e) => panic!("{e}\n{yaml}"),
    }
}

fn order(spec: &InputPipelineSpec) -> Vec<usize> {
    optimize(spec).origins()
}

#[test]
fn a_flip_after_a_hwc_normalize_moves_before_it_exactly() {
    let s = spec(
        "files",
        "  - {op: image.decode}\n  - {op: image.random_resized_crop, size: 8}\n  - {op: image.normalize}\n  - {op: image.flip}\n",
    );
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [0, 1, 3, 2]);
    let [Rewrite::Reorder { stage: 3, past, equivalence: Equivalence::Exact, .. }] = plan.rewrites.as_slice()
    else {
        panic!("{:?}", plan.rewrites)
    };
    assert_eq!(past, &[2]);
}

#[test]
fn a_flip_after_a_chw_normalize_is_still_an_error_the_optimizer_does_not_hide() {
    // A flip needs HWC: the spec is rejected with the fix, whether the optimizer is on or off.
    let yaml = "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {name: t}\nspec:\n  source: \
                {url: 'file:///data/', format: files}\n  batch: {size: 4}\n  stages:\n  - {op: image.decode}\n  \
                - {op: image.normalize, layout: CHW}\n  - {op: image.flip}\n";
    let Err(problems) = parse_manifest(yaml, Path::new("/"), &[]) else { panic!("a CHW flip validated") };
    assert!(problems.to_string().contains("move this stage before it"), "{problems}");
}

#[test]
fn crops_move_before_a_uint8_hwc_normalize_and_random_stages_keep_their_order() {
    let s = spec(
        "files",
        "  - {op: image.decode}\n  - {op: image.normalize, dtype: uint8}\n  - {op: image.random_resized_crop, size: 8}\n  - {op: image.flip}\n",
    );
    // The crop and the flip both pass the normalization; the crop still draws first.
    assert_eq!(order(&s), [0, 2, 3, 1]);
}

#[test]
fn a_filter_moves_before_maps_that_do_not_write_what_it_tests() {
    let s = spec(
        "jsonl",
        "  - {op: text.tokenize, tokenizer: t.json, field: body}\n  - {op: table.cast, columns: {label: int64}}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 10}\n",
    );
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [2, 0, 1]);
    assert!(matches!(&plan.rewrites[0], Rewrite::Reorder { stage: 2, past, .. } if past == &[1, 0]));
}

#[test]
fn a_filter_on_what_a_map_writes_stays_after_it() {
    let s = spec(
        "jsonl",
        "  - {op: text.tokenize, tokenizer: t.json}\n  - {op: filter, predicate: text.length, unit: tokens, min: 2}\n",
    );
    assert_eq!(order(&s), [0, 1]);
}

#[test]
fn python_stages_move_only_when_they_declare_their_fields() {
    let undeclared = spec(
        "jsonl",
        "  - {op: python.map, function: 'aug:f'}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 3}\n",
    );
    assert_eq!(order(&undeclared), [0, 1]);
    let declared = spec(
        "jsonl",
        "  - {op: python.map, function: 'aug:f', reads: [body], writes: [body]}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 3}\n",
    );
    assert_eq!(order(&declared), [1, 0]);
    let declared_filter = spec(
        "jsonl",
        "  - {op: table.cast, columns: {label: int64}}\n  - {op: python.filter, function: 'q:keep', reads: [title]}\n",
    );
    assert_eq!(order(&declared_filter), [1, 0]);
    let random_batched = spec(
        "jsonl",
        "  - {op: python.map, function: 'aug:f', batched: true, reads: [body], writes: [body]}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 3}\n",
    );
    assert_eq!(order(&random_batched), [0, 1], "a random batched function draws per group");
}

#[test]
fn a_select_after_a_tokenizer_bounds_what_the_source_reads() {
    let s = spec(
        "parquet",
        "  - {op: text.tokenize, tokenizer: t.json, field: body}\n  - {op: table.select, columns: [input_ids, label]}\n",
    );
    let plan = optimize(&s);
    // The select cannot pass the tokenizer, which makes `input_ids`.
    assert_eq!(plan.origins(), [0, 1]);
    assert_eq!(plan.fields.as_deref(), Some(&["body".to_string(), "label".to_string()][..]));
    let applied = plan.apply(&s);
    assert_eq!(applied.source.and_then(|s| s.fields), Some(vec!["body".to_string(), "label".to_string()]));
}

#[test]
fn a_select_moves_only_before_a_python_stage_it_keeps_the_fields_of() {
    // Past a Rust stage a select gains nothing (dropped fields cost nothing to carry, and the
    // source already skips them): it stays, and the source reads only what both use.
    let s = spec(
        "parquet",
        "  - {op: table.cast, columns: {label: int64}}\n  - {op: table.select, columns: [label, x]}\n",
    );
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [0, 1]);
    assert_eq!(plan.fields.as_deref(), Some(&["label".to_string(), "x".to_string()][..]));
    // Nor does it split the tokenizer from the truncation the worker fuses with it.
    let s = spec(
        "jsonl",
        "  - {op: text.tokenize, tokenizer: t.json}\n  - {op: text.truncate_pad, length: 8}\n  - {op: table.select, columns: [input_ids, attention_mask]}\n",
    );
    assert_eq!(order(&s), [0, 1, 2]);
    // A Python stage receives every field in its process: the select goes first when the
    // function declares that it touches only kept fields.
    let s = spec(
        "jsonl",
        "  - {op: python.map, function: 'aug:f', deterministic: true, reads: [label], writes: [label]}\n  - {op: table.select, columns: [label, x]}\n",
    );
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [1, 0]);
    let [Rewrite::Reorder { gain, .. }, ..] = plan.rewrites.as_slice() else { panic!("{:?}", plan.rewrites) };
    assert!(gain.contains("Python stage"), "{gain}");
    let undeclared = spec(
        "jsonl",
        "  - {op: python.map, function: 'aug:f'}\n  - {op: table.select, columns: [label, x]}\n",
    );
    assert_eq!(order(&undeclared), [0, 1]);
}

#[test]
fn packing_needs_only_its_field_and_nothing_crosses_it() {
    let s = spec(
        "jsonl",
        "  - {op: filter, predicate: text.length, unit: chars, min: 2}\n  - {op: text.tokenize, tokenizer: t.json}\n  - {op: text.pack, length: 16, eos: 2}\n",
    );
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [0, 1, 2]);
    assert_eq!(plan.fields.as_deref(), Some(&["text".to_string()][..]));
}

#[test]
fn no_projection_without_a_bound_on_the_batch_fields_or_for_other_formats() {
    let s = spec("jsonl", "  - {op: text.tokenize, tokenizer: t.json}\n");
    assert_eq!(optimize(&s).fields, None, "every field reaches the batch");
    let tfrecord = spec("tfrecord", "  - {op: table.select, columns: [label]}\n");
    assert_eq!(optimize(&tfrecord).fields, None, "the TFRecord reader does not skip fields");
}

#[test]
fn optimize_false_runs_the_stages_as_written() {
    let mut s = spec(
        "parquet",
        "  - {op: table.cast, columns: {label: int64}}\n  - {op: table.select, columns: [label]}\n",
    );
    s.optimize = false;
    let plan = optimize(&s);
    assert_eq!(plan.origins(), [0, 1]);
    assert!(plan.rewrites.is_empty() && plan.fields.is_none() && !plan.enabled);
    assert_eq!(plan.apply(&s), s);
    assert!(plan.explain(&s).contains("optimizer: off"));
}

#[test]
fn a_pinned_cache_cut_is_a_fence_and_its_stage_stays() {
    let yaml = "  - {op: table.cast, columns: {label: int64}, name: c}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 3}\n";
    let mut s = spec("jsonl", yaml);
    s.cache = Some(granary_crds::CacheSpec {
        policy: granary_crds::CachePolicy::At,
        at: Some("c".into()),
        store: Some("file:///cache/".into()),
        max_bytes: None,
        ttl: None,
        on_delete: None,
    });
    assert_eq!(order(&s), [0, 1]);
    s.cache = None;
    assert_eq!(order(&s), [1, 0]);
}

#[test]
fn explain_names_each_move_with_its_rule_and_the_fields_read() {
    let s = spec(
        "jsonl",
        "  - {op: text.tokenize, tokenizer: t.json, field: body}\n  - {op: filter, predicate: text.length, field: title, unit: chars, max: 10}\n  - {op: table.select, columns: [input_ids]}\n",
    );
    let text = optimize(&s).explain(&s);
    assert!(text.contains("moved spec.stages[1] `filter` before spec.stages[0] `text.tokenize`"), "{text}");
    assert!(text.contains("equivalence: exact"), "{text}");
    assert!(text.contains("source reads: body, title"), "{text}");
}

/// `spec` with `extra` lines (`shuffle`, `errors`) added to its spec.
fn with(spec_yaml: &str, extra: &str) -> InputPipelineSpec {
    let yaml = format!(
        "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: t}}\nspec:\n  source: \
         {{url: 'file:///data/', format: jsonl}}\n  batch: {{size: 4}}\n{extra}  stages:\n{spec_yaml}"
    );
    match parse_manifest(&yaml, Path::new("/"), &[]) {
        Ok(m) => m.pipeline.spec,
        Err(e) => panic!("{e}\n{yaml}"),
    }
}

#[test]
fn a_shuffle_moves_before_the_stages_only_when_each_gives_one_element_in_process() {
    let shuffle = "  shuffle: {buffer: 64}\n";
    let maps = "  - {op: table.cast, columns: {label: float32}}\n";
    assert!(optimize(&with(maps, shuffle)).shuffles_first());
    assert!(optimize(&with(maps, shuffle)).explain(&with(maps, shuffle)).contains("shuffled as it is read"));
    // Nothing to move without a shuffle, or with the optimizer off.
    assert!(!optimize(&with(maps, "")).shuffles_first());
    let mut off = with(maps, shuffle);
    off.optimize = false;
    assert!(!optimize(&off).shuffles_first());
    // A filter, a skipped error or packing makes a split's count depend on its elements; a
    // Python stage takes elements in blocks of consecutive ones.
    let filter = "  - {op: filter, predicate: text.length, field: title, unit: chars, max: 4}\n";
    assert!(!optimize(&with(&format!("{maps}{filter}"), shuffle)).shuffles_first());
    let skip = format!("{shuffle}  errors: {{policy: skip}}\n");
    assert!(!optimize(&with(maps, &skip)).shuffles_first());
    let python = "  - {op: python.map, function: 'm:f', reads: [label], writes: [label]}\n";
    assert!(!optimize(&with(&format!("{maps}{python}"), shuffle)).shuffles_first());
}
