//! `text.tokenize`: encodes a text field with a Hugging Face `tokenizer.json`.

mod fast;
mod split;
mod word_cache;

use crate::element::{Element, Value};
use crate::ops::{BuildContext, BuildError, OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use fast::FastPath;
use granary_crds::ops::Tokenize;
use tokenizers::Tokenizer;

/// Name of the field holding the token ids.
pub const INPUT_IDS: &str = "input_ids";
/// Name of the field holding the attention mask.
pub const ATTENTION_MASK: &str = "attention_mask";

/// Encodes the text field into `input_ids` and `attention_mask` (int64, 1-D) and removes the
/// text field. The tokenizer's own truncation and padding settings (from `tokenizer.json`)
/// apply, exactly as `Tokenizer.encode` does in Python. ASCII text with the common tokenizer
/// layouts (BERT WordPiece, GPT-2 byte-level BPE) takes a fast path with the same ids (see
/// `tokenize/fast.rs`).
pub struct TokenizeOp {
    tokenizer: Tokenizer,
    fast: Option<FastPath>,
    field: String,
    add_special_tokens: bool,
}

impl TokenizeOp {
    /// Loads the tokenizer named by the stage through `ctx.read`.
    pub fn new(cfg: &Tokenize, ctx: &BuildContext) -> Result<TokenizeOp, BuildError> {
        let bytes = (ctx.read)(&cfg.tokenizer).map_err(|e| {
            BuildError(format!(
                "text.tokenize: cannot read tokenizer `{}`: {e}; check the `tokenizer` path \
                 (relative paths resolve from {})",
                cfg.tokenizer,
                ctx.base_dir.display()
            ))
        })?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| {
            BuildError(format!(
                "text.tokenize: `{}` is not a valid Hugging Face tokenizer.json ({e}); write it \
                 with `tokenizer.save(path)` from the Python `tokenizers` package (for a \
                 transformers fast tokenizer: `tok.backend_tokenizer.save(path)`)",
                cfg.tokenizer
            ))
        })?;
        let fast = FastPath::new(&tokenizer, &bytes, cfg.add_special_tokens);
        Ok(TokenizeOp {
            tokenizer,
            fast,
            field: cfg.field.clone(),
            add_special_tokens: cfg.add_special_tokens,
        })
    }

    /// The first `max` ids of `text` and their attention mask: the encoding cut to `max`
    /// tokens. On the fast path, words past the cut are not encoded when they cannot change it.
    pub(crate) fn encode_at_most(&self, text: &str, max: usize) -> Result<(Vec<i64>, Vec<i64>), String> {
        if let Some(fast) = &self.fast {
            let mut ids = Vec::new();
            if let Some(done) = fast.encode_at_most(&self.tokenizer, text, max, &mut ids) {
                done?;
                let mask = vec![1; ids.len()];
                return Ok((ids, mask));
            }
        }
        // Without offsets: `text.tokenize` keeps ids and the mask only, and the ids are the same.
        let enc = self.tokenizer.encode_fast(text, self.add_special_tokens).map_err(|e| e.to_string())?;
        let ids = enc.get_ids().iter().take(max).map(|&v| i64::from(v)).collect();
        let mask = enc.get_attention_mask().iter().take(max).map(|&v| i64::from(v)).collect();
        Ok((ids, mask))
    }

    /// The text `element` holds in the stage's field, or the error that names what it holds
    /// instead.
    pub(crate) fn text_of<'e>(&self, element: &'e Element) -> Result<&'e str, OpError> {
        let field = &self.field;
        match element.get(field) {
            Some(Value::Text(s)) => Ok(s.as_str()),
            Some(Value::Bytes(b)) => std::str::from_utf8(b).map_err(|e| {
                OpError::new(format!(
                    "text.tokenize: field `{field}` of element `{}` holds bytes that are not \
                     UTF-8 ({e}); tokenize only UTF-8 text files or fields",
                    element.key
                ))
            }),
            Some(other) => Err(OpError::new(format!(
                "text.tokenize: field `{field}` of element `{}` is a {}, not text; point \
                 `field` at a text field",
                element.key,
                other.kind()
            ))),
            None => Err(OpError::new(format!(
                "text.tokenize: element `{}` has no field `{field}` (its fields: {}); set \
                 `field` to the field holding the text",
                element.key,
                field_names(element)
            ))),
        }
    }

    /// The error for a text of `element` the tokenizer could not encode.
    pub(crate) fn encode_error(&self, element: &Element, e: &str) -> OpError {
        OpError::new(format!(
            "text.tokenize: cannot encode field `{}` of element `{}`: {e}",
            self.field, element.key
        ))
    }

    /// The field the stage reads (and removes).
    pub(crate) fn field(&self) -> &str {
        &self.field
    }

    /// Encodes `text` into (ids, attention mask).
    fn encode(&self, text: &str) -> Result<(Vec<i64>, Vec<i64>), String> {
        self.encode_at_most(text, usize::MAX)
    }
}

/// A 1-D int64 tensor.
fn vector(values: Vec<i64>) -> Tensor {
    Tensor { shape: vec![values.len()], data: TensorData::I64(SmallVec::from_vec(values)) }
}

/// The names of an element's fields, for messages.
pub(crate) fn field_names(element: &Element) -> String {
    if element.fields.is_empty() {
        return "(none)".to_string();
    }
    element.fields.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

impl Operator for TokenizeOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let text = self.text_of(element)?;
        let (ids, mask) = self.encode(text).map_err(|e| self.encode_error(element, &e))?;
        element.take(&self.field);
        element.set(INPUT_IDS, Value::Tensor(vector(ids)));
        element.set(ATTENTION_MASK, Value::Tensor(vector(mask)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::path::PathBuf;

    fn fixture_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
    }

    fn ctx() -> BuildContext {
        let base = fixture_dir();
        let base2 = base.clone();
        BuildContext {
            base_dir: base,
            read: Box::new(move |p| {
                std::fs::read(base2.join(p)).map_err(|e| BuildError(format!("{p}: {e}")))
            }),
            python: None,
        }
    }

    fn cfg(tokenizer: &str) -> Tokenize {
        Tokenize { tokenizer: tokenizer.to_string(), field: "text".to_string(), add_special_tokens: true }
    }

    fn rng() -> SeededRng {
        SeededRng::for_element(0, 0, 0, 0)
    }

    fn ids(el: &Element, name: &str) -> Vec<i64> {
        match el.get(name) {
            Some(Value::Tensor(Tensor { data: TensorData::I64(v), shape })) => {
                assert_eq!(shape, &vec![v.len()]);
                v.to_vec()
            }
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn text_and_utf8_bytes_encode_alike() {
        let op = TokenizeOp::new(&cfg("wordpiece.json"), &ctx()).unwrap();
        let mut a = Element::new("a");
        a.set("other", Value::Text("keep".into()));
        a.set("text", Value::Text("Hello, world!".into()));
        let mut b = Element::new("b");
        b.set("text", Value::Bytes(Bytes::from_static(b"Hello, world!")));
        op.apply(&mut a, &mut rng()).unwrap();
        op.apply(&mut b, &mut rng()).unwrap();
        assert!(a.get("text").is_none());
        assert_eq!(a.get("other"), Some(&Value::Text("keep".into())));
        assert_eq!(ids(&a, INPUT_IDS), ids(&b, INPUT_IDS));
        let n = ids(&a, INPUT_IDS).len();
        assert_eq!(ids(&a, ATTENTION_MASK), vec![1; n]);
        assert_eq!(ids(&a, INPUT_IDS)[0], 2, "[CLS] first");
    }

    #[test]
    fn missing_unreadable_and_wrong_fields_are_errors() {
        let op = TokenizeOp::new(&cfg("wordpiece.json"), &ctx()).unwrap();
        let mut el = Element::new("k1");
        el.set("caption", Value::Text("x".into()));
        let e = op.apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("no field `text`") && e.0.contains("`caption`"), "{e}");

        let mut el = Element::new("k2");
        el.set("text", Value::Bytes(Bytes::from_static(&[0xff, 0xfe])));
        let e = op.apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("not UTF-8") && e.0.contains("k2"), "{e}");
        assert!(el.get("text").is_some(), "element untouched on error");

        let mut el = Element::new("k3");
        el.set("text", Value::Tensor(Tensor::scalar_i64(1)));
        let e = op.apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("is a tensor"), "{e}");
    }

    #[test]
    fn bad_tokenizer_files_are_build_errors() {
        let e = TokenizeOp::new(&cfg("nope.json"), &ctx()).err().unwrap();
        assert!(e.0.contains("cannot read tokenizer `nope.json`"), "{e}");
        let e = TokenizeOp::new(&cfg("cases.jsonl"), &ctx()).err().unwrap();
        assert!(e.0.contains("not a valid Hugging Face tokenizer.json"), "{e}");
    }
}
