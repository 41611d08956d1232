//! `text.tokenize` → `text.truncate_pad` fused into one operator.
//!
//! The two stages one after the other encode the whole text, allocate its ids and mask, then
//! cut or grow both to `length`. Fused, the text is encoded only as far as the cut (on the
//! tokenizer's fast path, when its model cannot fail on a word, the words past the cut are not
//! looked up at all) and the ids and mask are written once, already `length` long. The output
//! is the same, byte for byte: the rule the optimizer states, and the test below checks on every
//! length around the texts' own.

use super::tokenize::{ATTENTION_MASK, INPUT_IDS, TokenizeOp};
use super::truncate_pad::{TOKEN_TYPE_IDS, TruncatePadOp};
use crate::element::{Element, Value};
use crate::ops::{BuildContext, BuildError, OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{SmallVec, Tensor, TensorData};
use granary_crds::OpConfig;

/// Tokenization and truncation/padding to a fixed length in one pass.
pub struct TokenizePadOp {
    tokenize: TokenizeOp,
    /// The stages one after the other, for the rare element that already has
    /// `token_type_ids` (which `text.truncate_pad` checks against the new ids).
    pad: TruncatePadOp,
    length: usize,
    pad_id: i64,
}

/// How many stages at the start of `configs` [`TokenizePadOp::fuse`] takes: 2 for a
/// `text.tokenize` followed by a `text.truncate_pad`, unless `keep_cuts` says that a cache may cut
/// between the two (both are deterministic).
pub fn fusable(configs: &[OpConfig], keep_cuts: bool) -> Option<usize> {
    match configs {
        [OpConfig::TextTokenize(_), OpConfig::TextTruncatePad(_), ..] if !keep_cuts => Some(2),
        _ => None,
    }
}

impl TokenizePadOp {
    /// The fused operator for the stages at the start of `configs`, with how many it takes, when
    /// [`fusable`] says so; building it reads the tokenizer through `ctx`.
    pub fn fuse(
        configs: &[OpConfig],
        ctx: &BuildContext,
        keep_cuts: bool,
    ) -> Option<Result<(TokenizePadOp, usize), BuildError>> {
        let used = fusable(configs, keep_cuts)?;
        let [OpConfig::TextTokenize(tokenize), OpConfig::TextTruncatePad(pad), ..] = configs else {
            return None;
        };
        Some(TokenizeOp::new(tokenize, ctx).map(|op| {
            let fused = TokenizePadOp {
                tokenize: op,
                pad: TruncatePadOp::new(pad),
                length: pad.length as usize,
                pad_id: pad.pad_id,
            };
            (fused, used)
        }))
    }
}

impl Operator for TokenizePadOp {
    fn apply(&self, element: &mut Element, rng: &mut SeededRng) -> Result<(), OpError> {
        if element.get(TOKEN_TYPE_IDS).is_some() {
            self.tokenize.apply(element, rng)?;
            return self.pad.apply(element, rng);
        }
        let text = self.tokenize.text_of(element)?;
        let (mut ids, mut mask) = self
            .tokenize
            .encode_at_most(text, self.length)
            .map_err(|e| self.tokenize.encode_error(element, &e))?;
        ids.resize(self.length, self.pad_id);
        mask.resize(self.length, 0);
        element.take(self.tokenize.field());
        let vector = |values: Vec<i64>| {
            Value::Tensor(Tensor {
                shape: vec![values.len()],
                data: TensorData::I64(SmallVec::from_vec(values)),
            })
        };
        element.set(INPUT_IDS, vector(ids));
        element.set(ATTENTION_MASK, vector(mask));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::build;
    use bytes::Bytes;
    use granary_crds::ops::{Tokenize, TruncatePad};
    use smallvec::smallvec;
    use std::path::PathBuf;

    fn ctx() -> BuildContext {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        let dir = base.clone();
        BuildContext {
            base_dir: base,
            read: Box::new(move |p| std::fs::read(dir.join(p)).map_err(|e| BuildError(format!("{p}: {e}")))),
            python: None,
        }
    }

    fn configs(tokenizer: &str, length: u32, pad_id: i64) -> Vec<OpConfig> {
        vec![
            OpConfig::TextTokenize(Tokenize {
                tokenizer: tokenizer.to_string(),
                field: "text".to_string(),
                add_special_tokens: true,
            }),
            OpConfig::TextTruncatePad(TruncatePad { length, pad_id }),
        ]
    }

    /// Texts of every length around the cuts tested, ASCII (the fast path) and not (the general
    /// path), with punctuation, case and added tokens' contents.
    fn texts() -> Vec<Value> {
        let words = "The quick brown fox, jumping over 12 lazy dogs; UNBELIEVABLY quickly! [CLS] naïve café \
                     antidisestablishmentarianism e.g. x-ray";
        let mut out: Vec<Value> = (0..words.len())
            .step_by(7)
            .map(|end| Value::Text(words.get(..end).unwrap_or(words).to_string()))
            .collect();
        out.push(Value::Text(String::new()));
        out.push(Value::Bytes(Bytes::from_static(b"bytes that are utf-8 text")));
        out
    }

    #[test]
    fn fused_output_is_the_stages_output_byte_for_byte() {
        let ctx = ctx();
        for tokenizer in ["wordpiece.json", "bytelevel.json"] {
            for length in [1, 2, 3, 5, 8, 13, 40] {
                for pad_id in [0, 7] {
                    let configs = configs(tokenizer, length, pad_id);
                    let (fused, used) = TokenizePadOp::fuse(&configs, &ctx, false).unwrap().unwrap();
                    assert_eq!(used, 2);
                    let tokenize = build(&configs[0], &ctx).unwrap();
                    let pad = build(&configs[1], &ctx).unwrap();
                    for (i, text) in texts().into_iter().enumerate() {
                        let mut a = Element::new(format!("e{i}"));
                        a.set("label", Value::Tensor(Tensor::scalar_i64(i as i64)));
                        a.set("text", text.clone());
                        let mut b = a.clone();
                        let mut rng = SeededRng::for_element(0, 0, 0, i as u64);
                        fused.apply(&mut a, &mut rng).unwrap();
                        tokenize.apply(&mut b, &mut rng).unwrap();
                        pad.apply(&mut b, &mut rng).unwrap();
                        assert_eq!(a, b, "{tokenizer}, length {length}, pad {pad_id}, text {text:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_element_with_token_types_and_bad_fields_behave_as_the_stages_do() {
        let ctx = ctx();
        let configs = configs("wordpiece.json", 6, 0);
        let (fused, _) = TokenizePadOp::fuse(&configs, &ctx, false).unwrap().unwrap();
        let mut rng = SeededRng::for_element(0, 0, 0, 0);
        let mut el = Element::new("k");
        el.set("text", Value::Text("hello world".into()));
        el.set(TOKEN_TYPE_IDS, Value::Tensor(Tensor { shape: vec![1], data: TensorData::I64(smallvec![0]) }));
        let e = fused.apply(&mut el, &mut rng).unwrap_err();
        assert!(e.0.contains("`token_type_ids`"), "{e}");

        let mut el = Element::new("k2");
        el.set("caption", Value::Text("x".into()));
        let e = fused.apply(&mut el, &mut rng).unwrap_err();
        assert!(e.0.contains("no field `text`") && e.0.contains("`caption`"), "{e}");
    }

    #[test]
    fn a_cache_that_may_cut_between_the_stages_keeps_them_apart() {
        let configs = configs("wordpiece.json", 6, 0);
        assert_eq!(fusable(&configs, false), Some(2));
        assert_eq!(fusable(&configs, true), None);
        assert_eq!(fusable(&configs[..1], false), None);
        assert!(TokenizePadOp::fuse(&configs, &ctx(), true).is_none());
    }
}
