//! `validate` on specs built in code (as the operator sees them, without a manifest).

use granary_crds::validate::{check_url, deterministic_prefix_len};
use granary_crds::{
    BatchSpec, CachePolicy, CacheSpec, InputPipelineSpec, Problem, ScalingPolicy, ScalingSpec, SourceFormat,
    SourceSpec, StageSpec, validate,
};

fn stage(op: &str, params: serde_json::Value) -> StageSpec {
    StageSpec { op: op.into(), name: None, params: params.as_object().cloned().unwrap_or_default() }
}

fn spec() -> InputPipelineSpec {
    InputPipelineSpec {
        source: Some(SourceSpec {
            url: "s3://bucket/train/".into(),
            format: SourceFormat::Files,
            labels: None,
            files_per_split: None,
            compression: None,
            delimiter: None,
            fields: None,
        }),
        sources: Vec::new(),
        mixing: None,
        stages: vec![
            stage("image.decode", serde_json::json!({})),
            stage("image.resize", serde_json::json!({"size": 256})),
            stage("image.random_resized_crop", serde_json::json!({"size": 224})),
            stage("image.normalize", serde_json::json!({})),
        ],
        shuffle: None,
        batch: BatchSpec { size: 32, drop_remainder: false, pad: None, bucket: None },
        seed: 0,
        epochs: 1,
        scaling: None,
        cache: None,
        workers: None,
        python: None,
        errors: None,
        optimize: true,
    }
}

fn paths(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.path.as_str()).collect()
}

#[test]
fn valid_spec_has_no_problems() {
    assert_eq!(validate(&spec()), vec![]);
}

#[test]
fn urls() {
    let cases = [
        ("s3://bucket/x/", true),
        ("gs://bucket", true),
        ("az://container/x", true),
        ("abfs://container@account.dfs.core.windows.net/x", true),
        ("memory:///", true),
        ("memory://", true),
        ("file:///data/", true),
        ("file://localhost/data/", true),
        ("", false),
        ("data/train", false),
        ("//data/train", false),
        ("file:data/train", false),
        ("file://data/train", false),
        ("s3:///x", false),
        ("s3:x", false),
        ("gs:/x", false),
        ("az:///x", false),
        ("http://example.com/x", false),
        ("ftp://x/y", false),
        ("s3://bucket/x y ", false),
        ("s3://[::1/", false),
    ];
    for (url, ok) in cases {
        let mut problems = Vec::new();
        check_url(url, "u", &mut problems);
        assert_eq!(problems.is_empty(), ok, "{url:?}: {problems:?}");
        for p in &problems {
            assert_eq!(p.path, "u");
        }
    }
}

#[test]
fn scaling_rules() {
    let mut s = spec();
    s.scaling = Some(ScalingSpec { policy: ScalingPolicy::Fixed, ..Default::default() });
    assert_eq!(paths(&validate(&s)), ["spec.scaling.replicas"]);
    s.scaling = Some(ScalingSpec { policy: ScalingPolicy::Fixed, replicas: Some(3), ..Default::default() });
    assert_eq!(validate(&s), vec![]);
    s.scaling = Some(ScalingSpec { min_workers: Some(20), ..Default::default() });
    let p = validate(&s);
    assert_eq!(paths(&p), ["spec.scaling.minWorkers"]);
    assert!(p[0].message.contains("default maxWorkers (16)"), "{}", p[0]);
    s.scaling = Some(ScalingSpec {
        worker_cost_per_hour: Some(f64::INFINITY),
        trainer_cost_per_hour: Some(-1.0),
        ..Default::default()
    });
    assert_eq!(paths(&validate(&s)), ["spec.scaling.workerCostPerHour", "spec.scaling.trainerCostPerHour"]);
}

#[test]
fn cache_rules() {
    let mut s = spec();
    let cache = |policy, at: Option<&str>| CacheSpec {
        policy,
        at: at.map(String::from),
        store: Some("s3://b/cache/".into()),
        ..Default::default()
    };
    assert_eq!(deterministic_prefix_len(&s.stages), 2);
    s.cache = Some(cache(CachePolicy::At, Some("image.resize")));
    assert_eq!(validate(&s), vec![]);
    s.cache = Some(cache(CachePolicy::At, Some("image.normalize")));
    let p = validate(&s);
    assert_eq!(paths(&p), ["spec.cache.at"]);
    assert!(p[0].message.contains("`image.decode`, `image.resize`"), "{}", p[0]);
    s.cache = Some(cache(CachePolicy::At, Some("image.resise")));
    let p = validate(&s);
    assert!(p[0].message.contains("did you mean `image.resize`?"), "{}", p[0]);
    s.cache = Some(cache(CachePolicy::Auto, Some("image.resize")));
    assert_eq!(paths(&validate(&s)), ["spec.cache.at"]);
    s.cache = Some(CacheSpec { policy: CachePolicy::Never, ..Default::default() });
    assert_eq!(validate(&s), vec![]);
    s.cache = Some(CacheSpec::default());
    assert_eq!(paths(&validate(&s)), ["spec.cache.store"]);
    s.cache = Some(CacheSpec {
        store: Some("file:///c/".into()),
        max_bytes: Some(granary_crds::ByteSize::Text("12XB".into())),
        ttl: Some("soon".into()),
        ..Default::default()
    });
    assert_eq!(paths(&validate(&s)), ["spec.cache.maxBytes", "spec.cache.ttl"]);
}

#[test]
fn cache_with_mixed_sources_is_checked_as_with_one_source() {
    let mut s = spec();
    let source = s.source.take().unwrap();
    s.sources = ["web", "code"]
        .into_iter()
        .map(|name| granary_crds::WeightedSource {
            name: name.into(),
            weight: 1.0,
            source: SourceSpec { url: format!("s3://bucket/{name}/"), ..source.clone() },
        })
        .collect();
    let cache = |at: &str| CacheSpec {
        policy: CachePolicy::At,
        at: Some(at.into()),
        store: Some("s3://b/cache/".into()),
        ..Default::default()
    };
    // Each source gets entries of its own: caching mixed sources is legal.
    s.cache = Some(cache("image.resize"));
    assert_eq!(validate(&s), vec![]);
    // And refused for the same reasons, with the same fields, as for one source.
    s.cache = Some(cache("image.normalize"));
    assert_eq!(paths(&validate(&s)), ["spec.cache.at"]);
    s.cache = Some(CacheSpec::default());
    assert_eq!(paths(&validate(&s)), ["spec.cache.store"]);
}

#[test]
fn stage_flow() {
    let mut s = spec();
    s.stages.insert(0, stage("image.flip", serde_json::json!({})));
    let p = validate(&s);
    assert_eq!(paths(&p), ["spec.stages[0].op"]);
    assert!(p[0].message.contains("image.decode"), "{}", p[0]);

    // A second image field needs its own decode.
    let mut s = spec();
    s.stages.push(stage("image.resize", serde_json::json!({"size": 8, "field": "mask"})));
    assert_eq!(paths(&validate(&s)), ["spec.stages[4].op"]);
    s.stages.insert(0, stage("image.decode", serde_json::json!({"field": "mask"})));
    assert_eq!(validate(&s), vec![]);
}

#[test]
fn stage_names() {
    let mut s = spec();
    s.stages[1].name = Some("image.decode".into());
    assert_eq!(paths(&validate(&s)), ["spec.stages[1].name"]);
    // Two unnamed stages of one operator are fine.
    let mut s = spec();
    s.stages.insert(2, stage("image.resize", serde_json::json!({"size": 240})));
    assert_eq!(validate(&s), vec![]);
}

#[test]
fn empty_stages_and_ranges() {
    let mut s = spec();
    s.stages.clear();
    s.batch.size = 0;
    s.epochs = 0;
    s.shuffle = Some(granary_crds::ShuffleSpec { buffer: 0 });
    assert_eq!(
        paths(&validate(&s)),
        ["spec.stages", "spec.shuffle.buffer", "spec.batch.size", "spec.epochs"]
    );
    s.batch.size = 1_000_001;
    assert!(paths(&validate(&s)).contains(&"spec.batch.size"));
}

/// `text.truncate` caps lengths without making them equal, so a token-length filter after it is
/// fine; after `text.truncate_pad`, which pads every sequence to one length, it is refused.
#[test]
fn a_token_filter_after_truncate_is_accepted_and_after_truncate_pad_refused() {
    let spec = |cut: &str| {
        serde_json::from_value::<granary_crds::InputPipelineSpec>(serde_json::json!({
            "source": {"url": "file:///data/", "format": "jsonl"},
            "stages": [
                {"op": "text.tokenize", "tokenizer": "tokenizer.json"},
                serde_json::from_str::<serde_json::Value>(cut).unwrap(),
                {"op": "filter", "predicate": "text.length", "unit": "tokens", "min": 4}
            ],
            "batch": {"size": 8}
        }))
        .unwrap()
    };
    let problems = granary_crds::validate(&spec(r#"{"op": "text.truncate", "length": 16}"#));
    assert!(problems.is_empty(), "{problems:?}");
    let problems = granary_crds::validate(&spec(r#"{"op": "text.truncate_pad", "length": 16}"#));
    assert!(
        problems.iter().any(|p| p.path == "spec.stages[2].op" && p.message.contains("same length")),
        "{problems:?}"
    );
}

#[test]
fn batch_pad_problems_name_the_field() {
    use granary_crds::batch::{PadSpec, PadTo};
    let pad = |fields: &[&str], multiple_of, value, mask: Option<&str>| PadSpec {
        fields: fields.iter().map(|f| f.to_string()).collect(),
        to: PadTo::Longest,
        multiple_of,
        value,
        mask: mask.map(String::from),
    };
    let mut s = spec();
    s.batch.pad = Some(pad(&["input_ids", "attention_mask"], Some(8), 0.0, None));
    assert_eq!(validate(&s), vec![]);
    assert_eq!(s.batch.pad.as_ref().unwrap().mask_name(), "input_ids_mask");
    s.batch.pad = Some(pad(&[], None, 0.0, None));
    assert_eq!(paths(&validate(&s)), ["spec.batch.pad.fields"]);
    s.batch.pad = Some(pad(&["a", "", "a", "m"], Some(0), f64::NAN, Some("m")));
    assert_eq!(
        paths(&validate(&s)),
        [
            "spec.batch.pad.fields[1]",
            "spec.batch.pad.fields[2]",
            "spec.batch.pad.fields[3]",
            "spec.batch.pad.multipleOf",
            "spec.batch.pad.value"
        ]
    );
    s.batch.pad = Some(pad(&["a"], Some(70_000), 0.0, Some("")));
    assert_eq!(paths(&validate(&s)), ["spec.batch.pad.multipleOf", "spec.batch.pad.mask"]);
}

#[test]
fn batch_bucket_problems_name_the_field() {
    use granary_crds::batch::{BucketSpec, PadSpec, PadTo};
    let bucket = |boundaries: &[u64], field: Option<&str>| BucketSpec {
        boundaries: boundaries.to_vec(),
        field: field.map(String::from),
    };
    let mut s = spec();
    s.batch.bucket = Some(bucket(&[16, 32], None));
    assert_eq!(paths(&validate(&s)), ["spec.batch.bucket"], "bucketing needs pad");
    assert!(validate(&s)[0].message.contains("spec.batch.pad"));
    s.batch.pad = Some(PadSpec {
        fields: vec!["input_ids".into(), "attention_mask".into()],
        to: PadTo::Longest,
        multiple_of: None,
        value: 0.0,
        mask: None,
    });
    assert_eq!(validate(&s), vec![]);
    s.batch.bucket = Some(bucket(&[16, 32], Some("attention_mask")));
    assert_eq!(validate(&s), vec![]);
    s.batch.bucket = Some(bucket(&[], None));
    assert_eq!(paths(&validate(&s)), ["spec.batch.bucket.boundaries"]);
    s.batch.bucket = Some(bucket(&[0, 8, 8, 4, 9], Some("label")));
    assert_eq!(
        paths(&validate(&s)),
        [
            "spec.batch.bucket.boundaries[0]",
            "spec.batch.bucket.boundaries[2]",
            "spec.batch.bucket.boundaries[3]",
            "spec.batch.bucket.field"
        ]
    );
    let problems = validate(&s);
    assert!(problems[1].message.contains("strictly increasing"), "{problems:?}");
    assert!(problems[3].message.contains("`input_ids`, `attention_mask`"), "{problems:?}");
}
