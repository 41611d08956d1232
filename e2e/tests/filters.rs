//! Pipelines whose split output counts are known only once computed (a filter), across real
//! processes on 127.0.0.1: the dispatcher learns the counts as splits are counted, and two
//! data-parallel consumers still get every surviving element exactly once, in equal batch
//! counts, when a worker is killed mid-epoch.

use granary_e2e::*;
use std::path::Path;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);
/// Demo images are 160 to 400 pixels wide: this keeps about half of them.
const MIN_WIDTH: u32 = 280;

/// `images` demo JPEGs behind a pipeline that drops those narrower than [`MIN_WIDTH`], with
/// 224×224 float32 crops so that workers are still producing when a test interrupts them.
/// Returns the folder, the manifest and the keys that survive the filter.
fn filtered(
    images: usize,
    batch: u32,
    files_per_split: u32,
    epochs: u32,
) -> (tempfile::TempDir, std::path::PathBuf, Vec<String>) {
    let (dir, train) = demo_images(images);
    let mut kept: Vec<String> = Vec::new();
    let mut all = 0;
    for entry in std::fs::read_dir(&train).expect("images") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "jpg") {
            all += 1;
            let (width, _) = image::image_dimensions(&path).expect("a readable JPEG");
            if width >= MIN_WIDTH {
                kept.push(path.file_name().expect("name").to_string_lossy().into_owned());
            }
        }
    }
    kept.sort();
    assert!(kept.len() > all / 5 && kept.len() < all * 4 / 5, "the filter should keep part of the images");
    let manifest = dir.path().join("pipeline.yaml");
    write_manifest(&manifest, &train, batch, files_per_split, epochs);
    (dir, manifest, kept)
}

fn write_manifest(manifest: &Path, train: &Path, batch: u32, files_per_split: u32, epochs: u32) {
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: files, labels: ../labels.jsonl, filesPerSplit: {files_per_split}}}
  stages:
    - op: image.decode
    - {{op: filter, predicate: image.min_size, minWidth: {MIN_WIDTH}}}
    - {{op: image.random_resized_crop, size: 224}}
    - {{op: image.flip, p: 0.5}}
    - {{op: image.normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}}
  shuffle: {{buffer: 8}}
  batch: {{size: {batch}}}
  seed: 5
  epochs: {epochs}
",
        train.display()
    );
    std::fs::write(manifest, text).expect("manifest");
}

#[test]
fn filtered_elements_arrive_once_in_equal_batch_counts_despite_a_killed_worker() {
    let (dir, manifest, kept) = filtered(240, 8, 16, 2);
    let d = start_dispatcher(&manifest, "127.0.0.1:0", &dir.path().join("journal"));
    let workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
    let mut a = start_consumer(&d.address, &["--index", "0", "--consumers", "2", "--step-ms", "5"]);
    let mut b = start_consumer(&d.address, &["--index", "1", "--consumers", "2", "--step-ms", "5"]);
    a.collect(3, LONG);
    workers[1].signal(libc::SIGKILL);
    assert!(a.finish(LONG), "consumer 0 did not finish after a worker was killed");
    assert!(b.finish(LONG), "consumer 1 did not finish after a worker was killed");
    assert_exactly_once(a.seen.iter().chain(&b.seen), &kept, 2);
    for epoch in 0..2 {
        let na = a.seen.iter().filter(|s| s.epoch == epoch).count();
        let nb = b.seen.iter().filter(|s| s.epoch == epoch).count();
        assert_eq!(na, nb, "epoch {epoch}: consumers got {na} and {nb} batches");
        // Every batch but those of the last round is full.
        let rows: usize =
            a.seen.iter().chain(&b.seen).filter(|s| s.epoch == epoch).map(|s| s.keys.len()).sum();
        assert_eq!(rows, kept.len());
        assert_eq!(na, kept.len().div_ceil(8).div_ceil(2), "epoch {epoch}: batches per consumer");
    }
}

#[test]
fn a_filtered_epoch_resumes_after_the_dispatcher_restarts() {
    let (dir, manifest, kept) = filtered(160, 8, 8, 1);
    let journal = dir.path().join("journal");
    let mut d = start_dispatcher(&manifest, "127.0.0.1:0", &journal);
    let address = d.address.clone();
    let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&address)).collect();
    let mut c = start_consumer(&address, &["--step-ms", "5"]);
    c.collect(3, LONG);
    d.proc.signal(libc::SIGKILL);
    assert!(d.proc.wait_for(Duration::from_secs(10)));
    let _d2 = start_dispatcher(&manifest, &address, &journal);
    assert!(c.finish(LONG), "the consumer did not finish after the dispatcher restarted");
    assert_exactly_once(&c.seen, &kept, 1);
}

#[test]
fn a_checkpoint_of_a_filtered_epoch_resumes_in_a_new_process() {
    let (dir, manifest, kept) = filtered(160, 8, 8, 1);
    let d = start_dispatcher(&manifest, "127.0.0.1:0", &dir.path().join("journal"));
    let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
    let checkpoint = dir.path().join("position");
    let cp = checkpoint.display().to_string();
    let mut first = start_consumer(&d.address, &["--stop-after", "3", "--checkpoint", &cp]);
    assert!(first.finish(LONG), "the first consumer did not stop cleanly");
    assert_eq!(first.seen.len(), 3);
    let mut second = start_consumer(&d.address, &["--resume", &cp]);
    assert!(second.finish(LONG), "the resumed consumer did not finish");
    assert_exactly_once(first.seen.iter().chain(&second.seen), &kept, 1);
}
