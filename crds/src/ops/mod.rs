//! Typed configuration of every built-in operator, and the registry that maps `op` names to it.
//!
//! Each family has its own module; the implementation of each operator lives in the worker
//! (`worker/src/ops/<family>/`). [`OPS`] is the one source of what is known of each operator:
//! its name, family, default field, the [`Kind`] of data it takes and gives, and whether it is
//! deterministic, and how many elements it gives for each it takes; validation derives its checks
//! from these facts. Adding an operator means a config struct with its `OP` name here, a row in
//! [`OPS`], and its implementation there.

pub mod family;
pub mod filter;
pub mod image;
pub mod kind;
pub mod python;
pub mod table;
pub mod test;
pub mod text;

use crate::{Problem, StageSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub use self::family::{Family, FormatFit};
pub use self::filter::Filter;
pub use self::image::{CenterCrop, Decode, Flip, ImageDType, Layout, Normalize, RandomResizedCrop, Resize};
pub use self::kind::Kind;
pub use self::python::{PythonCall, PythonFilter, PythonMap, PythonRole};
pub use self::table::{Cast, Select};
pub use self::test::Sleep;
pub use self::text::{LastRow, Pack, Tokenize, Truncate, TruncatePad};

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
    /// `text.truncate`
    TextTruncate(Truncate),
    /// `text.pack`
    TextPack(Pack),
    /// `table.select`
    TableSelect(Select),
    /// `table.cast`
    TableCast(Cast),
    /// `test.sleep`
    TestSleep(Sleep),
    /// `python.map`
    PythonMap(PythonMap),
    /// `filter`
    Filter(Filter),
    /// `python.filter`
    PythonFilter(PythonFilter),
}

/// What the registry knows of one operator: every fact that validation and the other crates
/// decide on, so that none of them matches on `op` names.
pub struct OpInfo {
    /// The `op` name used in specs.
    pub name: &'static str,
    /// The family it belongs to (which source formats it fits).
    pub family: Family,
    /// The field it works on when the stage names none; `None` when it takes no `field`.
    pub field: Option<&'static str>,
    /// What it reads from its field.
    pub input: Kind,
    /// What it leaves there.
    pub output: Kind,
    /// Whether the same input always gives the same output (caching is legal only on the
    /// deterministic prefix of a pipeline).
    pub deterministic: Determinism,
    /// How many elements it gives for each it takes.
    pub count: Count,
    parse: fn(serde_json::Value) -> Result<OpConfig, serde_path_to_error::Error<serde_json::Error>>,
}

fn typed<T: DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(value)
}

/// The field image operators work on when the stage names none.
const IMAGE_FIELD: &str = "image";
/// The field `text.tokenize` reads when the stage names none.
const TEXT_FIELD: &str = "text";

/// Every built-in operator.
pub const OPS: &[OpInfo] = &[
    OpInfo {
        name: Decode::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::EncodedImage,
        output: Kind::Pixels,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageDecode),
    },
    OpInfo {
        name: Resize::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::Pixels,
        output: Kind::Pixels,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageResize),
    },
    OpInfo {
        name: CenterCrop::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::Pixels,
        output: Kind::Pixels,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageCenterCrop),
    },
    OpInfo {
        name: RandomResizedCrop::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::Pixels,
        output: Kind::Pixels,
        deterministic: Determinism::Never,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageRandomResizedCrop),
    },
    OpInfo {
        name: Flip::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::Pixels,
        output: Kind::Pixels,
        deterministic: Determinism::Never,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageFlip),
    },
    OpInfo {
        name: Normalize::OP,
        family: Family::Image,
        field: Some(IMAGE_FIELD),
        input: Kind::Pixels,
        output: Kind::ImageTensor,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::ImageNormalize),
    },
    OpInfo {
        name: Tokenize::OP,
        family: Family::Text,
        field: Some(TEXT_FIELD),
        input: Kind::Text,
        output: Kind::Tokens,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TextTokenize),
    },
    OpInfo {
        name: TruncatePad::OP,
        family: Family::Text,
        field: None,
        input: Kind::Tokens,
        output: Kind::Tokens,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TextTruncatePad),
    },
    OpInfo {
        name: Truncate::OP,
        family: Family::Text,
        field: None,
        input: Kind::Tokens,
        output: Kind::Tokens,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TextTruncate),
    },
    OpInfo {
        name: Pack::OP,
        family: Family::Text,
        field: Some(text::PACK_FIELD),
        input: Kind::Tokens,
        output: Kind::Tokens,
        deterministic: Determinism::Always,
        count: Count::Any,
        parse: |v| typed(v).map(OpConfig::TextPack),
    },
    OpInfo {
        name: Select::OP,
        family: Family::Table,
        field: None,
        input: Kind::Columns,
        output: Kind::Columns,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TableSelect),
    },
    OpInfo {
        name: Cast::OP,
        family: Family::Table,
        field: None,
        input: Kind::Columns,
        output: Kind::Columns,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TableCast),
    },
    OpInfo {
        name: Sleep::OP,
        family: Family::Test,
        field: None,
        input: Kind::Any,
        output: Kind::Any,
        deterministic: Determinism::Always,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::TestSleep),
    },
    OpInfo {
        name: PythonMap::OP,
        family: Family::Python,
        field: None,
        input: Kind::Any,
        output: Kind::Any,
        deterministic: Determinism::Declared,
        count: Count::Same,
        parse: |v| typed(v).map(OpConfig::PythonMap),
    },
    OpInfo {
        name: Filter::OP,
        family: Family::Filter,
        // The field and the kind it reads depend on the predicate (`Filter::field`,
        // `Filter::input_kind`); what it leaves is what it took.
        field: None,
        input: Kind::Any,
        output: Kind::Any,
        deterministic: Determinism::Always,
        count: Count::AtMost,
        parse: |v| typed(v).map(OpConfig::Filter),
    },
    OpInfo {
        name: PythonFilter::OP,
        family: Family::Python,
        field: None,
        input: Kind::Any,
        output: Kind::Any,
        deterministic: Determinism::Declared,
        count: Count::AtMost,
        parse: |v| typed(v).map(OpConfig::PythonFilter),
    },
];

/// Whether an operator's output depends only on its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Determinism {
    /// Always: the same input gives the same output.
    Always,
    /// Never: the operator draws from the element's random stream.
    Never,
    /// As the stage declares in its `deterministic` field (user code), `false` by default.
    Declared,
}

/// How many elements an operator gives for the elements it takes. A pipeline whose stages all
/// give [`Count::Same`] has split output counts known from the listing; any other stage makes
/// them known only once each split is computed (the dispatcher's plan learns them then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// One element out for each element in.
    Same,
    /// Each element in gives one element out or none (a filter).
    AtMost,
    /// A split's elements give any number out, known once the split is computed (packing).
    Any,
}

impl OpInfo {
    /// Whether `stage` (a stage of this operator) always gives the same output for the same
    /// input.
    pub fn deterministic_for(&self, stage: &StageSpec) -> bool {
        match self.deterministic {
            Determinism::Always => true,
            Determinism::Never => false,
            Determinism::Declared => {
                stage.params.get("deterministic") == Some(&serde_json::Value::Bool(true))
            }
        }
    }
}

/// The registry entry for `op`, if it names a built-in operator.
pub fn op_info(op: &str) -> Option<&'static OpInfo> {
    OPS.iter().find(|info| info.name == op)
}

/// The first operator that makes `kind` out of something else (`image.decode` for pixels,
/// `text.tokenize` for tokens).
pub fn producer_of(kind: Kind) -> Option<&'static OpInfo> {
    OPS.iter().find(|info| info.output == kind && info.input != kind)
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
            OpConfig::ImageDecode(_) => Decode::OP,
            OpConfig::ImageResize(_) => Resize::OP,
            OpConfig::ImageCenterCrop(_) => CenterCrop::OP,
            OpConfig::ImageRandomResizedCrop(_) => RandomResizedCrop::OP,
            OpConfig::ImageFlip(_) => Flip::OP,
            OpConfig::ImageNormalize(_) => Normalize::OP,
            OpConfig::TextTokenize(_) => Tokenize::OP,
            OpConfig::TextTruncatePad(_) => TruncatePad::OP,
            OpConfig::TextTruncate(_) => Truncate::OP,
            OpConfig::TextPack(_) => Pack::OP,
            OpConfig::TableSelect(_) => Select::OP,
            OpConfig::TableCast(_) => Cast::OP,
            OpConfig::TestSleep(_) => Sleep::OP,
            OpConfig::PythonMap(_) => PythonMap::OP,
            OpConfig::Filter(_) => Filter::OP,
            OpConfig::PythonFilter(_) => PythonFilter::OP,
        }
    }

    /// Whether this operator always maps the same input to the same output.
    pub fn deterministic(&self) -> bool {
        match self {
            OpConfig::PythonMap(c) => c.deterministic,
            OpConfig::PythonFilter(c) => c.deterministic,
            _ => op_info(self.op_name()).is_some_and(|i| i.deterministic == Determinism::Always),
        }
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
            OpConfig::TextTruncate(c) => c.check(path, problems),
            OpConfig::TextPack(c) => c.check(path, problems),
            OpConfig::TableSelect(c) => c.check(path, problems),
            OpConfig::TableCast(c) => c.check(path, problems),
            OpConfig::TestSleep(c) => c.check(path, problems),
            OpConfig::PythonMap(c) => c.check(path, problems),
            OpConfig::Filter(c) => c.check(path, problems),
            OpConfig::PythonFilter(c) => c.check(path, problems),
        }
    }

    /// The Python call of a Python stage (`python.map`, `python.filter`); `None` for the others.
    pub fn python_call(&self) -> Option<PythonCall> {
        match self {
            OpConfig::PythonMap(c) => Some(c.call()),
            OpConfig::PythonFilter(c) => Some(c.call()),
            _ => None,
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

/// The field an image operator reads and writes when the stage does not name one.
pub(crate) fn default_image_field() -> String {
    IMAGE_FIELD.to_string()
}

/// The field `text.tokenize` reads when the stage does not name one.
pub(crate) fn default_text_field() -> String {
    TEXT_FIELD.to_string()
}
