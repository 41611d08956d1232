//! Content addresses of cache entries: [`EntryIdentity`] (what an entry was computed from) and its
//! [`Fingerprint`] (sha256 of the identity's canonical JSON together with [`FORMAT_VERSION`]).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{CacheError, FORMAT_VERSION};

/// Number of hex digits in a fingerprint.
pub const FINGERPRINT_HEX_LEN: usize = 64;

/// A cache entry's address: 64 lowercase hex digits (a sha256).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Parses 64 hex digits (either case; stored lowercase).
    pub fn parse(text: &str) -> Result<Fingerprint, CacheError> {
        if text.len() != FINGERPRINT_HEX_LEN {
            return Err(CacheError::Format(format!(
                "`{text}` is not a cache fingerprint: expected {FINGERPRINT_HEX_LEN} hex digits, got {} \
                 characters",
                text.chars().count()
            )));
        }
        if let Some(bad) = text.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(CacheError::Format(format!(
                "`{text}` is not a cache fingerprint: `{bad}` is not a hex digit"
            )));
        }
        Ok(Fingerprint(text.to_ascii_lowercase()))
    }

    /// The 64 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Fingerprint {
    type Error = CacheError;

    fn try_from(text: String) -> Result<Fingerprint, CacheError> {
        Fingerprint::parse(&text)
    }
}

impl From<Fingerprint> for String {
    fn from(fp: Fingerprint) -> String {
        fp.0
    }
}

/// One source object an entry was computed from, as the store describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectIdentity {
    /// Path inside the source store.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The store's entity tag, where it gives one.
    pub etag: Option<String>,
    /// The store's object version, where it gives one.
    pub version: Option<String>,
}

/// Everything a cache entry's content depends on. Two pipelines whose identities are equal share
/// entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryIdentity {
    /// The source URL.
    pub source_url: String,
    /// The source format (`files`, `webdataset`, `jsonl`, `parquet`, ...).
    pub source_format: String,
    /// The source objects with their sizes and versions.
    pub objects: Vec<ObjectIdentity>,
    /// The deterministic stage prefix, each stage with its arguments.
    pub stages: Vec<Value>,
    /// Anything else the content depends on (split size, seeds of seeded stages, ...).
    pub extra: Value,
}

impl EntryIdentity {
    /// sha256 of the canonical JSON (object keys sorted, no whitespace) of
    /// `[FORMAT_VERSION, self]`.
    pub fn fingerprint(&self) -> Fingerprint {
        // Serializing plain structs, strings and `Value`s into a `Value` cannot fail.
        let identity = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut text = String::new();
        write_canonical(&Value::Array(vec![Value::from(FORMAT_VERSION), identity]), &mut text);
        let digest = Sha256::digest(text.as_bytes());
        Fingerprint(digest.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Appends `value` as JSON with object keys in byte order and no whitespace, whatever order its
/// maps keep.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn identity() -> EntryIdentity {
        EntryIdentity {
            source_url: "file:///data/train/".into(),
            source_format: "files".into(),
            objects: vec![ObjectIdentity {
                path: "a.jpg".into(),
                size: 10,
                etag: Some("e1".into()),
                version: None,
            }],
            stages: vec![json!({"op": "decode_image", "args": {"mode": "rgb", "b": 1}})],
            extra: json!({"splitSize": 64}),
        }
    }

    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        let base = identity().fingerprint();
        assert_eq!(base.as_str().len(), FINGERPRINT_HEX_LEN);
        assert!(base.as_str().chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(base, identity().fingerprint());
        let mut other = identity();
        other.objects[0].etag = Some("e2".into());
        assert_ne!(base, other.fingerprint());
        let mut other = identity();
        other.stages[0] = json!({"op": "decode_image", "args": {"mode": "rgb", "b": 2}});
        assert_ne!(base, other.fingerprint());
    }

    #[test]
    fn fingerprint_ignores_key_order() {
        let mut a = identity();
        a.stages = vec![serde_json::from_str(r#"{"x": 1, "y": {"p": true, "q": null}}"#).unwrap()];
        let mut b = identity();
        b.stages = vec![serde_json::from_str(r#"{"y": {"q": null, "p": true}, "x": 1}"#).unwrap()];
        assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn canonical_json_escapes_and_sorts() {
        let mut out = String::new();
        write_canonical(&json!({"b": "q\"uote", "a": [1, 2.5, null]}), &mut out);
        assert_eq!(out, r#"{"a":[1,2.5,null],"b":"q\"uote"}"#);
    }

    #[test]
    fn parse_validates() {
        let fp = identity().fingerprint();
        assert_eq!(Fingerprint::parse(&fp.as_str().to_ascii_uppercase()).unwrap(), fp);
        assert!(matches!(Fingerprint::parse("abc"), Err(CacheError::Format(_))));
        let bad = format!("{}g", &fp.as_str()[1..]);
        let err = Fingerprint::parse(&bad).unwrap_err().to_string();
        assert!(err.contains("`g` is not a hex digit"), "{err}");
        // Multi-byte characters must not slip through a byte-length check.
        assert!(Fingerprint::parse(&"é".repeat(32)).is_err());
        let json = serde_json::to_string(&fp).unwrap();
        assert_eq!(serde_json::from_str::<Fingerprint>(&json).unwrap(), fp);
        assert!(serde_json::from_str::<Fingerprint>("\"xyz\"").is_err());
    }
}
