//! Arrow columns read row by row into element fields.
//!
//! A record batch's column is resolved to its concrete array once ([`Column::of`]), so that each
//! of its cells costs an index and a small conversion, not a dynamic type check, a downcast and
//! a virtual null check per cell (a Parquet table's rows are read at several hundred thousand
//! per second per reader thread).

use crate::element::Value;
use crate::tensor::{Tensor, TensorData};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use smallvec::smallvec;

/// Reads one non-null cell of a column.
type Read<'a> = Box<dyn Fn(usize) -> Result<Value, String> + 'a>;

/// One column of a record batch, resolved for reading its rows.
pub struct Column<'a> {
    array: &'a dyn Array,
    /// Whether any cell is null (else none is looked up).
    nulls: bool,
    read: Read<'a>,
}

impl<'a> Column<'a> {
    /// Resolves `array`. Numbers become scalars (`int8`, `int16`, `uint16` widen to `int32`,
    /// `uint32` to `int64`, `bool` to `uint8`), strings text, binaries bytes, lists of numbers
    /// 1-D tensors; other types are read as the text Arrow displays for them.
    pub fn of(array: &'a ArrayRef) -> Column<'a> {
        let read: Read<'a> = match array.data_type() {
            DataType::Boolean => {
                let a = array.as_boolean();
                Box::new(move |r| Ok(Value::Tensor(scalar(TensorData::U8(smallvec![u8::from(a.value(r))])))))
            }
            DataType::Int8 => numbers::<Int8Type>(array, |v| TensorData::I32(smallvec![i32::from(v)])),
            DataType::Int16 => numbers::<Int16Type>(array, |v| TensorData::I32(smallvec![i32::from(v)])),
            DataType::Int32 => numbers::<Int32Type>(array, |v| TensorData::I32(smallvec![v])),
            DataType::Int64 => numbers::<Int64Type>(array, |v| TensorData::I64(smallvec![v])),
            DataType::UInt8 => numbers::<UInt8Type>(array, |v| TensorData::U8(smallvec![v])),
            DataType::UInt16 => numbers::<UInt16Type>(array, |v| TensorData::I32(smallvec![i32::from(v)])),
            DataType::UInt32 => numbers::<UInt32Type>(array, |v| TensorData::I64(smallvec![i64::from(v)])),
            DataType::UInt64 => {
                let a = array.as_primitive::<UInt64Type>();
                Box::new(move |r| {
                    let v = a.value(r);
                    let v = i64::try_from(v).map_err(|_| format!("value {v} does not fit int64"))?;
                    Ok(Value::Tensor(scalar(TensorData::I64(smallvec![v]))))
                })
            }
            DataType::Float32 => numbers::<Float32Type>(array, |v| TensorData::F32(smallvec![v])),
            DataType::Float64 => numbers::<Float64Type>(array, |v| TensorData::F64(smallvec![v])),
            DataType::Utf8 => {
                let a = array.as_string::<i32>();
                Box::new(move |r| Ok(Value::Text(a.value(r).to_string())))
            }
            DataType::LargeUtf8 => {
                let a = array.as_string::<i64>();
                Box::new(move |r| Ok(Value::Text(a.value(r).to_string())))
            }
            DataType::Utf8View => {
                let a = array.as_string_view();
                Box::new(move |r| Ok(Value::Text(a.value(r).to_string())))
            }
            DataType::Binary => {
                let a = array.as_binary::<i32>();
                Box::new(move |r| Ok(Value::Bytes(bytes::Bytes::copy_from_slice(a.value(r)))))
            }
            DataType::LargeBinary => {
                let a = array.as_binary::<i64>();
                Box::new(move |r| Ok(Value::Bytes(bytes::Bytes::copy_from_slice(a.value(r)))))
            }
            DataType::List(_) => {
                let a = array.as_list::<i32>();
                Box::new(move |r| list_value(&a.value(r)))
            }
            DataType::LargeList(_) => {
                let a = array.as_list::<i64>();
                Box::new(move |r| list_value(&a.value(r)))
            }
            DataType::FixedSizeList(_, _) => {
                let a = array.as_fixed_size_list();
                Box::new(move |r| list_value(&a.value(r)))
            }
            other => {
                let options = arrow_cast::display::FormatOptions::default();
                match arrow_cast::display::ArrayFormatter::try_new(array.as_ref(), &options) {
                    Ok(formatter) => Box::new(move |r| Ok(Value::Text(formatter.value(r).to_string()))),
                    // Said for the first non-null cell, as for any other unreadable value.
                    Err(e) => {
                        let message = format!("cannot read a {other} value: {e}");
                        Box::new(move |_| Err(message.clone()))
                    }
                }
            }
        };
        Column { array: array.as_ref(), nulls: array.null_count() > 0, read }
    }

    /// The value of row `row`; `None` for null (the field is left out).
    pub fn value(&self, row: usize) -> Result<Option<Value>, String> {
        if self.nulls && self.array.is_null(row) {
            return Ok(None);
        }
        (self.read)(row).map(Some)
    }
}

fn scalar(data: TensorData) -> Tensor {
    Tensor { shape: Vec::new(), data }
}

/// Reads a primitive column's cells as scalars made by `wrap`.
fn numbers<'a, T: ArrowPrimitiveType>(array: &'a ArrayRef, wrap: fn(T::Native) -> TensorData) -> Read<'a> {
    let a = array.as_primitive::<T>();
    Box::new(move |r| Ok(Value::Tensor(scalar(wrap(a.value(r))))))
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
    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::{
        BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array, Int8Array, Int16Array,
        Int32Array, Int64Array, LargeStringArray, StringArray, UInt8Array, UInt16Array, UInt32Array,
        UInt64Array,
    };
    use std::sync::Arc;

    /// What reading one cell gives.
    type Cell = Result<Option<Value>, String>;

    fn read(array: ArrayRef) -> Vec<Cell> {
        let column = Column::of(&array);
        (0..array.len()).map(|r| column.value(r)).collect()
    }

    fn t(data: TensorData) -> Cell {
        Ok(Some(Value::Tensor(scalar(data))))
    }

    #[test]
    fn every_type_reads_as_its_field_and_nulls_are_left_out() {
        let cases: Vec<(ArrayRef, Vec<Cell>)> = vec![
            (
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
                vec![t(TensorData::U8(smallvec![1])), Ok(None), t(TensorData::U8(smallvec![0]))],
            ),
            (Arc::new(Int8Array::from(vec![-8])), vec![t(TensorData::I32(smallvec![-8]))]),
            (Arc::new(Int16Array::from(vec![-16])), vec![t(TensorData::I32(smallvec![-16]))]),
            (
                Arc::new(Int32Array::from(vec![Some(32), None])),
                vec![t(TensorData::I32(smallvec![32])), Ok(None)],
            ),
            (
                Arc::new(Int64Array::from(vec![None, Some(4)])),
                vec![Ok(None), t(TensorData::I64(smallvec![4]))],
            ),
            (Arc::new(UInt8Array::from(vec![255])), vec![t(TensorData::U8(smallvec![255]))]),
            (Arc::new(UInt16Array::from(vec![65_535])), vec![t(TensorData::I32(smallvec![65_535]))]),
            (
                Arc::new(UInt32Array::from(vec![u32::MAX])),
                vec![t(TensorData::I64(smallvec![i64::from(u32::MAX)]))],
            ),
            (
                Arc::new(UInt64Array::from(vec![7, u64::MAX])),
                vec![t(TensorData::I64(smallvec![7])), Err(format!("value {} does not fit int64", u64::MAX))],
            ),
            (Arc::new(Float32Array::from(vec![0.5])), vec![t(TensorData::F32(smallvec![0.5]))]),
            (Arc::new(Float64Array::from(vec![1.5])), vec![t(TensorData::F64(smallvec![1.5]))]),
            (
                Arc::new(StringArray::from(vec![Some("a"), None])),
                vec![Ok(Some(Value::Text("a".into()))), Ok(None)],
            ),
            (Arc::new(LargeStringArray::from(vec!["b"])), vec![Ok(Some(Value::Text("b".into())))]),
            (
                Arc::new(BinaryArray::from(vec![&b"\x00\xff"[..]])),
                vec![Ok(Some(Value::Bytes(bytes::Bytes::from_static(b"\x00\xff"))))],
            ),
            // Other types read as Arrow displays them.
            (
                Arc::new(Date32Array::from(vec![Some(0), None])),
                vec![Ok(Some(Value::Text("1970-01-01".into()))), Ok(None)],
            ),
        ];
        for (array, expected) in cases {
            let what = array.data_type().clone();
            assert_eq!(read(array), expected, "{what}");
        }
    }

    #[test]
    fn lists_of_numbers_read_as_vectors_and_others_are_errors() {
        let mut ints = ListBuilder::new(Int32Builder::new());
        ints.append_value([Some(1), Some(2), Some(3)]);
        ints.append_null();
        ints.append_value([Some(4), None]);
        let read = read(Arc::new(ints.finish()));
        assert_eq!(
            read[0],
            Ok(Some(Value::Tensor(Tensor { shape: vec![3], data: TensorData::I64(smallvec![1, 2, 3]) })))
        );
        assert_eq!(read[1], Ok(None));
        assert_eq!(read[2], Err("a list holds nulls; fill them before reading".to_string()));
    }
}
