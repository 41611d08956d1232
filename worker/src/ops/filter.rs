//! `filter`: the built-in predicates. Each reads one field and keeps or drops the element; the
//! elements kept go on unchanged.

use crate::element::{Element, Value};
use crate::ops::text::tokenize::field_names;
use crate::ops::{BuildError, Fate, OpError, Operator};
use crate::seed::SeededRng;
use crate::tensor::DType;
use granary_crds::ops::Filter;
use granary_crds::ops::filter::{LengthUnit, Test};

/// A built-in filter stage.
pub struct FilterOp {
    test: Test,
}

impl FilterOp {
    /// The filter of a checked config.
    pub fn new(config: &Filter) -> Result<FilterOp, BuildError> {
        let test = config.test().ok_or_else(|| {
            BuildError("filter: `predicate: text.length` needs `unit` (`chars` or `tokens`)".into())
        })?;
        Ok(FilterOp { test })
    }

    /// Whether `element` passes the test.
    pub fn keeps(&self, element: &Element) -> Result<bool, OpError> {
        match &self.test {
            Test::Length { field, unit, min, max } => {
                let length = length(element, field, *unit)?;
                Ok((*min..=*max).contains(&length))
            }
            Test::MinSize { field, min_width, min_height } => {
                let (height, width) = size(element, field)?;
                Ok(width >= *min_width as usize && height >= *min_height as usize)
            }
        }
    }
}

impl Operator for FilterOp {
    /// Evaluates the test and leaves the element as it is.
    fn apply(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<(), OpError> {
        self.keeps(element).map(|_| ())
    }

    fn run(&self, element: &mut Element, _rng: &mut SeededRng) -> Result<Fate, OpError> {
        Ok(if self.keeps(element)? { Fate::Keep } else { Fate::Drop })
    }
}

/// The field's value, or an error that lists the element's fields.
fn field<'a>(element: &'a Element, name: &str, predicate: &str) -> Result<&'a Value, OpError> {
    element.get(name).ok_or_else(|| {
        OpError::new(format!(
            "filter `{predicate}`: element `{}` has no field `{name}` (its fields: {}); set `field` to the \
             field to test",
            element.key,
            field_names(element)
        ))
    })
}

/// The length of `name` in `unit`: Unicode scalar values of text (or UTF-8 bytes), or the ids of
/// a 1-D integer tensor.
fn length(element: &Element, name: &str, unit: LengthUnit) -> Result<u64, OpError> {
    let value = field(element, name, "text.length")?;
    let key = &element.key;
    match (unit, value) {
        (LengthUnit::Chars, Value::Text(s)) => Ok(s.chars().count() as u64),
        (LengthUnit::Chars, Value::Bytes(b)) => match std::str::from_utf8(b) {
            Ok(s) => Ok(s.chars().count() as u64),
            Err(e) => Err(OpError::new(format!(
                "filter `text.length`: field `{name}` of element `{key}` holds bytes that are not UTF-8 ({e}); \
                 `unit: chars` counts the characters of text"
            ))),
        },
        (LengthUnit::Chars, Value::Tensor(t)) => Err(OpError::new(format!(
            "filter `text.length`: field `{name}` of element `{key}` is a {} tensor, not text; count token ids \
             with `unit: tokens`, or point `field` at a text field",
            t.dtype().name()
        ))),
        (LengthUnit::Tokens, Value::Tensor(t))
            if t.shape.len() == 1 && matches!(t.dtype(), DType::Int32 | DType::Int64 | DType::Uint8) =>
        {
            Ok(t.shape[0] as u64)
        }
        (LengthUnit::Tokens, Value::Tensor(t)) => Err(OpError::new(format!(
            "filter `text.length`: field `{name}` of element `{key}` is a {} tensor of shape {:?}; `unit: tokens` \
             counts a 1-D integer field of token ids (`input_ids` after `text.tokenize`)",
            t.dtype().name(),
            t.shape
        ))),
        (LengthUnit::Tokens, other) => Err(OpError::new(format!(
            "filter `text.length`: field `{name}` of element `{key}` is {}, not token ids; tokenize it first \
             (`text.tokenize`) and count `input_ids`, or count its characters with `unit: chars`",
            other.kind()
        ))),
    }
}

/// Height and width of the decoded image in `name` (height × width × channels).
fn size(element: &Element, name: &str) -> Result<(usize, usize), OpError> {
    let key = &element.key;
    match field(element, name, "image.min_size")? {
        Value::Tensor(t) if t.shape.len() == 3 => Ok((t.shape[0], t.shape[1])),
        Value::Tensor(t) => Err(OpError::new(format!(
            "filter `image.min_size`: field `{name}` of element `{key}` is a tensor of shape {:?}, not decoded \
             pixels (height × width × channels); move this filter before `image.normalize`",
            t.shape
        ))),
        other => Err(OpError::new(format!(
            "filter `image.min_size`: field `{name}` of element `{key}` is {}, not decoded pixels; add \
             `image.decode` before this filter",
            other.kind()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Tensor, TensorData};
    use smallvec::smallvec;

    fn op(value: serde_json::Value) -> FilterOp {
        let config: Filter = serde_json::from_value(value).unwrap();
        FilterOp::new(&config).unwrap()
    }

    fn fate(op: &FilterOp, element: &mut Element) -> Result<Fate, OpError> {
        op.run(element, &mut SeededRng::for_element(0, 0, 0, 0))
    }

    #[test]
    fn text_length_counts_characters_inclusively() {
        let f = op(serde_json::json!({"predicate": "text.length", "unit": "chars", "min": 2, "max": 3}));
        for (text, expected) in
            [("a", Fate::Drop), ("ab", Fate::Keep), ("äöü", Fate::Keep), ("abcd", Fate::Drop)]
        {
            let mut e = Element::new("k");
            e.set("text", Value::Text(text.into()));
            assert_eq!(fate(&f, &mut e).unwrap(), expected, "{text}");
            e.set("text", Value::Bytes(bytes::Bytes::copy_from_slice(text.as_bytes())));
            assert_eq!(fate(&f, &mut e).unwrap(), expected, "{text} as bytes");
        }
    }

    #[test]
    fn tokens_and_sizes_read_tensors() {
        let f = op(serde_json::json!({"predicate": "text.length", "unit": "tokens", "min": 3}));
        let mut e = Element::new("k");
        e.set("input_ids", Value::Tensor(Tensor::new(vec![2], TensorData::I64(smallvec![1, 2])).unwrap()));
        assert_eq!(fate(&f, &mut e).unwrap(), Fate::Drop);
        e.set("input_ids", Value::Tensor(Tensor::new(vec![3], TensorData::I64(smallvec![1, 2, 3])).unwrap()));
        assert_eq!(fate(&f, &mut e).unwrap(), Fate::Keep);

        let f = op(serde_json::json!({"predicate": "image.min_size", "minWidth": 3, "minHeight": 2}));
        let image = |h: usize, w: usize| {
            Value::Tensor(Tensor::new(vec![h, w, 3], TensorData::U8(smallvec![0; h * w * 3])).unwrap())
        };
        for (h, w, expected) in
            [(2, 3, Fate::Keep), (1, 3, Fate::Drop), (2, 2, Fate::Drop), (9, 9, Fate::Keep)]
        {
            e.set("image", image(h, w));
            assert_eq!(fate(&f, &mut e).unwrap(), expected, "{h}×{w}");
        }
    }

    #[test]
    fn the_wrong_kind_of_field_is_an_error_that_says_what_to_do() {
        let mut e = Element::new("a.jpg");
        e.set("image", Value::Bytes(bytes::Bytes::from_static(b"\xff\xd8")));
        let f = op(serde_json::json!({"predicate": "image.min_size", "minWidth": 3}));
        assert!(fate(&f, &mut e).unwrap_err().0.contains("add `image.decode`"));
        let f = op(serde_json::json!({"predicate": "text.length", "unit": "chars", "max": 3}));
        let message = fate(&f, &mut e).unwrap_err().0;
        assert!(message.contains("no field `text`") && message.contains("`image`"), "{message}");
        let f =
            op(serde_json::json!({"predicate": "text.length", "unit": "tokens", "max": 3, "field": "image"}));
        assert!(fate(&f, &mut e).unwrap_err().0.contains("tokenize it first"));
    }
}
