//! `table.cast`: converts numeric columns to another element type.

use crate::element::{Element, Value};
use crate::ops::text::tokenize::field_names;
use crate::ops::{OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::{DType, SmallVec, Tensor, TensorData};
use granary_crds::ops::Cast;
use smallvec::smallvec;

/// Converts each listed column to its element type. Tensors of any shape convert element by
/// element like numpy's `astype` (float to integer truncates toward zero), except that a value
/// the target type cannot hold (out of range, NaN, infinity) is an error instead of wrapping.
/// Text (or UTF-8 bytes, e.g. a WebDataset `.cls` member) holding a number becomes a scalar.
pub struct CastOp {
    columns: Vec<(String, DType)>,
}

impl CastOp {
    /// The operator for one `table.cast` stage.
    pub fn new(cfg: &Cast) -> CastOp {
        CastOp { columns: cfg.columns.iter().map(|(c, t)| (c.clone(), *t)).collect() }
    }
}

/// A value the target type cannot hold: its index in the tensor and how to print it.
struct Unfit {
    index: usize,
    value: String,
}

/// Largest integer +1 and smallest integer of each integer type, as exact `f64`s.
fn int_bounds(to: DType) -> (f64, f64) {
    match to {
        DType::Uint8 => (0.0, 256.0),
        DType::Int32 => (-2_147_483_648.0, 2_147_483_648.0),
        _ => (-9_223_372_036_854_775_808.0, 9_223_372_036_854_775_808.0),
    }
}

/// Converts integers (exactly held in `i64`) to `to`.
fn from_ints<I: Iterator<Item = i64>>(values: I, to: DType) -> Result<TensorData, Unfit> {
    fn fit<A: smallvec::Array<Item: TryFrom<i64>>>(
        values: impl Iterator<Item = i64>,
    ) -> Result<SmallVec<A>, Unfit> {
        values
            .enumerate()
            .map(|(index, v)| A::Item::try_from(v).map_err(|_| Unfit { index, value: v.to_string() }))
            .collect()
    }
    Ok(match to {
        DType::Uint8 => TensorData::U8(fit(values)?),
        DType::Int32 => TensorData::I32(fit(values)?),
        DType::Int64 => TensorData::I64(values.collect()),
        DType::Float32 => TensorData::F32(values.map(|v| v as f32).collect()),
        DType::Float64 => TensorData::F64(values.map(|v| v as f64).collect()),
    })
}

/// Converts floats (exactly held in `f64`) to `to`; to an integer type they truncate toward
/// zero.
fn from_floats<I: Iterator<Item = f64>>(values: I, to: DType) -> Result<TensorData, Unfit> {
    match to {
        DType::Float32 => return Ok(TensorData::F32(values.map(|v| v as f32).collect())),
        DType::Float64 => return Ok(TensorData::F64(values.collect())),
        DType::Uint8 | DType::Int32 | DType::Int64 => {}
    }
    let (lo, hi) = int_bounds(to);
    let ints = values.enumerate().map(|(index, v)| {
        let t = v.trunc();
        // NaN fails both comparisons.
        if t >= lo && t < hi { Ok(t as i64) } else { Err(Unfit { index, value: v.to_string() }) }
    });
    Ok(match to {
        DType::Uint8 => TensorData::U8(ints.map(|r| r.map(|v| v as u8)).collect::<Result<_, _>>()?),
        DType::Int32 => TensorData::I32(ints.map(|r| r.map(|v| v as i32)).collect::<Result<_, _>>()?),
        _ => TensorData::I64(ints.collect::<Result<_, _>>()?),
    })
}

/// Converts a tensor's values to `to` (its shape is kept by the caller). A tensor already of
/// type `to` is not passed here.
fn cast_data(data: &TensorData, to: DType) -> Result<TensorData, Unfit> {
    match data {
        TensorData::F32(v) => from_floats(v.iter().map(|&x| f64::from(x)), to),
        TensorData::F64(v) => from_floats(v.iter().copied(), to),
        TensorData::U8(v) => from_ints(v.iter().map(|&x| i64::from(x)), to),
        TensorData::I32(v) => from_ints(v.iter().map(|&x| i64::from(x)), to),
        TensorData::I64(v) => from_ints(v.iter().copied(), to),
    }
}

/// Whether every value of type `from` converts to `to`: to a float type, or to a wider integer
/// type. Such columns are converted in place once every other column has been checked.
fn widens(from: DType, to: DType) -> bool {
    matches!(to, DType::Float32 | DType::Float64)
        || matches!((from, to), (DType::Uint8, DType::Int32 | DType::Int64) | (DType::Int32, DType::Int64))
}

/// [`cast_data`] for the conversions that cannot fail ([`widens`]), with the same values; `None`
/// for the others.
fn widen(data: &TensorData, to: DType) -> Option<TensorData> {
    use TensorData::{F32, F64, I32, I64, U8};
    Some(match (data, to) {
        (U8(v), DType::Int32) => I32(v.iter().map(|&x| i32::from(x)).collect()),
        (U8(v), DType::Int64) => I64(v.iter().map(|&x| i64::from(x)).collect()),
        (U8(v), DType::Float32) => F32(v.iter().map(|&x| f32::from(x)).collect()),
        (U8(v), DType::Float64) => F64(v.iter().map(|&x| f64::from(x)).collect()),
        (I32(v), DType::Int64) => I64(v.iter().map(|&x| i64::from(x)).collect()),
        (I32(v), DType::Float32) => F32(v.iter().map(|&x| x as f32).collect()),
        (I32(v), DType::Float64) => F64(v.iter().map(|&x| f64::from(x)).collect()),
        (I64(v), DType::Float32) => F32(v.iter().map(|&x| x as f32).collect()),
        (I64(v), DType::Float64) => F64(v.iter().map(|&x| x as f64).collect()),
        (F32(v), DType::Float64) => F64(v.iter().map(|&x| f64::from(x)).collect()),
        (F64(v), DType::Float32) => F32(v.iter().map(|&x| x as f32).collect()),
        _ => return None,
    })
}

/// Parses a number written as text into the value of a scalar of type `to`.
fn parse_scalar(text: &str, to: DType) -> Option<Result<TensorData, Unfit>> {
    let s = text.trim();
    Some(match to {
        DType::Float32 => Ok(TensorData::F32(smallvec![s.parse::<f32>().ok()?])),
        DType::Float64 => Ok(TensorData::F64(smallvec![s.parse::<f64>().ok()?])),
        _ => match s.parse::<i64>() {
            Ok(v) => from_ints(std::iter::once(v), to),
            Err(_) => from_floats(std::iter::once(s.parse::<f64>().ok()?), to),
        },
    })
}

/// The range an integer type holds, for messages.
fn range_of(to: DType) -> &'static str {
    match to {
        DType::Uint8 => "0..=255",
        DType::Int32 => "-2147483648..=2147483647",
        DType::Int64 => "-9223372036854775808..=9223372036854775807",
        DType::Float32 | DType::Float64 => "any number",
    }
}

impl CastOp {
    /// `column`'s value (`value`, `None` where the element lacks it) converted to `to`: the
    /// tensor's values (its shape stays), or a scalar's for a number written as text.
    fn cast_one(
        &self,
        element: &Element,
        value: Option<&Value>,
        column: &str,
        to: DType,
    ) -> Result<TensorData, OpError> {
        let key = &element.key;
        let unfit = |u: Unfit, many: bool| {
            let at = if many { format!(" at index {}", u.index) } else { String::new() };
            OpError::new(format!(
                "table.cast: column `{column}` of element `{key}` holds {}{at}, which {} cannot \
                 hold (range {}); cast it to a wider type such as float64, or clean the data",
                u.value,
                to.name(),
                range_of(to)
            ))
        };
        let text = match value {
            None => {
                return Err(OpError::new(format!(
                    "table.cast: element `{key}` has no column `{column}` (its columns: {}); fix \
                     the column name in `columns`",
                    field_names(element)
                )));
            }
            Some(Value::Tensor(t)) => return cast_data(&t.data, to).map_err(|u| unfit(u, t.len() > 1)),
            Some(Value::Text(s)) => s.as_str(),
            Some(Value::Bytes(b)) => std::str::from_utf8(b).map_err(|_| {
                OpError::new(format!(
                    "table.cast: column `{column}` of element `{key}` holds {} bytes that are not \
                     UTF-8 text; only numeric tensors and numbers written as text can be cast",
                    b.len()
                ))
            })?,
        };
        match parse_scalar(text, to) {
            Some(r) => r.map_err(|u| unfit(u, false)),
            None => {
                let shown: String = text.chars().take(40).collect();
                let more = if shown.len() < text.len() { "…" } else { "" };
                Err(OpError::new(format!(
                    "table.cast: column `{column}` of element `{key}` holds the text \
                     {shown:?}{more}, which is not a number; cast only numeric columns, or drop \
                     this one with `table.select`",
                )))
            }
        }
    }
}

impl Operator for CastOp {
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        // Check every column first so that a failure leaves the element untouched. A tensor
        // already of its type stays as it is; one whose conversion cannot fail is converted in
        // place afterwards. The others' new values are held on the stack and written back by
        // position: a tensor keeps its shape, text becomes a scalar.
        let mut out: SmallVec<[(usize, TensorData); 4]> = SmallVec::new();
        let mut widened: SmallVec<[(usize, DType); 16]> = SmallVec::new();
        // Columns are usually listed in the order the rows hold them: each search starts where
        // the last one found its column.
        let mut next = 0;
        for (column, to) in &self.columns {
            let slot = element.position_from(column, next);
            let value = slot.map(|i| &element.fields[i].1);
            next = slot.map_or(next, |i| i + 1);
            if let (Some(i), Some(Value::Tensor(t))) = (slot, value) {
                if t.dtype() == *to {
                    continue;
                }
                if widens(t.dtype(), *to) {
                    widened.push((i, *to));
                    continue;
                }
            }
            let cast = self.cast_one(element, value, column, *to)?;
            out.extend(slot.map(|i| (i, cast)));
        }
        for (i, to) in widened {
            if let Value::Tensor(t) = &mut element.fields[i].1
                && let Some(data) = widen(&t.data, to)
            {
                t.data = data;
            }
        }
        for (i, data) in out {
            match &mut element.fields[i].1 {
                Value::Tensor(t) => t.data = data,
                value => *value = Value::Tensor(Tensor { shape: Vec::new(), data }),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn op(cols: &[(&str, DType)]) -> CastOp {
        CastOp::new(&Cast { columns: cols.iter().map(|(c, t)| (c.to_string(), *t)).collect() })
    }

    fn rng() -> SeededRng {
        SeededRng::for_element(0, 0, 0, 0)
    }

    fn one(value: Value, to: DType) -> Result<Value, OpError> {
        let mut el = Element::new("row#7");
        el.set("x", value);
        op(&[("x", to)]).apply(&mut el, &mut rng())?;
        Ok(el.take("x").unwrap())
    }

    fn t(shape: &[usize], data: TensorData) -> Value {
        Value::Tensor(Tensor::new(shape.to_vec(), data).unwrap())
    }

    #[test]
    fn conversions_that_cannot_fail_give_the_checked_conversions_values() {
        let samples = [
            Tensor::new(vec![3], TensorData::U8(smallvec![0, 7, 255])),
            Tensor::new(vec![4], TensorData::I32(smallvec![i32::MIN, -1, 16_777_217, i32::MAX])),
            Tensor::new(vec![4], TensorData::I64(smallvec![i64::MIN, -3, 9_007_199_254_740_993, i64::MAX])),
            Tensor::new(vec![4], TensorData::F32(smallvec![-1.5, 0.1, f32::MAX, f32::NAN])),
            Tensor::new(vec![5], TensorData::F64(smallvec![-2.75, 0.1, 1e300, f64::INFINITY, f64::NAN])),
        ];
        let dtypes = [DType::Uint8, DType::Int32, DType::Int64, DType::Float32, DType::Float64];
        for sample in samples {
            let sample = sample.unwrap();
            let (from, data) = (sample.dtype(), &sample.data);
            for to in dtypes {
                if from == to {
                    continue;
                }
                let widened = widen(data, to);
                assert_eq!(widened.is_some(), widens(from, to), "{from:?} to {to:?}");
                if let Some(widened) = widened {
                    // Compared as bits: NaN stays NaN.
                    let checked = cast_data(data, to).ok().unwrap();
                    assert_eq!(format!("{widened:?}"), format!("{checked:?}"), "{from:?} to {to:?}");
                }
            }
        }
    }

    #[test]
    fn floats_truncate_toward_zero_like_numpy() {
        let v = t(&[4], TensorData::F64(smallvec![1.9, -1.9, -0.5, 255.99]));
        assert_eq!(one(v.clone(), DType::Int32).unwrap(), t(&[4], TensorData::I32(smallvec![1, -1, 0, 255])));
        assert_eq!(one(v, DType::Int64).unwrap(), t(&[4], TensorData::I64(smallvec![1, -1, 0, 255])));
        let v = t(&[2, 1], TensorData::F32(smallvec![0.7, 255.5]));
        assert_eq!(one(v, DType::Uint8).unwrap(), t(&[2, 1], TensorData::U8(smallvec![0, 255])));
        let v = Value::Tensor(Tensor::scalar_f64(-9_223_372_036_854_775_808.0));
        assert_eq!(one(v, DType::Int64).unwrap(), t(&[], TensorData::I64(smallvec![i64::MIN])));
    }

    #[test]
    fn integers_and_floats_widen_and_narrow() {
        let v = Value::Tensor(Tensor::scalar_i64(3));
        assert_eq!(one(v.clone(), DType::Float32).unwrap(), t(&[], TensorData::F32(smallvec![3.0])));
        assert_eq!(one(v.clone(), DType::Float64).unwrap(), t(&[], TensorData::F64(smallvec![3.0])));
        assert_eq!(one(v.clone(), DType::Uint8).unwrap(), t(&[], TensorData::U8(smallvec![3])));
        assert_eq!(one(v.clone(), DType::Int64).unwrap(), v);
        let v = t(&[3], TensorData::U8(smallvec![0, 1, 255]));
        assert_eq!(one(v, DType::Int32).unwrap(), t(&[3], TensorData::I32(smallvec![0, 1, 255])));
        let v = t(&[1], TensorData::F64(smallvec![0.1]));
        assert_eq!(one(v, DType::Float32).unwrap(), t(&[1], TensorData::F32(smallvec![0.1])));
        let v = t(&[1], TensorData::F32(smallvec![0.5]));
        assert_eq!(one(v, DType::Float64).unwrap(), t(&[1], TensorData::F64(smallvec![0.5])));
        let v = t(&[0], TensorData::F64(smallvec![]));
        assert_eq!(one(v, DType::Uint8).unwrap(), t(&[0], TensorData::U8(smallvec![])));
    }

    #[test]
    fn text_and_utf8_bytes_parse_to_scalars() {
        assert_eq!(
            one(Value::Text(" 42 ".into()), DType::Int64).unwrap(),
            t(&[], TensorData::I64(smallvec![42]))
        );
        assert_eq!(
            one(Value::Text("2.75".into()), DType::Int32).unwrap(),
            t(&[], TensorData::I32(smallvec![2]))
        );
        assert_eq!(
            one(Value::Text("1e3".into()), DType::Float32).unwrap(),
            t(&[], TensorData::F32(smallvec![1000.0]))
        );
        assert_eq!(
            one(Value::Text("-0.25".into()), DType::Float64).unwrap(),
            t(&[], TensorData::F64(smallvec![-0.25]))
        );
        let cls = Value::Bytes(Bytes::from_static(b"917"));
        assert_eq!(one(cls, DType::Int64).unwrap(), t(&[], TensorData::I64(smallvec![917])));
        assert_eq!(
            one(Value::Text("9223372036854775807".into()), DType::Int64).unwrap(),
            t(&[], TensorData::I64(smallvec![i64::MAX]))
        );
    }

    #[test]
    fn several_columns_and_untouched_others() {
        let mut el = Element::new("r");
        el.set("a", Value::Tensor(Tensor::scalar_f64(1.5)));
        el.set("b", Value::Text("7".into()));
        el.set("c", Value::Text("keep".into()));
        op(&[("a", DType::Float32), ("b", DType::Int32)]).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(el.get("a"), Some(&t(&[], TensorData::F32(smallvec![1.5]))));
        assert_eq!(el.get("b"), Some(&t(&[], TensorData::I32(smallvec![7]))));
        assert_eq!(el.get("c"), Some(&Value::Text("keep".into())));
        let names: Vec<_> = el.fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "order kept");
    }

    #[test]
    fn a_column_already_of_its_type_keeps_its_value_and_a_later_failure_still_undoes_nothing() {
        let mut el = Element::new("r");
        el.set("a", t(&[2], TensorData::I64(smallvec![4, -5])));
        el.set("b", Value::Tensor(Tensor::scalar_f64(0.25)));
        op(&[("a", DType::Int64), ("b", DType::Float32)]).apply(&mut el, &mut rng()).unwrap();
        assert_eq!(el.get("a"), Some(&t(&[2], TensorData::I64(smallvec![4, -5]))));
        assert_eq!(el.get("b"), Some(&t(&[], TensorData::F32(smallvec![0.25]))));

        el.set("c", Value::Text("many".into()));
        let before = el.clone();
        let e = op(&[("a", DType::Int64), ("b", DType::Float64), ("c", DType::Int32)])
            .apply(&mut el, &mut rng())
            .unwrap_err();
        assert!(e.0.contains("column `c`"), "{e}");
        assert_eq!(el, before, "element untouched on error");
    }

    #[test]
    fn out_of_range_and_nan_name_column_key_and_value() {
        let e = one(Value::Tensor(Tensor::scalar_f64(f64::NAN)), DType::Int32).unwrap_err();
        assert!(e.0.contains("column `x`") && e.0.contains("`row#7`") && e.0.contains("NaN"), "{e}");
        let e = one(Value::Tensor(Tensor::scalar_f64(3e9)), DType::Int32).unwrap_err();
        assert!(e.0.contains("3000000000") && e.0.contains("int32"), "{e}");
        let e = one(Value::Tensor(Tensor::scalar_f64(f64::INFINITY)), DType::Int64).unwrap_err();
        assert!(e.0.contains("inf"), "{e}");
        let e = one(Value::Tensor(Tensor::scalar_f64(9.3e18)), DType::Int64).unwrap_err();
        assert!(e.0.contains("int64"), "{e}");
        let e = one(t(&[3], TensorData::I64(smallvec![1, 2, 256])), DType::Uint8).unwrap_err();
        assert!(e.0.contains("256 at index 2") && e.0.contains("0..=255"), "{e}");
        let e = one(t(&[1], TensorData::I32(smallvec![-1])), DType::Uint8).unwrap_err();
        assert!(e.0.contains("-1"), "{e}");
        let e = one(Value::Text("300".into()), DType::Uint8).unwrap_err();
        assert!(e.0.contains("300") && e.0.contains("uint8"), "{e}");
        let e = one(Value::Text("nan".into()), DType::Int64).unwrap_err();
        assert!(e.0.contains("NaN"), "{e}");
    }

    #[test]
    fn non_numbers_and_missing_columns_are_errors() {
        let e = one(Value::Text("cat".into()), DType::Int64).unwrap_err();
        assert!(e.0.contains("\"cat\"") && e.0.contains("not a number"), "{e}");
        let e = one(Value::Bytes(Bytes::from_static(&[0xff, 0xd8])), DType::Int64).unwrap_err();
        assert!(e.0.contains("not UTF-8"), "{e}");

        let mut el = Element::new("row#1");
        el.set("a", Value::Tensor(Tensor::scalar_f64(1.0)));
        el.set("b", Value::Tensor(Tensor::scalar_f64(2.0)));
        let before = el.clone();
        let e = op(&[("a", DType::Int64), ("zz", DType::Int64)]).apply(&mut el, &mut rng()).unwrap_err();
        assert!(e.0.contains("no column `zz`") && e.0.contains("`a`, `b`"), "{e}");
        assert_eq!(el, before, "element untouched on error");
    }
}
