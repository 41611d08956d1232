//! `tf.train.Example`, as TensorFlow's `example.proto` and `feature.proto` define it (the
//! messages a TFRecord of examples holds), and how its features become element fields.
//!
//! Each feature becomes a field of the same name:
//!
//! - `int64_list` → an `int64` tensor, `float_list` → a `float32` tensor: a scalar when the list
//!   holds one value, 1-D otherwise (an empty list gives shape `[0]`). TFRecord stores every
//!   feature as a list, so one value is read as a scalar, the way a label is written.
//! - `bytes_list` with one value → bytes (an encoded image, or text that `text.tokenize` and
//!   `table.cast` read as UTF-8). Several values → one bytes field per value, named
//!   `NAME/0`, `NAME/1`, ...; none → no field.
//!
//! Fields are in the order of their names (the protobuf map has none).

use crate::element::{Element, FieldName, Value};
use crate::tensor::{Tensor, TensorData};
use bytes::Bytes;
use std::collections::BTreeMap;

/// `tf.train.Example`: a map of named features.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Example {
    /// The features.
    #[prost(message, optional, tag = "1")]
    pub features: Option<Features>,
}

/// `tf.train.Features`: feature name → feature.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Features {
    /// The features by name.
    #[prost(btree_map = "string, message", tag = "1")]
    pub feature: BTreeMap<String, Feature>,
}

/// `tf.train.Feature`: one list of values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Feature {
    /// The list; `None` when the feature sets none.
    #[prost(oneof = "FeatureKind", tags = "1, 2, 3")]
    pub kind: Option<FeatureKind>,
}

/// The three kinds of list a `tf.train.Feature` holds.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum FeatureKind {
    /// `bytes_list`.
    #[prost(message, tag = "1")]
    BytesList(BytesList),
    /// `float_list`.
    #[prost(message, tag = "2")]
    FloatList(FloatList),
    /// `int64_list`.
    #[prost(message, tag = "3")]
    Int64List(Int64List),
}

/// `tf.train.BytesList`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BytesList {
    /// The values; decoded from a `Bytes` buffer they share it instead of copying.
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub value: Vec<Bytes>,
}

/// `tf.train.FloatList`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FloatList {
    /// The values (packed or not: both decode).
    #[prost(float, repeated, tag = "1")]
    pub value: Vec<f32>,
}

/// `tf.train.Int64List`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Int64List {
    /// The values (packed or not: both decode).
    #[prost(int64, repeated, tag = "1")]
    pub value: Vec<i64>,
}

/// A scalar for one value, else a 1-D tensor.
fn numbers<A: smallvec::Array>(values: Vec<A::Item>, wrap: fn(smallvec::SmallVec<A>) -> TensorData) -> Value {
    let shape = if values.len() == 1 { Vec::new() } else { vec![values.len()] };
    Value::Tensor(Tensor { shape, data: wrap(smallvec::SmallVec::from_vec(values)) })
}

/// Appends field `name`, unless another feature gave it already.
fn push(element: &mut Element, name: String, value: Value) -> Result<(), String> {
    if element.get(&name).is_some() {
        return Err(format!(
            "two features give field `{name}` (a feature of that name, and the values of a \
             several-valued bytes feature); rename one when writing the records"
        ));
    }
    element.fields.push((FieldName::from(name), value));
    Ok(())
}

/// Adds the features of `example` to `element` (see the module's documentation). The error
/// names a field that two features would both fill (`a/0` beside a three-valued `a`).
pub fn fill(element: &mut Element, example: Example) -> Result<(), String> {
    let features = example.features.map(|f| f.feature).unwrap_or_default();
    for (name, feature) in features {
        match feature.kind {
            None => {}
            Some(FeatureKind::Int64List(list)) => push(element, name, numbers(list.value, TensorData::I64))?,
            Some(FeatureKind::FloatList(list)) => push(element, name, numbers(list.value, TensorData::F32))?,
            Some(FeatureKind::BytesList(list)) => match <[Bytes; 1]>::try_from(list.value) {
                Ok([one]) => push(element, name, Value::Bytes(one))?,
                Err(values) => {
                    for (i, value) in values.into_iter().enumerate() {
                        push(element, format!("{name}/{i}"), Value::Bytes(value))?;
                    }
                }
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use smallvec::smallvec;

    fn feature(kind: FeatureKind) -> Feature {
        Feature { kind: Some(kind) }
    }

    #[test]
    fn features_become_fields_in_name_order() {
        let mut map = BTreeMap::new();
        map.insert("label".to_string(), feature(FeatureKind::Int64List(Int64List { value: vec![7] })));
        map.insert("ids".to_string(), feature(FeatureKind::Int64List(Int64List { value: vec![1, 2, 3] })));
        map.insert("box".to_string(), feature(FeatureKind::FloatList(FloatList { value: vec![0.5, 1.5] })));
        map.insert("none".to_string(), feature(FeatureKind::FloatList(FloatList { value: vec![] })));
        map.insert("unset".to_string(), Feature { kind: None });
        map.insert(
            "tags".to_string(),
            feature(FeatureKind::BytesList(BytesList { value: vec![Bytes::from("a"), Bytes::from("b")] })),
        );
        map.insert(
            "text".to_string(),
            feature(FeatureKind::BytesList(BytesList { value: vec![Bytes::from("hi")] })),
        );
        let encoded = Example { features: Some(Features { feature: map }) }.encode_to_vec();
        let example = Example::decode(Bytes::from(encoded)).unwrap();
        let mut e = Element::new("k");
        fill(&mut e, example).unwrap();
        let names: Vec<&str> = e.fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["box", "ids", "label", "none", "tags/0", "tags/1", "text"]);
        assert_eq!(e.get("label"), Some(&Value::Tensor(Tensor::scalar_i64(7))));
        assert_eq!(
            e.get("ids"),
            Some(&Value::Tensor(Tensor { shape: vec![3], data: TensorData::I64(smallvec![1, 2, 3]) }))
        );
        assert_eq!(
            e.get("box"),
            Some(&Value::Tensor(Tensor { shape: vec![2], data: TensorData::F32(smallvec![0.5, 1.5]) }))
        );
        assert_eq!(
            e.get("none"),
            Some(&Value::Tensor(Tensor { shape: vec![0], data: TensorData::F32(smallvec![]) }))
        );
        assert_eq!(e.get("tags/1"), Some(&Value::Bytes(Bytes::from("b"))));
        assert_eq!(e.get("text"), Some(&Value::Bytes(Bytes::from("hi"))));
    }

    #[test]
    fn a_field_two_features_fill_is_an_error() {
        let mut map = BTreeMap::new();
        map.insert(
            "a".to_string(),
            feature(FeatureKind::BytesList(BytesList { value: vec![Bytes::from("x"), Bytes::from("y")] })),
        );
        map.insert("a/0".to_string(), feature(FeatureKind::Int64List(Int64List { value: vec![1] })));
        let mut e = Element::new("k");
        let err = fill(&mut e, Example { features: Some(Features { feature: map }) }).unwrap_err();
        assert!(err.contains("`a/0`"), "{err}");
    }
}
