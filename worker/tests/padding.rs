//! `text.truncate` with `spec.batch.pad`: texts of different lengths, tokenized, cut and batched
//! by the in-process engine, with split tails of different widths merged.

use granary_worker::{Batch, Engine, EngineError, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::HashMap;
use std::path::Path;

/// Two splits of 5 texts each (1 to 12 one-letter words, one token each plus `[CLS]` and
/// `[SEP]`), so each leaves a tail of 1 with batches of 4.
fn dataset(name: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let store = granary_worker::store::memory_store(name);
    for (file, lengths) in [("a.jsonl", [3, 1, 12, 2, 1]), ("b.jsonl", [1, 2, 1, 1, 7])] {
        let lines: String = lengths
            .iter()
            .map(|&n| {
                let words: Vec<String> = (0..n).map(|i| char::from(b'a' + i as u8).to_string()).collect();
                format!("{{\"text\": \"{}\"}}\n", words.join(" "))
            })
            .collect();
        rt.block_on(store.put(&StorePath::from(format!("text/{file}")), lines.into_bytes().into())).unwrap();
    }
}

fn batches(name: &str, stages: &str, batch: &str) -> Result<Vec<Batch>, EngineError> {
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/wordpiece.json");
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: {name}}}
spec:
  source: {{url: "memory://{name}/text/", format: jsonl}}
  stages:
    - {{op: table.select, columns: [text]}}
    - {{op: text.tokenize, tokenizer: "{}"}}
{stages}
  batch: {batch}
"#,
        tokenizer.display()
    );
    let manifest = granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap();
    let options = EngineOptions { threads: 2, prefetch_bytes: 1 << 20, ..Default::default() };
    let engine = Engine::open(&manifest, options).unwrap();
    engine.run_epoch(0).collect()
}

fn i64s(batch: &Batch, name: &str) -> Vec<i64> {
    bytemuck::pod_collect_to_vec::<u8, i64>(&batch.tensor(name).unwrap().data)
}

#[test]
fn truncate_and_pad_give_each_batch_its_own_width_and_a_mask() {
    dataset("padding-engine");
    // The reference: every element alone, uncut.
    let alone = batches("padding-engine", "", "{size: 1}").unwrap();
    let tokens: HashMap<String, Vec<i64>> =
        alone.iter().map(|b| (b.keys[0].clone(), i64s(b, "input_ids"))).collect();
    assert_eq!(tokens.len(), 10);
    assert!(tokens.values().any(|t| t.len() > 8), "some text is longer than the cut");

    let padded = batches(
        "padding-engine",
        "    - {op: text.truncate, length: 8}",
        "{size: 4, pad: {fields: [input_ids, attention_mask], multipleOf: 4, value: 7}}",
    )
    .unwrap();
    assert_eq!(padded.iter().map(Batch::len).collect::<Vec<_>>(), vec![4, 4, 2]);
    let mut widths = Vec::new();
    for batch in &padded {
        let ids = batch.tensor("input_ids").unwrap();
        let (rows, width) = (ids.shape[0], ids.shape[1]);
        assert_eq!(batch.tensor("attention_mask").unwrap().shape, vec![rows, width]);
        let mask = batch.tensor("input_ids_mask").unwrap();
        assert_eq!((mask.dtype.name(), mask.shape.clone()), ("uint8", vec![rows, width]));
        assert_eq!(width % 4, 0);
        let ids = i64s(batch, "input_ids");
        let attention = i64s(batch, "attention_mask");
        let mut longest = 0;
        for (r, key) in batch.keys.iter().enumerate() {
            let want: Vec<i64> = tokens[key].iter().copied().take(8).collect();
            let n = want.len();
            longest = longest.max(n);
            let row = &ids[r * width..(r + 1) * width];
            assert_eq!(&row[..n], &want[..], "{key}");
            assert!(row[n..].iter().all(|&v| v == 7), "{key}: {row:?}");
            let m = &mask.data[r * width..(r + 1) * width];
            assert!(m[..n].iter().all(|&v| v == 1) && m[n..].iter().all(|&v| v == 0), "{key}: {m:?}");
            assert!(attention[r * width..r * width + n].iter().all(|&v| v == 1));
            assert!(attention[r * width + n..(r + 1) * width].iter().all(|&v| v == 7));
        }
        // One split's batch is as wide as its longest element, rounded up to 4.
        if batch.origin.is_some() {
            assert_eq!(width, longest.div_ceil(4) * 4, "{:?}", batch.keys);
        }
        assert!(width >= longest && width <= 8);
        widths.push(width);
    }
    // Batches of one split differ in width: each pads to its own longest element.
    // Split `b`'s full batch is short (4); the tails of `a` (4) and `b` (8) merge at 8.
    assert_eq!(widths, vec![8, 4, 8]);
}

#[test]
fn unequal_lengths_without_pad_suggest_it() {
    dataset("padding-refused");
    let err = batches("padding-refused", "    - {op: text.truncate, length: 8}", "{size: 4}").unwrap_err();
    assert!(err.to_string().contains("spec.batch.pad"), "{err}");
}
