//! `spec.errors`: an undecodable image fails its split, naming the file, under `policy: fail`
//! (the default); under `policy: skip` it is dropped and counted, and every other element comes
//! out, for any thread count.

mod support;

use bytes::Bytes;
use granary_worker::executor::{Output, Skips, Task};
use granary_worker::store::memory_store;
use granary_worker::{Engine, EngineOptions};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::BTreeSet;
use std::path::Path;

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
