//! `format: jsonl`: one JSON object per line; a file is a split. Lines are streamed.
//!
//! With a [`Projection`], each line is still parsed whole (a line that is not a JSON object fails
//! as without one), but the values of keys it does not name are skipped as they are parsed: no
//! value is built for them, and no field.

use super::{Emit, Object, Projection, SourceError, blocking_reader, record_key, relative_key, values};
use crate::element::Element;
use object_store::ObjectStore;
use object_store::path::Path as StorePath;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;
use std::io::BufRead;
use std::sync::Arc;
use tokio::runtime::Handle;

/// A line parsed under a projection: the object's kept members, or that the line held another
/// JSON value.
enum Line {
    /// A JSON object, with the members the projection keeps (other members skipped).
    Object(serde_json::Map<String, serde_json::Value>),
    /// A JSON value other than an object.
    NotObject,
}

/// Parses one line, building values only for the keys `0` keeps.
struct Projected<'p>(&'p Projection);

impl<'de> DeserializeSeed<'de> for Projected<'_> {
    type Value = Line;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Line, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Projected<'_> {
    type Value = Line;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Line, A::Error> {
        let mut kept = serde_json::Map::new();
        while let Some(Key(key)) = map.next_key()? {
            if self.0.contains(&key) {
                // As `serde_json::Map` collects an object: a repeated key's last value wins.
                let value: serde_json::Value = map.next_value()?;
                kept.insert(key.into_owned(), value);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Line::Object(kept))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Line, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Line::NotObject)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Line, E> {
        Ok(Line::NotObject)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Line, E> {
        Ok(Line::NotObject)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Line, E> {
        Ok(Line::NotObject)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Line, E> {
        Ok(Line::NotObject)
    }

    fn visit_str<E>(self, _: &str) -> Result<Line, E> {
        Ok(Line::NotObject)
    }

    fn visit_unit<E>(self) -> Result<Line, E> {
        Ok(Line::NotObject)
    }
}

/// An object key, borrowed from the line when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }

            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Parses `line` as a JSON object, keeping the members `projection` names (all with none).
/// `Ok(None)` when it is valid JSON but not an object.
fn parse_line(
    line: &str,
    projection: Option<&Projection>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, serde_json::Error> {
    match projection {
        None => match serde_json::from_str(line)? {
            serde_json::Value::Object(object) => Ok(Some(object)),
            _ => Ok(None),
        },
        Some(projection) => {
            let mut deserializer = serde_json::Deserializer::from_str(line);
            let parsed = Projected(projection).deserialize(&mut deserializer)?;
            deserializer.end()?;
            match parsed {
                Line::Object(object) => Ok(Some(object)),
                Line::NotObject => Ok(None),
            }
        }
    }
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    object: &Object,
    projection: Option<&Projection>,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let file_key = relative_key(root, &object.location);
    let reader = std::io::BufReader::with_capacity(1 << 16, blocking_reader(store, &object.location, rt)?);
    for (n, line) in reader.lines().enumerate() {
        let at = || format!("{}:{}", object.location, n + 1);
        let line = line.map_err(|e| SourceError::data(at(), format!("cannot read line: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = parse_line(&line, projection)
            .map_err(|e| SourceError::data(at(), format!("not valid JSON: {e}")))?;
        let Some(object) = parsed else {
            return Err(SourceError::data(
                at(),
                "each line must be a JSON object such as {\"text\": \"...\"}",
            ));
        };
        let mut element = Element::new(record_key(&file_key, ':', n + 1));
        values::json_object_into(&mut element, &object);
        if !emit(element) {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `line` parsed whole, then restricted to `keep`.
    fn restricted(line: &str, keep: &Projection) -> serde_json::Map<String, serde_json::Value> {
        let mut all = parse_line(line, None).unwrap().unwrap();
        all.retain(|k, _| keep.contains(k));
        all
    }

    #[test]
    fn projected_lines_keep_only_the_named_keys() {
        let keep = Projection::new(["b", "caf\u{e9}", "d", "absent"]);
        for line in [
            r#"{"a": [1, {"x": "y"}], "b": 2, "c": "big", "d": null}"#,
            r#"{"b": 1, "b": {"n": [1, 2]}, "a": 3}"#,
            r#"{"caf\u00e9": "escaped key", "z": 1e400000000000000}"#,
            r#"{}"#,
            r#"  {"d": "last"}  "#,
        ] {
            if line.contains("1e4") {
                // A value the full parse refuses is skipped, unbuilt, when not kept.
                assert!(parse_line(line, None).is_err());
                let kept = parse_line(line, Some(&keep)).unwrap().unwrap();
                assert_eq!(kept.get("caf\u{e9}"), Some(&serde_json::json!("escaped key")));
                continue;
            }
            assert_eq!(parse_line(line, Some(&keep)).unwrap().unwrap(), restricted(line, &keep), "{line}");
        }
        assert!(parse_line(r#"{"a": 1, "b": 2}"#, Some(&Projection::default())).unwrap().unwrap().is_empty());
    }

    #[test]
    fn projected_lines_fail_as_whole_ones_do() {
        let keep = Projection::new(["b"]);
        for line in [r#"{"a": [1, 2}"#, r#"{"a": 1} x"#, r#"{"a": tru}"#, r#"{"a": "\x"}"#, "{"] {
            let full = parse_line(line, None).unwrap_err().to_string();
            let projected = parse_line(line, Some(&keep)).unwrap_err().to_string();
            assert_eq!(projected, full, "{line}");
        }
        for line in ["[1, {\"b\": 2}]", "3", "\"b\"", "null", "true", "-1.5"] {
            assert!(parse_line(line, None).unwrap().is_none(), "{line}");
            assert!(parse_line(line, Some(&keep)).unwrap().is_none(), "{line}");
        }
    }
}
