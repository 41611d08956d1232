//! `text.truncate_pad`: cuts or pads token sequences to a fixed length.

use super::tokenize::{ATTENTION_MASK, INPUT_IDS, field_names};
use crate::element::{Element, Value};
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{Tensor, TensorData};
use granary_crds::ops::TruncatePad;
use smallvec::smallvec;

/// Name of the optional segment-id field, padded with 0 like the mask.
pub const TOKEN_TYPE_IDS: &str = "token_type_ids";

/// Cuts `input_ids`, `attention_mask` and (when present) `token_type_ids` to `length` tokens,
/// or pads them to it: ids with `pad_id`, the mask and token types with 0. An element without
/// `attention_mask` gets one (1 for each original token, 0 for padding).
pub struct TruncatePadOp {
    length: usize,
    pad_id: i64,
}

impl TruncatePadOp {
    /// The operator for one `text.truncate_pad` stage.
    pub fn new(cfg: &TruncatePad) -> TruncatePadOp {
        TruncatePadOp { length: cfg.length as usize, pad_id: cfg.pad_id }
    }
}

/// Length of a 1-D integer tensor field, or an error naming the problem.
fn seq_len(element: &Element, name: &str) -> Result<Option<usize>, OpError> {
    match element.get(name) {
        None => Ok(None),
        Some(Value::Tensor(t))
            if t.shape.len() == 1 && matches!(t.data, TensorData::I64(_) | TensorData::I32(_)) =>
        {
            Ok(Some(t.len()))
        }
        Some(Value::Tensor(t)) => Err(OpError::new(format!(
            "text.truncate_pad: field `{name}` of element `{}` is a {} tensor of shape {:?}; it \
             must be a 1-D int64 or int32 tensor as `text.tokenize` produces",
            element.key,
            t.dtype().name(),
            t.shape
        ))),
        Some(other) => Err(OpError::new(format!(
            "text.truncate_pad: field `{name}` of element `{}` is {}, not a tensor; add \
             `text.tokenize` before `text.truncate_pad`",
            element.key,
            other.kind()
        ))),
    }
}

/// Cuts or pads `t` (1-D, int64 or int32) to `length` with `pad`.
fn fit(t: &mut Tensor, length: usize, pad: i64, key: &str, name: &str) -> Result<(), OpError> {
    match &mut t.data {
        TensorData::I64(v) => v.resize(length, pad),
        TensorData::I32(v) => {
            let pad = i32::try_from(pad).map_err(|_| {
                OpError::new(format!(
                    "text.truncate_pad: padId {pad} does not fit the int32 field `{name}` of \
                     element `{key}`; use a padId below 2^31"
                ))
            })?;
            v.resize(length, pad);
        }
        // `seq_len` admits only the two integer types.
        _ => {
            return Err(OpError::new(format!(
                "text.truncate_pad: field `{name}` of element `{key}` must be int64 or int32"
            )));
        }
    }
    t.shape = vec![length];
    Ok(())
}

impl Operator for TruncatePadOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        let Some(n) = seq_len(element, INPUT_IDS)? else {
            return Err(OpError::new(format!(
                "text.truncate_pad: element `{}` has no field `{INPUT_IDS}` (its fields: {}); \
                 add `text.tokenize` before `text.truncate_pad`",
                element.key,
                field_names(element)
            )));
        };
        if let Some(Value::Tensor(Tensor { data: TensorData::I32(_), .. })) = element.get(INPUT_IDS)
            && i32::try_from(self.pad_id).is_err()
        {
            return Err(OpError::new(format!(
                "text.truncate_pad: padId {} does not fit the int32 field `{INPUT_IDS}` of \
                 element `{}`; use a padId below 2^31",
                self.pad_id, element.key
            )));
        }
        let mask_len = seq_len(element, ATTENTION_MASK)?;
        let types_len = seq_len(element, TOKEN_TYPE_IDS)?;
        for (name, len) in [(ATTENTION_MASK, mask_len), (TOKEN_TYPE_IDS, types_len)] {
            if let Some(len) = len
                && len != n
            {
                return Err(OpError::new(format!(
                    "text.truncate_pad: element `{}` has {n} `{INPUT_IDS}` but {len} `{name}`; \
                     both must come from the same `text.tokenize` stage",
                    element.key
                )));
            }
        }
        if mask_len.is_none() {
            let mask = Tensor { shape: vec![n], data: TensorData::I64(smallvec![1; n]) };
            element.set(ATTENTION_MASK, Value::Tensor(mask));
        }
        let key = element.key.clone();
        for (name, pad) in [(INPUT_IDS, self.pad_id), (ATTENTION_MASK, 0), (TOKEN_TYPE_IDS, 0)] {
            if let Some(Value::Tensor(t)) = element.get_mut(name) {
                fit(t, self.length, pad, &key, name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(length: u32, pad_id: i64) -> TruncatePadOp {
        TruncatePadOp::new(&TruncatePad { length, pad_id })
    }

    fn vec_field(v: &[i64]) -> Value {
        Value::Tensor(Tensor { shape: vec![v.len()], data: TensorData::I64(v.to_vec().into()) })
    }

    fn get(el: &Element, name: &str) -> Vec<i64> {
        match el.get(name) {
            Some(Value::Tensor(Tensor { data: TensorData::I64(v), shape })) => {
                assert_eq!(shape, &vec![v.len()]);
                v.to_vec()
            }
            other => panic!("{name}: {other:?}"),
        }
    }

    fn element(ids: &[i64], mask: &[i64]) -> Element {
        let mut el = Element::new("e");
        el.set(INPUT_IDS, vec_field(ids));
        el.set(ATTENTION_MASK, vec_field(mask));
        el
    }

    fn rng() -> SeededRng {
        SeededRng::for_element(0, 0, 0, 0)
    }

    #[test]
    fn pads_ids_with_pad_id_and_masks_with_zero() {
        let mut el = element(&[2, 7, 3], &[1, 1, 1]);
        el.set(TOKEN_TYPE_IDS, vec_field(&[0, 0, 0]));
        op(6, 9).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(get(&el, INPUT_IDS), vec![2, 7, 3, 9, 9, 9]);
        assert_eq!(get(&el, ATTENTION_MASK), vec![1, 1, 1, 0, 0, 0]);
        assert_eq!(get(&el, TOKEN_TYPE_IDS), vec![0; 6]);
    }

    #[test]
    fn truncates_and_keeps_exact_lengths() {
        let mut el = element(&[2, 7, 8, 9, 3], &[1, 1, 1, 1, 1]);
        op(3, 0).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(get(&el, INPUT_IDS), vec![2, 7, 8]);
        assert_eq!(get(&el, ATTENTION_MASK), vec![1, 1, 1]);
        let mut el = element(&[2, 3], &[1, 1]);
        op(2, 0).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(get(&el, INPUT_IDS), vec![2, 3]);
        let mut el = element(&[], &[]);
        op(2, 5).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(get(&el, INPUT_IDS), vec![5, 5]);
        assert_eq!(get(&el, ATTENTION_MASK), vec![0, 0]);
    }

    #[test]
    fn creates_a_missing_mask_and_handles_int32() {
        let mut el = Element::new("e");
        el.set(INPUT_IDS, Value::Tensor(Tensor { shape: vec![2], data: TensorData::I32(smallvec![4, 5]) }));
        op(4, 1).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(
            el.get(INPUT_IDS),
            Some(&Value::Tensor(Tensor { shape: vec![4], data: TensorData::I32(smallvec![4, 5, 1, 1]) }))
        );
        assert_eq!(get(&el, ATTENTION_MASK), vec![1, 1, 0, 0]);
    }

    #[test]
    fn errors_name_the_problem() {
        let mut el = Element::new("k");
        el.set("text", Value::Text("hi".into()));
        let e = op(4, 0).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("add `text.tokenize` before `text.truncate_pad`"), "{e}");
        assert!(e.0.contains("`text`"), "{e}");

        let mut el = element(&[1, 2, 3], &[1, 1]);
        let e = op(4, 0).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("3 `input_ids` but 2 `attention_mask`"), "{e}");

        let mut el = Element::new("k");
        el.set(INPUT_IDS, Value::Tensor(Tensor::scalar_f64(1.0)));
        let e = op(4, 0).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("1-D int64"), "{e}");

        let mut el = Element::new("k");
        el.set(INPUT_IDS, Value::Tensor(Tensor { shape: vec![1], data: TensorData::I32(smallvec![4]) }));
        let e = op(4, 1 << 40).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("does not fit the int32"), "{e}");
    }
}
