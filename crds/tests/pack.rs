//! `text.pack` in validation: its own fields, what it needs before it, what may follow it, and
//! that it ends the cacheable prefix and makes counts known only after compute.

use granary_crds::validate::{counts_known, deterministic_prefix_len};
use granary_crds::{BatchSpec, InputPipelineSpec, Problem, SourceFormat, SourceSpec, StageSpec, validate};

fn stage(op: &str, params: serde_json::Value) -> StageSpec {
    StageSpec { op: op.into(), name: None, params: params.as_object().cloned().unwrap_or_default() }
}

fn spec(stages: Vec<StageSpec>) -> InputPipelineSpec {
    InputPipelineSpec {
        source: Some(SourceSpec {
            url: "s3://bucket/text/".into(),
            format: SourceFormat::Jsonl,
            labels: None,
            files_per_split: None,
            compression: None,
            delimiter: None,
            fields: None,
        }),
        sources: Vec::new(),
        mixing: None,
        stages,
        shuffle: None,
        batch: BatchSpec { size: 8, drop_remainder: false, pad: None, bucket: None },
        seed: 0,
        epochs: 1,
        scaling: None,
        cache: None,
        workers: None,
        python: None,
        errors: None,
        optimize: true,
    }
}

fn tokenize() -> StageSpec {
    stage("text.tokenize", serde_json::json!({"tokenizer": "tokenizer.json"}))
}

fn pack(params: serde_json::Value) -> StageSpec {
    stage("text.pack", params)
}

fn problems(stages: Vec<StageSpec>) -> Vec<Problem> {
    validate(&spec(stages))
}

fn at<'a>(problems: &'a [Problem], path: &str) -> &'a Problem {
    problems.iter().find(|p| p.path == path).unwrap_or_else(|| panic!("no problem at {path}: {problems:?}"))
}

#[test]
fn a_pack_after_a_tokenizer_is_valid() {
    let stages = vec![tokenize(), pack(serde_json::json!({"length": 2048, "eos": 0}))];
    assert_eq!(problems(stages.clone()), vec![]);
    let stages = vec![
        tokenize(),
        pack(serde_json::json!({"length": 16, "eos": 3, "padId": 1, "lastRow": "drop"})),
        stage("table.cast", serde_json::json!({"columns": {"segment_ids": "int32"}})),
        stage("python.map", serde_json::json!({"function": "m:f"})),
    ];
    assert_eq!(problems(stages), vec![]);
}

#[test]
fn fields_out_of_range_are_named() {
    let p = problems(vec![
        tokenize(),
        pack(serde_json::json!({"length": 0, "eos": -1, "padId": -2, "field": ""})),
    ]);
    assert!(at(&p, "spec.stages[1].length").message.contains(">= 1"), "{p:?}");
    assert!(at(&p, "spec.stages[1].eos").message.contains(">= 0"), "{p:?}");
    assert!(at(&p, "spec.stages[1].padId").message.contains(">= 0"), "{p:?}");
    assert!(at(&p, "spec.stages[1].field").message.contains("input_ids"), "{p:?}");
    let p = problems(vec![tokenize(), pack(serde_json::json!({"length": 2_000_000, "eos": 0}))]);
    assert!(at(&p, "spec.stages[1].length").message.contains("1048576"), "{p:?}");
    let p = problems(vec![tokenize(), pack(serde_json::json!({"length": 8}))]);
    assert!(at(&p, "spec.stages[1].eos").message.contains("needs `eos`"), "{p:?}");
    let p = problems(vec![tokenize(), pack(serde_json::json!({"length": 8, "eos": 0, "lastRow": "keep"}))]);
    assert!(at(&p, "spec.stages[1].lastRow").message.contains("unknown variant"), "{p:?}");
}

#[test]
fn it_needs_tokens_before_it() {
    let p = problems(vec![pack(serde_json::json!({"length": 8, "eos": 0})), tokenize()]);
    let problem = at(&p, "spec.stages[0].op");
    assert!(problem.message.contains("add a `text.tokenize` stage before it"), "{p:?}");
}

#[test]
fn what_cannot_follow_it_is_named_with_the_fix() {
    let p = problems(vec![
        tokenize(),
        pack(serde_json::json!({"length": 8, "eos": 0})),
        stage("text.truncate", serde_json::json!({"length": 4})),
        stage("filter", serde_json::json!({"predicate": "text.length", "unit": "tokens", "min": 1})),
        stage("python.map", serde_json::json!({"function": "m:f", "batched": true})),
        pack(serde_json::json!({"length": 8, "eos": 0})),
    ]);
    assert!(at(&p, "spec.stages[2].op").message.contains("move this stage before spec.stages[1]"), "{p:?}");
    assert!(at(&p, "spec.stages[3].op").message.contains("cannot follow `text.pack`"), "{p:?}");
    assert!(at(&p, "spec.stages[4].batched").message.contains("batched: false"), "{p:?}");
    assert!(at(&p, "spec.stages[5].op").message.contains("packed once"), "{p:?}");
}

#[test]
fn it_ends_the_cacheable_prefix_and_counts_are_learnt() {
    let stages = vec![tokenize(), pack(serde_json::json!({"length": 8, "eos": 0}))];
    assert_eq!(deterministic_prefix_len(&stages), 1);
    assert!(!counts_known(&stages));
    assert!(counts_known(&stages[..1]));
}
