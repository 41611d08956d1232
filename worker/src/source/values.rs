//! Conversions of record values (JSON, Arrow) into element fields.

use crate::element::{Element, FieldName, Value};
use crate::tensor::{Tensor, TensorData};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
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

fn scalar<A: smallvec::Array>(v: A::Item, wrap: fn(smallvec::SmallVec<A>) -> TensorData) -> Value {
    let mut data = smallvec::SmallVec::new();
    data.push(v);
    Value::Tensor(Tensor { shape: vec![], data: wrap(data) })
}

/// Converts row `row` of an Arrow column; `None` for null.
pub fn from_arrow(array: &ArrayRef, row: usize) -> Result<Option<Value>, String> {
    if array.is_null(row) {
        return Ok(None);
    }
    Ok(Some(match array.data_type() {
        DataType::Boolean => scalar(u8::from(array.as_boolean().value(row)), TensorData::U8),
        DataType::Int8 => scalar(i32::from(array.as_primitive::<Int8Type>().value(row)), TensorData::I32),
        DataType::Int16 => scalar(i32::from(array.as_primitive::<Int16Type>().value(row)), TensorData::I32),
        DataType::Int32 => scalar(array.as_primitive::<Int32Type>().value(row), TensorData::I32),
        DataType::Int64 => scalar(array.as_primitive::<Int64Type>().value(row), TensorData::I64),
        DataType::UInt8 => scalar(array.as_primitive::<UInt8Type>().value(row), TensorData::U8),
        DataType::UInt16 => scalar(i32::from(array.as_primitive::<UInt16Type>().value(row)), TensorData::I32),
        DataType::UInt32 => scalar(i64::from(array.as_primitive::<UInt32Type>().value(row)), TensorData::I64),
        DataType::UInt64 => {
            let v = array.as_primitive::<UInt64Type>().value(row);
            let v = i64::try_from(v).map_err(|_| format!("value {v} does not fit int64"))?;
            scalar(v, TensorData::I64)
        }
        DataType::Float32 => scalar(array.as_primitive::<Float32Type>().value(row), TensorData::F32),
        DataType::Float64 => scalar(array.as_primitive::<Float64Type>().value(row), TensorData::F64),
        DataType::Utf8 => Value::Text(array.as_string::<i32>().value(row).to_string()),
        DataType::LargeUtf8 => Value::Text(array.as_string::<i64>().value(row).to_string()),
        DataType::Utf8View => Value::Text(array.as_string_view().value(row).to_string()),
        DataType::Binary => Value::Bytes(bytes::Bytes::copy_from_slice(array.as_binary::<i32>().value(row))),
        DataType::LargeBinary => {
            Value::Bytes(bytes::Bytes::copy_from_slice(array.as_binary::<i64>().value(row)))
        }
        DataType::List(_) => list_value(&array.as_list::<i32>().value(row))?,
        DataType::LargeList(_) => list_value(&array.as_list::<i64>().value(row))?,
        DataType::FixedSizeList(_, _) => list_value(&array.as_fixed_size_list().value(row))?,
        other => {
            let formatter = arrow_cast::display::ArrayFormatter::try_new(array.as_ref(), &Default::default())
                .map_err(|e| format!("cannot read a {other} value: {e}"))?;
            Value::Text(formatter.value(row).to_string())
        }
    }))
}

/// A list of numbers becomes a 1-D tensor (int64 for integers, float64 otherwise).
fn list_value(values: &ArrayRef) -> Result<Value, String> {
    let t = values.data_type();
    let (target, wrap): (DataType, fn(&ArrayRef) -> TensorData) = if t.is_integer() {
        (DataType::Int64, |a| {
            TensorData::I64(a.as_primitive::<Int64Type>().values().iter().copied().collect())
        })
    } else if t.is_floating() {
        (DataType::Float64, |a| {
            TensorData::F64(a.as_primitive::<Float64Type>().values().iter().copied().collect())
        })
    } else {
        return Err(format!("lists of {t} are not supported; only lists of numbers become tensors"));
    };
    if values.null_count() > 0 {
        return Err("a list holds nulls; fill them before reading".to_string());
    }
    let cast = arrow_cast::cast(values, &target).map_err(|e| e.to_string())?;
    Ok(Value::Tensor(Tensor { shape: vec![cast.len()], data: wrap(&cast) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int64Array, StringArray};
    use std::sync::Arc;

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

    #[test]
    fn converts_arrow_values() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(4), None]));
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.5]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert_eq!(from_arrow(&ints, 0).unwrap(), Some(Value::Tensor(Tensor::scalar_i64(4))));
        assert_eq!(from_arrow(&ints, 1).unwrap(), None);
        assert_eq!(from_arrow(&floats, 0).unwrap(), Some(Value::Tensor(Tensor::scalar_f64(1.5))));
        assert_eq!(from_arrow(&strings, 0).unwrap(), Some(Value::Text("a".into())));
    }
}
