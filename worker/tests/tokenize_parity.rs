//! Parity of `text.tokenize` with the Python `tokenizers` package: every case in
//! `fixtures/tokenizer/cases.jsonl` (written by `make_fixtures.py`) must give the ids and the
//! attention mask Python gave, for each tokenizer, with and without special tokens.

use granary_crds::ops::Tokenize;
use granary_worker::element::{Element, Value};
use granary_worker::ops::text::tokenize::TokenizeOp;
use granary_worker::ops::{BuildContext, BuildError, Operator};
use granary_worker::seed::SeededRng;
use granary_worker::tensor::{Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

/// A build context that reads local files relative to the fixture folder.
fn local_ctx() -> BuildContext {
    let base = fixtures();
    let root = base.clone();
    BuildContext {
        base_dir: base,
        read: Box::new(move |p| std::fs::read(root.join(p)).map_err(|e| BuildError(format!("{p}: {e}")))),
        python: None,
    }
}

struct Case {
    tokenizer: String,
    add_special_tokens: bool,
    text: String,
    ids: Vec<i64>,
    mask: Vec<i64>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("cases.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ints = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
            Case {
                tokenizer: v["tokenizer"].as_str().unwrap().to_string(),
                add_special_tokens: v["add_special_tokens"].as_bool().unwrap(),
                text: v["text"].as_str().unwrap().to_string(),
                ids: ints("ids"),
                mask: ints("attention_mask"),
            }
        })
        .collect()
}

fn vector(el: &Element, name: &str) -> Vec<i64> {
    match el.get(name) {
        Some(Value::Tensor(Tensor { shape, data: TensorData::I64(v) })) => {
            assert_eq!(shape, &vec![v.len()], "{name} must be 1-D");
            v.to_vec()
        }
        other => panic!("{name} is not an int64 tensor: {other:?}"),
    }
}

#[test]
fn ids_and_masks_match_python_for_every_case() {
    let cases = cases();
    assert!(cases.len() >= 240, "fixture has {} cases", cases.len());
    let ctx = local_ctx();
    let mut ops: BTreeMap<(String, bool), TokenizeOp> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut rng = SeededRng::for_element(0, 0, 0, 0);
    for (n, case) in cases.iter().enumerate() {
        let op = ops.entry((case.tokenizer.clone(), case.add_special_tokens)).or_insert_with(|| {
            let cfg = Tokenize {
                tokenizer: case.tokenizer.clone(),
                field: "text".to_string(),
                add_special_tokens: case.add_special_tokens,
            };
            TokenizeOp::new(&cfg, &ctx).unwrap()
        });
        let mut el = Element::new(format!("case-{n}"));
        el.set("text", Value::Text(case.text.clone()));
        op.apply(&mut el, &mut rng).unwrap();
        assert!(el.get("text").is_none(), "the text field is removed");
        let (ids, mask) = (vector(&el, "input_ids"), vector(&el, "attention_mask"));
        if ids != case.ids || mask != case.mask {
            failures.push(format!(
                "line {} ({}, special={}) {:?}:\n  python ids {:?} mask {:?}\n  granary ids {:?} mask {:?}",
                n + 1,
                case.tokenizer,
                case.add_special_tokens,
                case.text.chars().take(60).collect::<String>(),
                case.ids,
                case.mask,
                ids,
                mask
            ));
        }
    }
    assert_eq!(ops.len(), 6, "three tokenizers, with and without special tokens");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn utf8_bytes_tokenize_like_text() {
    let ctx = local_ctx();
    let mut rng = SeededRng::for_element(0, 0, 0, 0);
    for case in cases().iter().filter(|c| c.tokenizer == "bytelevel.json" && c.add_special_tokens) {
        let cfg = Tokenize {
            tokenizer: case.tokenizer.clone(),
            field: "body".to_string(),
            add_special_tokens: true,
        };
        let op = TokenizeOp::new(&cfg, &ctx).unwrap();
        let mut el = Element::new("file.txt");
        el.set("body", Value::Bytes(case.text.clone().into_bytes().into()));
        op.apply(&mut el, &mut rng).unwrap();
        assert_eq!(vector(&el, "input_ids"), case.ids, "{:?}", case.text);
        assert_eq!(vector(&el, "attention_mask"), case.mask);
    }
}

#[test]
fn fixture_covers_the_promised_kinds_of_text() {
    let texts: Vec<String> = cases().into_iter().map(|c| c.text).collect();
    let mut distinct = texts.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 40, "{} distinct texts", distinct.len());
    assert!(texts.iter().any(|t| t.is_empty()), "empty string");
    assert!(texts.iter().any(|t| t.split_whitespace().count() > 300), "long text");
    assert!(texts.iter().any(|t| t.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))), "CJK");
    assert!(texts.iter().any(|t| t.chars().any(|c| c >= '\u{1f300}')), "emoji");
    assert!(texts.iter().any(|t| t.contains('é')), "accents");
    assert!(texts.iter().any(|t| t.contains("   ")), "whitespace runs");
    // The padded tokenizer pads to 24 with mask 0, and truncates longer texts.
    let padded: Vec<Case> = cases().into_iter().filter(|c| c.tokenizer == "wordpiece_padded.json").collect();
    assert!(padded.iter().all(|c| c.ids.len() == 24));
    assert!(padded.iter().any(|c| c.mask.contains(&0)));
    assert!(padded.iter().any(|c| !c.mask.contains(&0)));
}
