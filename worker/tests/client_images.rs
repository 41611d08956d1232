//! Tasks whose images the consumer makes (`Task::images_on_client`): the engine plans the final
//! fused image run instead of running it, and the planned rows, executed as a consumer executes
//! them (`granary_image::row`), give the bytes of the same task run without the mark.

mod support;

use granary_worker::executor::{CacheUse, ClientShare, Output, Task};
use granary_worker::{Batch, Engine, EngineOptions};
use std::path::Path;

fn manifest(name: &str, stages: &str, extra: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: planned}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 8}}
  stages:
{stages}
  shuffle: {{buffer: 5}}
  batch: {{size: 4}}
  seed: 3
  epochs: 1
{extra}"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap_or_else(|p| panic!("{p:?}"))
}

const TRAIN: &str = "    - op: image.decode
    - {op: image.random_resized_crop, size: 12}
    - op: image.flip
    - {op: image.normalize, mean: [0.5, 0.4, 0.3], std: [0.2, 0.2, 0.2], dtype: float32, layout: CHW}";
const VALIDATION: &str = "    - op: image.decode
    - {op: image.resize, size: 14}
    - {op: image.center_crop, size: 12}";

/// An engine as a worker service opens it: the final normalization left to the consumer.
fn served(manifest: &granary_crds::Manifest) -> Engine {
    let options =
        EngineOptions { threads: 2, defer_normalize: true, finish_per_batch: false, ..Default::default() };
    Engine::open(manifest, options).unwrap_or_else(|e| panic!("{e}"))
}

fn run(engine: &Engine, images_on_client: ClientShare) -> Vec<Batch> {
    let tasks: Vec<Task> = engine
        .split_order(0)
        .into_iter()
        .map(|split| Task { epoch: 0, split, cache: CacheUse::Compute, images_on_client })
        .collect();
    let mut batches = Vec::new();
    for output in engine.run_tasks(Box::new(tasks.into_iter())) {
        if let Output::Batch { batch, .. } = output.unwrap_or_else(|e| panic!("{e}")) {
            batches.push(batch);
        }
    }
    batches
}

/// The images of `batch`'s planned `image` rows, made as a consumer makes them.
fn made(batch: &Batch, height: usize, width: usize) -> Vec<u8> {
    let image = batch.tensor("image").expect("image");
    let ragged = batch.ragged.as_ref().expect("planned rows are ragged");
    let offsets = ragged.offsets(1);
    let mut out = vec![0; batch.len() * height * width * 3];
    for (i, pixels) in out.chunks_exact_mut(height * width * 3).enumerate() {
        let row = &image.data[offsets[i]..offsets[i + 1]];
        granary_image::row::execute(row, height, width, pixels).unwrap_or_else(|e| panic!("{e}"));
    }
    out
}

#[test]
fn planned_rows_make_the_images_the_worker_would_have_made() {
    support::dataset("client-images", 20);
    for stages in [TRAIN, VALIDATION] {
        let engine = served(&manifest("client-images", stages, ""));
        let output = engine.planned_output().expect("the pipeline ends in a fused image run").clone();
        assert_eq!((output.field.as_str(), output.height, output.width), ("image", 12, 12));
        let (pixels, planned) = (run(&engine, ClientShare::NONE), run(&engine, ClientShare::ALL));
        assert_eq!(pixels.len(), planned.len());
        for (p, q) in pixels.iter().zip(&planned) {
            assert_eq!(p.keys, q.keys, "the same elements in the same order");
            assert!(p.ragged.is_none());
            let want = &p.tensor("image").unwrap().data;
            assert_eq!(&made(q, 12, 12), want, "{stages}: batch of {:?}", q.keys);
            assert_eq!(p.tensor("label"), q.tensor("label"));
        }
    }
}

/// The kind byte of each of `batch`'s `image` rows.
fn kinds(batch: &Batch) -> Vec<u8> {
    let image = batch.tensor("image").expect("image");
    let offsets = batch.ragged.as_ref().expect("planned rows are ragged").offsets(1);
    (0..batch.len()).map(|i| image.data[offsets[i]]).collect()
}

/// A task whose consumer makes a share of its images plans that share, spread over the split,
/// and makes the rest into rows of pixels: the batches make the same bytes either way.
#[test]
fn a_share_of_a_tasks_images_is_planned_and_the_rest_made() {
    use granary_image::row::{PIXELS, PLANNED};
    support::dataset("client-images-share", 24);
    // Images of 48×48 pixels: larger than every JPEG, so that each can be planned.
    let stages = "    - op: image.decode
    - {op: image.random_resized_crop, size: 48}
    - op: image.flip";
    let engine = served(&manifest("client-images-share", stages, ""));
    let pixels = run(&engine, ClientShare::NONE);
    for (share, planned_of_8) in [(0.25, 2), (0.5, 4), (1.0, 8)] {
        let mixed = run(&engine, ClientShare::of(share));
        assert_eq!(pixels.len(), mixed.len());
        let mut planned = 0;
        for (p, q) in pixels.iter().zip(&mixed) {
            assert_eq!(p.keys, q.keys);
            assert_eq!(&made(q, 48, 48), &p.tensor("image").unwrap().data, "share {share}: {:?}", q.keys);
            let kinds = kinds(q);
            assert!(kinds.iter().all(|&k| k == PIXELS || k == PLANNED));
            planned += kinds.iter().filter(|&&k| k == PLANNED).count();
        }
        // Three splits of 8 images, each with its share planned.
        assert_eq!(planned, 3 * planned_of_8, "share {share}");
    }
}

#[test]
fn only_tasks_that_compute_the_run_plan_it() {
    support::dataset("client-images-not", 8);
    // A normalization of the run's own (uint8 CHW) is not what a plan makes.
    let own = "    - op: image.decode
    - {op: image.random_resized_crop, size: 12}
    - {op: image.normalize, dtype: uint8, layout: CHW}";
    // A stage after the run, and a skip policy (only the worker can drop an image it fails on).
    let after = "    - op: image.decode
    - {op: image.random_resized_crop, size: 12}
    - {op: filter, predicate: image.min_size, minWidth: 1}";
    for (stages, extra) in [(own, ""), (after, ""), (TRAIN, "  errors: {policy: skip}\n")] {
        let engine = served(&manifest("client-images-not", stages, extra));
        let batches = run(&engine, ClientShare::ALL);
        assert!(!batches.is_empty());
        assert!(batches.iter().all(|b| b.ragged.is_none()), "{stages} {extra}: pixels, not plans");
    }
    // An engine that normalizes itself (not served) has nothing to plan.
    let engine = Engine::open(&manifest("client-images-not", TRAIN, ""), EngineOptions::default()).unwrap();
    assert!(engine.planned_output().is_none());
}
