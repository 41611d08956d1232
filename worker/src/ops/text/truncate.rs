//! `text.truncate`: cuts token sequences to at most a length, without padding.

use super::tokenize::field_names;
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::TensorData;
use granary_crds::ops::Truncate;

/// Cuts each listed field (a 1-D int64 or int32 tensor) to at most `length` values; shorter
/// ones keep their length, so batches of them need `spec.batch.pad`.
pub struct TruncateOp {
    length: usize,
    fields: Vec<String>,
}

impl TruncateOp {
    /// The operator for one `text.truncate` stage.
    pub fn new(cfg: &Truncate) -> TruncateOp {
        TruncateOp { length: cfg.length as usize, fields: cfg.fields.clone() }
    }
}

impl Operator for TruncateOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let mut missing = None;
        let key = element.key.clone();
        for name in &self.fields {
            match element.get_mut(name) {
                Some(Value::Tensor(t)) if t.shape.len() == 1 => {
                    match &mut t.data {
                        TensorData::I64(v) => v.truncate(self.length),
                        TensorData::I32(v) => v.truncate(self.length),
                        _ => {
                            return Err(OpError::new(format!(
                                "text.truncate: field `{name}` of element `{}` is a {} tensor; \
                                 it must be a 1-D int64 or int32 tensor as `text.tokenize` produces",
                                key,
                                t.dtype().name()
                            )));
                        }
                    }
                    t.shape[0] = t.shape[0].min(self.length);
                }
                Some(Value::Tensor(t)) => {
                    return Err(OpError::new(format!(
                        "text.truncate: field `{name}` of element `{}` has shape {:?}; it must be \
                         a 1-D tensor as `text.tokenize` produces",
                        key, t.shape
                    )));
                }
                Some(other) => {
                    return Err(OpError::new(format!(
                        "text.truncate: field `{name}` of element `{}` is {}, not a tensor; add \
                         `text.tokenize` before `text.truncate`",
                        key,
                        other.kind()
                    )));
                }
                None => {
                    missing = Some(name);
                    break;
                }
            }
        }
        if let Some(name) = missing {
            return Err(OpError::new(format!(
                "text.truncate: element `{}` has no field `{name}` (its fields: {}); list the \
                 token fields in `fields`, or add `text.tokenize` before `text.truncate`",
                element.key,
                field_names(element)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use smallvec::smallvec;

    fn op(length: u32, fields: &[&str]) -> TruncateOp {
        TruncateOp::new(&Truncate { length, fields: fields.iter().map(|f| f.to_string()).collect() })
    }

    fn ids(v: &[i64]) -> Value {
        Value::Tensor(Tensor { shape: vec![v.len()], data: TensorData::I64(v.to_vec().into()) })
    }

    fn rng() -> SeededRng {
        SeededRng::for_element(0, 0, 0, 0)
    }

    fn element(n: i64) -> Element {
        let mut el = Element::new("e");
        el.set("input_ids", ids(&(0..n).collect::<Vec<_>>()));
        el.set("attention_mask", ids(&vec![1; n as usize]));
        el
    }

    #[test]
    fn cuts_long_sequences_and_keeps_short_ones() {
        let truncate = op(3, &["input_ids", "attention_mask"]);
        let mut long = element(5);
        truncate.apply(&mut long, &mut rng()).unwrap();
        assert_eq!(long.get("input_ids"), Some(&ids(&[0, 1, 2])));
        assert_eq!(long.get("attention_mask"), Some(&ids(&[1, 1, 1])));
        let mut short = element(2);
        truncate.apply(&mut short, &mut rng()).unwrap();
        assert_eq!(short.get("input_ids"), Some(&ids(&[0, 1])));
        let mut int32 = Element::new("e");
        int32
            .set("t", Value::Tensor(Tensor { shape: vec![4], data: TensorData::I32(smallvec![1, 2, 3, 4]) }));
        op(2, &["t"]).apply(&mut int32, &mut rng()).unwrap();
        assert_eq!(
            int32.get("t"),
            Some(&Value::Tensor(Tensor { shape: vec![2], data: TensorData::I32(smallvec![1, 2]) }))
        );
    }

    #[test]
    fn leaves_unlisted_fields_alone() {
        let mut el = element(5);
        op(2, &["input_ids"]).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(el.get("input_ids"), Some(&ids(&[0, 1])));
        assert_eq!(el.get("attention_mask"), Some(&ids(&[1; 5])));
    }

    #[test]
    fn errors_name_the_field() {
        let mut el = Element::new("k");
        el.set("text", Value::Text("hi".into()));
        let e = op(2, &["input_ids"]).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("no field `input_ids`") && e.0.contains("`text`"), "{e}");
        let e = op(2, &["text"]).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("add `text.tokenize` before `text.truncate`"), "{e}");
        let mut el = Element::new("k");
        el.set("x", Value::Tensor(Tensor { shape: vec![1, 1], data: TensorData::I64(smallvec![1]) }));
        let e = op(2, &["x"]).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("1-D"), "{e}");
        el.set("x", Value::Tensor(Tensor { shape: vec![1], data: TensorData::F32(smallvec![1.0]) }));
        let e = op(2, &["x"]).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("float32"), "{e}");
    }
}
