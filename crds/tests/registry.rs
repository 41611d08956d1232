//! The operator registry: every row's facts agree with its name and its typed config.

use granary_crds::ops::{Determinism, Family, Kind, OPS, OpConfig, op_info, producer_of};
use granary_crds::{SourceFormat, StageSpec};

/// The least fields that make a valid stage of `op`.
fn fields(op: &str) -> serde_json::Value {
    match op {
        "image.resize" | "image.center_crop" | "image.random_resized_crop" => serde_json::json!({"size": 8}),
        "text.tokenize" => serde_json::json!({"tokenizer": "tokenizer.json"}),
        "text.truncate_pad" | "text.truncate" => serde_json::json!({"length": 8}),
        "text.pack" => serde_json::json!({"length": 8, "eos": 2}),
        "table.select" => serde_json::json!({"columns": ["a"]}),
        "table.cast" => serde_json::json!({"columns": {"a": "int64"}}),
        "test.sleep" => serde_json::json!({"ms": 1}),
        "python.map" | "python.filter" => serde_json::json!({"function": "augment:jitter"}),
        "filter" => serde_json::json!({"predicate": "text.length", "unit": "chars", "min": 1}),
        _ => serde_json::json!({}),
    }
}

#[test]
fn every_row_parses_into_its_own_config() {
    for info in OPS {
        let stage = StageSpec {
            op: info.name.into(),
            name: None,
            params: fields(info.name).as_object().cloned().unwrap_or_default(),
        };
        let config = OpConfig::parse(&stage, "s").unwrap_or_else(|p| panic!("{}: {p:?}", info.name));
        assert_eq!(config.op_name(), info.name);
        // A stage that declares nothing is not deterministic.
        assert_eq!(config.deterministic(), info.deterministic == Determinism::Always, "{}", info.name);
        assert_eq!(info.deterministic_for(&stage), config.deterministic(), "{}", info.name);
        assert_eq!(OPS.iter().filter(|i| i.name == info.name).count(), 1, "{} is listed once", info.name);
    }
}

#[test]
fn families_match_the_name_prefix() {
    for info in OPS {
        let prefix = match info.family {
            Family::Image => "image.",
            Family::Text => "text.",
            Family::Table => "table.",
            Family::Test => "test.",
            Family::Python => "python.",
            Family::Filter => "filter",
        };
        assert!(info.name.starts_with(prefix), "{} is in {:?}", info.name, info.family);
    }
    let image = Family::Image.format_fit().unwrap();
    assert_eq!(image.formats, [SourceFormat::Files, SourceFormat::Webdataset, SourceFormat::Tfrecord]);
    let table = Family::Table.format_fit().unwrap();
    assert_eq!(
        table.formats,
        [SourceFormat::Jsonl, SourceFormat::Parquet, SourceFormat::Tfrecord, SourceFormat::Csv]
    );
    assert!(Family::Text.format_fit().is_none() && Family::Test.format_fit().is_none());
}

#[test]
fn fields_and_kinds() {
    for info in OPS.iter().filter(|i| i.family == Family::Image) {
        assert_eq!(info.field, Some("image"), "{}", info.name);
    }
    assert_eq!(op_info("text.tokenize").unwrap().field, Some("text"));
    assert_eq!(op_info("text.truncate_pad").unwrap().field, None);
    assert_eq!(producer_of(Kind::Pixels).map(|i| i.name), Some("image.decode"));
    assert_eq!(producer_of(Kind::Tokens).map(|i| i.name), Some("text.tokenize"));
    let finishers: Vec<&str> = OPS.iter().filter(|i| i.output == Kind::ImageTensor).map(|i| i.name).collect();
    assert_eq!(finishers, ["image.normalize"]);
    let random: Vec<&str> =
        OPS.iter().filter(|i| i.deterministic == Determinism::Never).map(|i| i.name).collect();
    assert_eq!(random, ["image.random_resized_crop", "image.flip"]);
}

#[test]
fn user_code_is_deterministic_only_when_it_says_so() {
    let stage = |deterministic: Option<bool>| {
        let mut params = serde_json::json!({"function": "augment:jitter"}).as_object().cloned().unwrap();
        if let Some(d) = deterministic {
            params.insert("deterministic".into(), d.into());
        }
        StageSpec { op: "python.map".into(), name: None, params }
    };
    let info = op_info("python.map").unwrap();
    assert_eq!(info.deterministic, Determinism::Declared);
    for (declared, expected) in [(None, false), (Some(false), false), (Some(true), true)] {
        let s = stage(declared);
        assert_eq!(info.deterministic_for(&s), expected);
        assert_eq!(OpConfig::parse(&s, "s").unwrap().deterministic(), expected);
        assert_eq!(
            granary_crds::validate::deterministic_prefix_len(std::slice::from_ref(&s)),
            usize::from(expected)
        );
    }
}
