//! Typed configuration of every built-in operator, and the registry that maps `op` names to it.
//!
//! Each family has its own module; the implementation of each operator lives in the worker
//! (`worker/src/ops/<family>/`). Adding an operator means a config struct here, a line in
//! [`OPS`], and its implementation there.

pub mod image;
pub mod table;
pub mod test;
pub mod text;

use crate::{Problem, StageSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub use self::image::{CenterCrop, Decode, Flip, ImageDType, Layout, Normalize, RandomResizedCrop, Resize};
pub use self::table::{Cast, Select};
pub use self::test::Sleep;
pub use self::text::{Tokenize, TruncatePad};

/// A parsed stage: the operator and its typed fields.
#[derive(Clone, Debug, PartialEq)]
pub enum OpConfig {
    /// `image.decode`
    ImageDecode(Decode),
    /// `image.resize`
    ImageResize(Resize),
    /// `image.center_crop`
    ImageCenterCrop(CenterCrop),
    /// `image.random_resized_crop`
    ImageRandomResizedCrop(RandomResizedCrop),
    /// `image.flip`
    ImageFlip(Flip),
    /// `image.normalize`
    ImageNormalize(Normalize),
    /// `text.tokenize`
    TextTokenize(Tokenize),
    /// `text.truncate_pad`
    TextTruncatePad(TruncatePad),
    /// `table.select`
    TableSelect(Select),
    /// `table.cast`
    TableCast(Cast),
    /// `test.sleep`
    TestSleep(Sleep),
}

/// What the registry knows of one operator.
pub struct OpInfo {
    /// The `op` name used in specs.
    pub name: &'static str,
    /// Whether the same input always gives the same output (caching is legal only on the
    /// deterministic prefix of a pipeline).
    pub deterministic: bool,
    parse: fn(serde_json::Value) -> Result<OpConfig, serde_path_to_error::Error<serde_json::Error>>,
}

fn typed<T: DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(value)
}

/// Every built-in operator.
pub const OPS: &[OpInfo] = &[
    OpInfo { name: "image.decode", deterministic: true, parse: |v| typed(v).map(OpConfig::ImageDecode) },
    OpInfo { name: "image.resize", deterministic: true, parse: |v| typed(v).map(OpConfig::ImageResize) },
    OpInfo {
        name: "image.center_crop",
        deterministic: true,
        parse: |v| typed(v).map(OpConfig::ImageCenterCrop),
    },
    OpInfo {
        name: "image.random_resized_crop",
        deterministic: false,
        parse: |v| typed(v).map(OpConfig::ImageRandomResizedCrop),
    },
    OpInfo { name: "image.flip", deterministic: false, parse: |v| typed(v).map(OpConfig::ImageFlip) },
    OpInfo {
        name: "image.normalize",
        deterministic: true,
        parse: |v| typed(v).map(OpConfig::ImageNormalize),
    },
    OpInfo { name: "text.tokenize", deterministic: true, parse: |v| typed(v).map(OpConfig::TextTokenize) },
    OpInfo {
        name: "text.truncate_pad",
        deterministic: true,
        parse: |v| typed(v).map(OpConfig::TextTruncatePad),
    },
    OpInfo { name: "table.select", deterministic: true, parse: |v| typed(v).map(OpConfig::TableSelect) },
    OpInfo { name: "table.cast", deterministic: true, parse: |v| typed(v).map(OpConfig::TableCast) },
    OpInfo { name: "test.sleep", deterministic: true, parse: |v| typed(v).map(OpConfig::TestSleep) },
];

/// The registry entry for `op`, if it names a built-in operator.
pub fn op_info(op: &str) -> Option<&'static OpInfo> {
    OPS.iter().find(|info| info.name == op)
}

impl OpConfig {
    /// Parses one stage's fields into its typed config. `path` is the stage's field path
    /// (`spec.stages[2]`); problems name fields under it.
    pub fn parse(stage: &StageSpec, path: &str) -> Result<OpConfig, Vec<Problem>> {
        let Some(info) = op_info(&stage.op) else {
            let known: Vec<&str> = OPS.iter().map(|i| i.name).collect();
            return Err(vec![Problem::new(
                format!("{path}.op"),
                format!("unknown operator `{}`; known operators: {}", stage.op, known.join(", ")),
            )]);
        };
        let value = serde_json::Value::Object(stage.params.clone());
        let config = (info.parse)(value).map_err(|e| {
            let inner = e.path().to_string();
            let field =
                if inner == "." || inner.is_empty() { path.to_string() } else { format!("{path}.{inner}") };
            vec![Problem::new(field, e.inner().to_string())]
        })?;
        let mut problems = Vec::new();
        config.check(path, &mut problems);
        if problems.is_empty() { Ok(config) } else { Err(problems) }
    }

    /// The `op` name of this config.
    pub fn op_name(&self) -> &'static str {
        match self {
            OpConfig::ImageDecode(_) => "image.decode",
            OpConfig::ImageResize(_) => "image.resize",
            OpConfig::ImageCenterCrop(_) => "image.center_crop",
            OpConfig::ImageRandomResizedCrop(_) => "image.random_resized_crop",
            OpConfig::ImageFlip(_) => "image.flip",
            OpConfig::ImageNormalize(_) => "image.normalize",
            OpConfig::TextTokenize(_) => "text.tokenize",
            OpConfig::TextTruncatePad(_) => "text.truncate_pad",
            OpConfig::TableSelect(_) => "table.select",
            OpConfig::TableCast(_) => "table.cast",
            OpConfig::TestSleep(_) => "test.sleep",
        }
    }

    /// Whether this operator always maps the same input to the same output.
    pub fn deterministic(&self) -> bool {
        op_info(self.op_name()).is_some_and(|i| i.deterministic)
    }

    /// Range and consistency checks on the typed fields.
    fn check(&self, path: &str, problems: &mut Vec<Problem>) {
        match self {
            OpConfig::ImageDecode(c) => c.check(path, problems),
            OpConfig::ImageResize(c) => c.check(path, problems),
            OpConfig::ImageCenterCrop(c) => c.check(path, problems),
            OpConfig::ImageRandomResizedCrop(c) => c.check(path, problems),
            OpConfig::ImageFlip(c) => c.check(path, problems),
            OpConfig::ImageNormalize(c) => c.check(path, problems),
            OpConfig::TextTokenize(c) => c.check(path, problems),
            OpConfig::TextTruncatePad(c) => c.check(path, problems),
            OpConfig::TableSelect(c) => c.check(path, problems),
            OpConfig::TableCast(c) => c.check(path, problems),
            OpConfig::TestSleep(c) => c.check(path, problems),
        }
    }
}

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Unsigned 8-bit integer.
    Uint8,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// 32-bit float.
    Float32,
    /// 64-bit float.
    Float64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Uint8 => 1,
            DType::Int32 | DType::Float32 => 4,
            DType::Int64 | DType::Float64 => 8,
        }
    }

    /// The name used in specs and batch headers.
    pub fn name(self) -> &'static str {
        match self {
            DType::Uint8 => "uint8",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
        }
    }
}

/// The field an operator reads and writes when the stage does not name one.
pub(crate) fn default_image_field() -> String {
    "image".to_string()
}
