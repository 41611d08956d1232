//! `spec.errors`: an undecodable image fails its split, naming the file, under `policy: fail`
//! (the default); under `policy: skip` it is dropped and counted, and every other element comes
//! out, for any thread count. A stage that panics on an element is that stage's error on it,
//! under either policy, not a compute thread lost with its element.

mod support;

use bytes::Bytes;
use granary_crds::SourceSpec;
use granary_worker::executor::{ExecOptions, Output, Plan, Skips, Stage, Task};
use granary_worker::ops::{OpError, Operator};
use granary_worker::seed::SeededRng;
use granary_worker::source::Source;
use granary_worker::store::memory_store;
use granary_worker::tensor::Tensor;
use granary_worker::{Element, Value};
use granary_worker::{Engine, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const IMAGES: usize = 40;
/// The image overwritten with bytes that start like a JPEG and are not one.
const CORRUPT: &str = "00017.jpg";

/// A JPEG start-of-image and the start of a marker, then text where the marker's code should be.
fn corrupt_jpeg() -> Vec<u8> {
    let mut bytes = vec![0xFF, 0xD8, 0xFF];
    bytes.extend(b"garbage: this is not a JPEG, only its first bytes are. ".repeat(8));
    bytes
}

/// `IMAGES` small JPEGs in `memory://NAME/`, one of them corrupt; returns the good keys.
fn dataset(name: &str) -> BTreeSet<String> {
    let labels = support::dataset(name, IMAGES);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let store = memory_store(name);
    let path = StorePath::from(format!("data/train/{CORRUPT}"));
    rt.block_on(store.put(&path, Bytes::from(corrupt_jpeg()).into())).unwrap();
    labels.into_keys().filter(|k| k != CORRUPT).collect()
}

fn manifest(name: &str, errors: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: bad}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 8}}
  stages:
    - op: image.decode
    - {{op: image.random_resized_crop, size: 12}}
    - op: image.flip
  shuffle: {{buffer: 5}}
  batch: {{size: 4}}
  seed: 3
{errors}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap_or_else(|p| panic!("{p:?}"))
}

fn open(manifest: &granary_crds::Manifest, threads: usize) -> Engine {
    let options = EngineOptions { threads, prefetch_bytes: 1 << 20, ..Default::default() };
    Engine::open(manifest, options).unwrap_or_else(|e| panic!("{e}"))
}

/// Each split's index, its count and its skips.
type Splits = Vec<(usize, u64, Skips)>;

/// Runs epoch 0: the keys delivered, each split's skips, and the error that stopped it, if any.
fn run(engine: &Engine) -> (Vec<String>, Splits, Option<String>) {
    let tasks: Vec<Task> = engine.split_order(0).into_iter().map(|s| Task::compute(0, s)).collect();
    let (mut keys, mut splits) = (Vec::new(), Vec::new());
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        match output {
            Ok(Output::Batch { batch, .. }) => keys.extend(batch.keys),
            Ok(Output::SplitDone { task, elements, skipped, .. }) => {
                splits.push((task.split, elements, skipped))
            }
            Err(e) => return (keys, splits, Some(e.to_string())),
        }
    }
    (keys, splits, None)
}

#[test]
fn by_default_a_corrupt_image_fails_its_split_naming_the_file() {
    let good = dataset("bad-elements-fail");
    assert_eq!(good.len(), IMAGES - 1);
    let engine = open(&manifest("bad-elements-fail", ""), 2);
    let (_, splits, error) = run(&engine);
    let error = error.expect("the corrupt image fails the run");
    assert!(error.contains(&format!("`{CORRUPT}`")), "the error names the file: {error}");
    assert!(error.contains("image.decode"), "the error names the stage: {error}");
    assert!(splits.iter().all(|(_, _, s)| s.elements == 0));
}

#[test]
fn with_skip_every_other_image_comes_out_once_and_the_corrupt_one_is_counted() {
    let good = dataset("bad-elements-skip");
    let m = manifest("bad-elements-skip", "  errors: {policy: skip, maxSkipped: 5}\n");
    let mut outputs = Vec::new();
    for threads in [1, 3] {
        let (keys, splits, error) = run(&open(&m, threads));
        assert_eq!(error, None);
        let delivered: BTreeSet<String> = keys.iter().cloned().collect();
        assert_eq!(keys.len(), good.len(), "each good image once");
        assert_eq!(delivered, good);
        let skipped: u64 = splits.iter().map(|(_, _, s)| s.elements).sum();
        assert_eq!(skipped, 1);
        let (split, elements, skips) = splits.iter().find(|(_, _, s)| s.elements == 1).unwrap();
        let first = skips.first.as_deref().unwrap_or_default();
        assert!(first.contains(&format!("`{CORRUPT}`")), "the skip names the file: {first}");
        // The split's count leaves the skipped image out (8 files a split).
        assert_eq!(*elements, 7, "split {split}");
        outputs.push(keys);
    }
    assert_eq!(outputs[0], outputs[1], "the same output for any thread count");
}

/// A stage with a bug: it panics on the element `key`, and makes every other a scalar.
struct PanicsOn(&'static str);

impl Operator for PanicsOn {
    fn apply(&self, element: &mut Element, _: &mut SeededRng) -> Result<(), OpError> {
        assert_ne!(element.key, self.0, "a bug, on purpose");
        element.fields = vec![("x".into(), Value::Tensor(Tensor::scalar_i64(1)))];
        Ok(())
    }
}

/// Runs every split of the images in `memory://NAME/` through [`PanicsOn`] the corrupt file,
/// on 2 compute threads, as tasks fed one at a time like a worker's; returns what
/// [`run`] returns, or `None` when the outputs stop coming for 60 s.
fn run_panicking(name: &str, skip_errors: bool) -> Option<(Vec<String>, Splits, Option<String>)> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let url = format!("memory://{name}/data/train/");
    let spec: SourceSpec =
        serde_json::from_value(serde_json::json!({"url": url, "format": "files", "filesPerSplit": 8}))
            .unwrap();
    let source = Arc::new(rt.block_on(Source::open(&spec, 4)).unwrap());
    let splits = source.splits().len();
    let stage = Stage {
        name: "buggy".into(),
        path: "spec.stages[0]".into(),
        op: Box::new(PanicsOn(CORRUPT)),
        first: 0,
    };
    let plan = Plan {
        stages: vec![stage],
        seed: 3,
        batch_size: 4,
        padding: None,
        bucketing: None,
        shuffle_buffer: 0,
        shuffle_first: false,
        spec_stages: 1,
        cache: None,
        skip_errors,
        client_images: None,
    };
    let options = ExecOptions { threads: 2, most_threads: 2, prefetch_bytes: 1 << 20, finish: None };
    // A feed that stays open, as a worker's does: the execution cannot end by running out of
    // tasks, so a lost element would stall it rather than end it.
    let (feed, tasks) = crossbeam_channel::unbounded();
    for split in 0..splits {
        feed.send(Task::compute(0, split)).unwrap();
    }
    let execution = granary_worker::executor::execute(
        source,
        Arc::new(plan),
        Box::new(tasks.into_iter()),
        options,
        rt.handle().clone(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for output in execution {
            let last = output.is_err();
            if tx.send(output.map_err(|e| e.to_string())).is_err() || last {
                return;
            }
        }
    });
    let (mut keys, mut done, mut error) = (Vec::new(), Vec::new(), None);
    while done.len() < splits && error.is_none() {
        match rx.recv_timeout(Duration::from_secs(60)).ok()? {
            Ok(Output::Batch { batch, .. }) => keys.extend(batch.keys.iter().cloned()),
            Ok(Output::SplitDone { task, elements, skipped, .. }) => {
                done.push((task.split, elements, skipped))
            }
            Err(e) => error = Some(e),
        }
    }
    drop(feed);
    Some((keys, done, error))
}

#[test]
fn a_stage_that_panics_fails_the_run_naming_the_stage_and_the_element() {
    dataset("bad-elements-panic-fail");
    let (_, _, error) = run_panicking("bad-elements-panic-fail", false).expect("the outputs stopped coming");
    let error = error.expect("the panic fails the run");
    assert!(
        error.contains("spec.stages[0] (`buggy`)")
            && error.contains(&format!("`{CORRUPT}`"))
            && error.contains("panicked")
            && error.contains("a bug, on purpose"),
        "{error}"
    );
}

#[test]
fn with_skip_an_element_a_stage_panics_on_is_skipped_and_counted() {
    let good = dataset("bad-elements-panic-skip");
    let (keys, splits, error) =
        run_panicking("bad-elements-panic-skip", true).expect("the outputs stopped coming");
    assert_eq!(error, None);
    assert_eq!(keys.iter().cloned().collect::<BTreeSet<_>>(), good);
    assert_eq!(keys.len(), good.len());
    let skips: Vec<&Skips> = splits.iter().map(|(_, _, s)| s).filter(|s| s.elements > 0).collect();
    assert_eq!(skips.len(), 1);
    let first = skips[0].first.as_deref().unwrap_or_default();
    assert!(first.contains(&format!("`{CORRUPT}`")) && first.contains("panicked"), "{first}");
}
