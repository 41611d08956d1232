//! Conversions of JSON values into element fields (Arrow's are in [`super::columns`]).

use crate::element::{Element, FieldName, Value};
use crate::tensor::{Tensor, TensorData};
use smallvec::smallvec;

/// Converts one JSON value; `None` for null (the field is left out).
pub fn from_json(value: &serde_json::Value) -> Option<Value> {
    use serde_json::Value as J;
    Some(match value {
        J::Null => return None,
        J::Bool(b) => Value::Tensor(Tensor { shape: vec![], data: TensorData::U8(smallvec![u8::from(*b)]) }),
        J::Number(n) => match n.as_i64() {
            Some(i) => Value::Tensor(Tensor::scalar_i64(i)),
            None => Value::Tensor(Tensor::scalar_f64(n.as_f64().unwrap_or(f64::NAN))),
        },
        J::String(s) => Value::Text(s.clone()),
        J::Array(items) if !items.is_empty() && items.iter().all(|v| v.is_i64()) => {
            let v: smallvec::SmallVec<_> = items.iter().filter_map(|v| v.as_i64()).collect();
            Value::Tensor(Tensor { shape: vec![v.len()], data: TensorData::I64(v) })
        }
        J::Array(items) if !items.is_empty() && items.iter().all(|v| v.is_number()) => {
            let v: smallvec::SmallVec<_> = items.iter().filter_map(|v| v.as_f64()).collect();
            Value::Tensor(Tensor { shape: vec![v.len()], data: TensorData::F64(v) })
        }
        other => Value::Text(other.to_string()),
    })
}

/// Fills `element` with the fields of a JSON object.
pub fn json_object_into(element: &mut Element, object: &serde_json::Map<String, serde_json::Value>) {
    for (name, value) in object {
        if let Some(v) = from_json(value) {
            element.fields.push((FieldName::from(name.as_str()), v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_json_values() {
        let v: serde_json::Value =
            serde_json::json!({"a": 1, "b": 2.5, "c": "x", "d": [1, 2], "e": [1, 2.5], "f": null, "g": true});
        let mut e = Element::new("k");
        json_object_into(&mut e, v.as_object().unwrap());
        assert_eq!(e.get("a"), Some(&Value::Tensor(Tensor::scalar_i64(1))));
        assert_eq!(e.get("c"), Some(&Value::Text("x".into())));
        assert!(
            matches!(e.get("d"), Some(Value::Tensor(t)) if t.shape == vec![2] && matches!(t.data, TensorData::I64(_)))
        );
        assert!(matches!(e.get("e"), Some(Value::Tensor(t)) if matches!(t.data, TensorData::F64(_))));
        assert!(e.get("f").is_none());
    }
}
