//! `spec.cache`: materializing a deterministic stage output in object storage.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

pub use crate::quantity::{parse_bytes, parse_duration};

/// Where and whether to materialize the output of a deterministic stage in object storage, so
/// that later epochs (and other pipelines with the same deterministic stages) read it instead of
/// computing it again.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.policy) || self.policy != 'at' || has(self.at)",
        "message": "policy `at` needs `at`: the name of the stage whose output is cached"
    },
    {
        "rule": "!has(self.at) || (has(self.policy) && self.policy == 'at')",
        "message": "`at` applies only to `policy: at`; set `policy: at` or remove `at`"
    },
    {
        "rule": "(has(self.policy) && self.policy == 'never') || has(self.store)",
        "message": "`store` (an object-store URL for cache entries) is required unless `policy: never`"
    }
]))]
pub struct CacheSpec {
    /// `auto`: the autocacher picks whether and where to cache from measured costs. `never`: always
    /// compute. `at`: cache the output of the stage named by `at`. Defaults to `auto`.
    #[serde(default)]
    pub policy: CachePolicy,
    /// Stage name whose output is cached, for `policy: at`. It must lie within the deterministic
    /// prefix of `spec.stages` (before the first random operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Object-store URL under which cache entries are written (`s3://bucket/granary-cache/`,
    /// `file:///var/cache/granary/`). Required unless `policy: never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Size budget of this pipeline's entries, in bytes or with a suffix (`500Mi`, `20Gi`, `1T`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<ByteSize>,
    /// Entries unused for this long are evicted: a number with a unit `s`, `m`, `h` or `d`
    /// (`12h`, `7d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$"))]
    pub ttl: Option<String>,
    /// What happens to the entries this pipeline created when the InputPipeline is deleted:
    /// `remove` (the default) deletes those no other pipeline is writing or reading; `keep`
    /// leaves them for later pipelines with the same source and stages (eviction by `ttl` and
    /// budget still applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_delete: Option<OnDelete>,
}

/// The fate of a deleted pipeline's cache entries.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnDelete {
    /// Delete the entries it created, except those another pipeline uses.
    #[default]
    Remove,
    /// Leave them in the store.
    Keep,
}

impl CacheSpec {
    /// The store whose entries this pipeline created go when it is deleted: `store`, unless
    /// `onDelete: keep`.
    pub fn store_to_clean(&self) -> Option<&str> {
        match self.on_delete.unwrap_or_default() {
            OnDelete::Remove => self.store.as_deref(),
            OnDelete::Keep => None,
        }
    }
}

/// Caching policy.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Decide from measured compute, read and write costs.
    #[default]
    Auto,
    /// Never cache.
    Never,
    /// Cache the output of the stage named by `at`.
    At,
}

/// A byte count given as an integer or a string with a suffix (`Ki`, `Mi`, `Gi`, `Ti`, `K`, `M`,
/// `G`, `T`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ByteSize {
    /// Plain byte count.
    Bytes(u64),
    /// Count with a suffix, e.g. `20Gi`.
    Text(String),
}

impl ByteSize {
    /// The number of bytes, or a message saying what is wrong with the text and the form expected.
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            ByteSize::Bytes(n) => Ok(*n),
            ByteSize::Text(text) => crate::quantity::parse_bytes(text),
        }
    }
}

/// Kubernetes' int-or-string: the API server accepts both `1073741824` and `"1Gi"`.
impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A byte count: an integer, or a string with a suffix Ki, Mi, Gi, Ti, Pi (powers of 1024) or K, M, G, T, P (powers of 1000), e.g. `500Mi`, `20Gi`.",
            "x-kubernetes-int-or-string": true
        })
    }
}
