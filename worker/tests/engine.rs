//! End-to-end tests of the in-process engine over an in-memory object store: element counts,
//! labels, remainders, determinism across runs and thread counts, and per-epoch augmentation.

mod support;

use bytes::Bytes;
use granary_worker::store::memory_store;
use granary_worker::{Batch, Engine, EngineOptions, ImagePath};
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::path::Path;
use support::dataset;

fn manifest(name: &str, batch: usize, drop_remainder: bool, epochs: u32) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: test}}
spec:
  source: {{url: "memory://{name}/data/train/", format: files, labels: ../labels.jsonl, filesPerSplit: 16}}
  stages:
    - op: image.decode
    - op: image.random_resized_crop
      size: 24
    - op: image.flip
    - op: image.normalize
      mean: [0.5, 0.5, 0.5]
      std: [0.25, 0.25, 0.25]
      layout: CHW
  shuffle: {{buffer: 20}}
  batch: {{size: {batch}, dropRemainder: {drop_remainder}}}
  seed: 5
  epochs: {epochs}
"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

/// A budget far smaller than one batch, with a consumer that keeps every batch and splits smaller
/// than a batch (all tails): the reader must never wait on memory the consumer holds.
fn run(manifest: &granary_crds::Manifest, threads: usize, epoch: u32) -> Vec<Batch> {
    let engine =
        Engine::open(manifest, EngineOptions { threads, prefetch_bytes: 64 << 10, ..Default::default() })
            .unwrap();
    engine.run_epoch(epoch).collect::<Result<Vec<_>, _>>().unwrap()
}

fn labels_of(batches: &[Batch]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let t = b.tensor("label").unwrap();
        let labels: &[i64] = bytemuck::cast_slice(&t.data);
        out.extend(b.keys.iter().cloned().zip(labels.iter().copied()));
    }
    out.sort();
    out
}

#[test]
fn one_epoch_yields_every_element_once_with_its_label() {
    let labels = dataset("engine-count", 150);
    let batches = run(&manifest("engine-count", 32, false, 1), 2, 0);
    let got = labels_of(&batches);
    assert_eq!(got.len(), 150);
    let expected: Vec<(String, i64)> = labels.into_iter().collect();
    assert_eq!(got, expected, "every key once, each with its own label");
    let sizes: Vec<usize> = batches.iter().map(Batch::len).collect();
    assert_eq!(sizes, vec![32, 32, 32, 32, 22], "full batches, then the partial remainder");
    let image = batches[0].tensor("image").unwrap();
    assert_eq!(image.shape, vec![32, 3, 24, 24]);
    assert_eq!(image.dtype.name(), "float32");
}

#[test]
fn drop_remainder_drops_the_partial_batch() {
    dataset("engine-drop", 150);
    let batches = run(&manifest("engine-drop", 32, true, 1), 2, 0);
    assert_eq!(batches.iter().map(Batch::len).collect::<Vec<_>>(), vec![32; 4]);
}

#[test]
fn same_seed_is_byte_identical_across_runs_and_threads() {
    dataset("engine-det", 90);
    let m = manifest("engine-det", 16, false, 2);
    let a = run(&m, 1, 0);
    let b = run(&m, 3, 0);
    let c = run(&m, 2, 0);
    assert_eq!(a, b);
    assert_eq!(a, c);
    let other_epoch = run(&m, 2, 1);
    assert_eq!(labels_of(&a), labels_of(&other_epoch), "same elements in every epoch");
    assert_ne!(a[0].keys, other_epoch[0].keys, "another epoch visits in another order");
    // The same element gets another augmentation in another epoch.
    let pixels = |batches: &[Batch], key: &str| -> Vec<u8> {
        for b in batches {
            if let Some(i) = b.keys.iter().position(|k| k == key) {
                let t = b.tensor("image").unwrap();
                let per = t.data.len() / b.len();
                return t.data[i * per..(i + 1) * per].to_vec();
            }
        }
        panic!("{key} missing");
    };
    let key = a[0].keys[0].clone();
    assert_ne!(pixels(&a, &key), pixels(&other_epoch, &key));
}

#[test]
fn a_bad_element_fails_with_its_key_and_stage() {
    let store = memory_store("engine-bad");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(store.put(&StorePath::from("data/train/0.jpg"), Bytes::from_static(b"not a jpeg").into()))
        .unwrap();
    rt.block_on(store.put(
        &StorePath::from("data/labels.jsonl"),
        Bytes::from_static(b"{\"file\":\"train/0.jpg\",\"label\":1}\n").into(),
    ))
    .unwrap();
    // Fused, the error names the fused stages and the one that failed; separate, the stage.
    for (path, expected) in [(ImagePath::Fused, "spec.stages[0..="), (ImagePath::Separate, "spec.stages[0]")]
    {
        let options = EngineOptions { image_path: path, ..Default::default() };
        let engine = Engine::open(&manifest("engine-bad", 4, false, 1), options).unwrap();
        let err = engine.run_epoch(0).find_map(Result::err).expect("an error");
        let msg = err.to_string();
        assert!(msg.contains(expected) && msg.contains("`image.decode`") && msg.contains("0.jpg"), "{msg}");
    }
}

fn run_with(manifest: &granary_crds::Manifest, path: ImagePath, epoch: u32) -> Vec<Batch> {
    let options =
        EngineOptions { threads: 2, prefetch_bytes: 64 << 10, image_path: path, ..Default::default() };
    let engine = Engine::open(manifest, options).unwrap();
    engine.run_epoch(epoch).collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn fused_and_separate_paths_draw_the_same_crops_and_flips() {
    dataset("engine-fused", 40);
    let m = manifest("engine-fused", 8, false, 1);
    let fused = run_with(&m, ImagePath::Fused, 0);
    let separate = run_with(&m, ImagePath::Separate, 0);
    assert_eq!(fused.len(), separate.len());
    let mut total = 0.0;
    let mut count = 0usize;
    for (f, s) in fused.iter().zip(&separate) {
        assert_eq!(f.keys, s.keys, "same order");
        let (a, b) = (f.tensor("image").unwrap(), s.tensor("image").unwrap());
        assert_eq!((&a.shape, a.dtype), (&b.shape, b.dtype));
        let a: &[f32] = bytemuck::cast_slice(&a.data);
        let b: &[f32] = bytemuck::cast_slice(&b.data);
        // Back to 0..255: x = (v / 255 - 0.5) / 0.25.
        for (x, y) in a.iter().zip(b) {
            total += f64::from((x - y).abs()) * 0.25 * 255.0;
            count += 1;
        }
    }
    // Different decoders (libjpeg-turbo with DCT scaling vs. the `image` crate) round
    // differently, but the same crop box and flip leave only small differences; a different
    // box or a missed flip would be off by tens of levels on these gradients.
    let mae = total / count as f64;
    assert!(mae < 4.0, "mean absolute difference {mae:.2} levels");
}

#[test]
fn epochs_back_to_back_equal_epochs_one_at_a_time() {
    dataset("engine-epochs", 50);
    let m = manifest("engine-epochs", 16, false, 2);
    let engine =
        Engine::open(&m, EngineOptions { threads: 2, prefetch_bytes: 64 << 10, ..Default::default() })
            .unwrap();
    let together = engine.run_epochs(0..2).collect::<Result<Vec<_>, _>>().unwrap();
    let mut apart = engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap();
    apart.extend(engine.run_epoch(1).collect::<Result<Vec<_>, _>>().unwrap());
    assert_eq!(together, apart);
    let epochs: Vec<u32> = together.iter().map(|b| b.epoch).collect();
    assert_eq!(epochs, vec![0, 0, 0, 0, 1, 1, 1, 1], "no batch mixes epochs; each ends with its remainder");
}

/// The final normalization runs per batch in this process, after the shuffle, and gives the bits
/// the consumer's own normalization of the `uint8` batches gives (the worker service's form):
/// what the plan lists as `(per batch)` changes where it runs, not the values.
#[test]
fn the_normalization_finished_per_batch_equals_the_consumers() {
    use granary_kernels::normalize::{Layout, lut, normalize_into};
    dataset("engine-finish", 70);
    let m = manifest("engine-finish", 16, false, 1);
    let engine = Engine::open(&m, EngineOptions { threads: 2, ..Default::default() }).unwrap();
    let listed = engine.stages();
    assert_eq!(listed.last(), Some(&("spec.stages[3]", "image.normalize (per batch)")), "{listed:?}");
    let finished = engine.run_epoch(0).collect::<Result<Vec<_>, _>>().unwrap();
    let deferred =
        Engine::open(&m, EngineOptions { threads: 2, defer_normalize: true, ..Default::default() })
            .unwrap()
            .run_epoch(0)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
    assert_eq!(finished.len(), deferred.len());
    let table = lut([0.5; 3], [0.25; 3]);
    for (f, d) in finished.iter().zip(&deferred) {
        assert_eq!(f.keys, d.keys, "the same elements in the same order");
        let (fi, di) = (f.tensor("image").unwrap(), d.tensor("image").unwrap());
        assert_eq!((fi.dtype.name(), di.dtype.name()), ("float32", "uint8"));
        assert_eq!(fi.shape, vec![f.len(), 3, 24, 24]);
        let mut expected = Vec::new();
        for image in di.data.chunks_exact(24 * 24 * 3) {
            normalize_into(image, 24, &table, Layout::Chw, false, &mut expected);
        }
        assert_eq!(fi.data, bytemuck::cast_slice::<f32, u8>(&expected), "the same bits");
        assert_eq!(f.tensor("label"), d.tensor("label"));
    }
}
