//! One sample flowing through the pipeline: a key and named fields.

use crate::tensor::Tensor;
use bytes::Bytes;

/// A field's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Raw bytes, e.g. an encoded JPEG.
    Bytes(Bytes),
    /// UTF-8 text.
    Text(String),
    /// A dense tensor (decoded images are `uint8` height × width × channels).
    Tensor(Tensor),
}

impl Value {
    /// Bytes held by the value.
    pub fn nbytes(&self) -> usize {
        match self {
            Value::Bytes(b) => b.len(),
            Value::Text(s) => s.len(),
            Value::Tensor(t) => t.nbytes(),
        }
    }

    /// A short name of the kind of value, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Bytes(_) => "bytes",
            Value::Text(_) => "text",
            Value::Tensor(_) => "tensor",
        }
    }
}

/// A field's name. Names up to 24 bytes are held inline, so an element's fields allocate nothing
/// for their names, and comparing two names reads no other memory: a table of many columns names
/// every field of every row.
pub type FieldName = compact_str::CompactString;

/// One sample: a key that names it uniquely within the source (object name, tar member, or
/// file and row number) and its fields in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    /// Unique key of the sample within the source.
    pub key: String,
    /// Named fields, in order.
    pub fields: Vec<(FieldName, Value)>,
}

impl Element {
    /// An element with no fields.
    pub fn new(key: impl Into<String>) -> Element {
        Element { key: key.into(), fields: Vec::new() }
    }

    /// The value of field `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The position of field `name` in [`Element::fields`], looked for from `from` on first
    /// and then before it: stages that visit several fields in the order rows hold them find
    /// each at the first comparison.
    pub fn position_from(&self, name: &str, from: usize) -> Option<usize> {
        let from = from.min(self.fields.len());
        let (before, after) = self.fields.split_at(from);
        let at = |fields: &[(FieldName, Value)]| fields.iter().position(|(n, _)| n == name);
        at(after).map(|i| from + i).or_else(|| at(before))
    }

    /// The value of field `name`, mutably.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Value> {
        self.fields.iter_mut().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Sets field `name`, replacing its value in place or appending it.
    pub fn set(&mut self, name: &str, value: Value) {
        match self.get_mut(name) {
            Some(slot) => *slot = value,
            None => self.fields.push((FieldName::from(name), value)),
        }
    }

    /// Removes field `name` and returns its value.
    pub fn take(&mut self, name: &str) -> Option<Value> {
        let i = self.fields.iter().position(|(n, _)| n == name)?;
        Some(self.fields.remove(i).1)
    }

    /// Bytes held by all fields (the key not counted).
    pub fn nbytes(&self) -> usize {
        self.fields.iter().map(|(_, v)| v.nbytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_found_after_its_hint_before_it_or_not_at_all() {
        let mut el = Element::new("row#1");
        for name in ["a", "b", "c", "b2"] {
            el.set(name, Value::Text(name.into()));
        }
        // At the hint, after it, before it, past the end, and missing.
        assert_eq!(el.position_from("b", 1), Some(1));
        assert_eq!(el.position_from("c", 1), Some(2));
        assert_eq!(el.position_from("a", 2), Some(0));
        assert_eq!(el.position_from("b2", 99), Some(3));
        assert_eq!(el.position_from("a", 99), Some(0));
        assert_eq!(el.position_from("d", 0), None);
        assert_eq!(el.position_from("d", 2), None);
        assert_eq!(Element::new("empty").position_from("a", 0), None);
    }
}
