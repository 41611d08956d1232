//! A corrupt JPEG in a 2,000-image epoch, across real processes on 127.0.0.1:
//! - under `spec.errors.policy: fail` (the default) its split fails 3 times and is not retried
//!   again: `granary run` exits non-zero with a message naming the file;
//! - under `policy: skip` the 1,999 other images reach two data-parallel consumers exactly once,
//!   in equal batch counts, and the one skip is counted in the dispatcher's and the worker's
//!   metrics and in the run summary, with worker processes and with `--workers 0`;
//! - one skip more than `maxSkipped` fails the run, naming the limit and the file.

use granary_e2e::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IMAGES: usize = 2000;
const CORRUPT: &str = "img_1234.jpg";
const LONG: Duration = Duration::from_secs(60);

/// `IMAGES` 32×32 JPEGs in a new folder, [`CORRUPT`] overwritten with a JPEG's first bytes followed
/// by text; returns the folder, its `train` folder and the keys of the good images.
fn images() -> (tempfile::TempDir, PathBuf, Vec<String>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let train = dir.path().join("train");
    std::fs::create_dir_all(&train).expect("train folder");
    let mut good = Vec::new();
    for i in 0..IMAGES {
        let img = image::RgbImage::from_fn(32, 32, |x, y| {
            image::Rgb([(x * 7 + i as u32) as u8, (y * 5 + (i / 256) as u32) as u8, ((x + y) * 3) as u8])
        });
        let name = format!("img_{i:04}.jpg");
        img.save(train.join(&name)).expect("a JPEG");
        if name != CORRUPT {
            good.push(name);
        }
    }
    // A JPEG start-of-image and the start of a marker, then text where the marker's code is.
    let mut bytes = vec![0xFF, 0xD8, 0xFF];
    bytes.extend(b"garbage: this is not a JPEG, only its first bytes are. ".repeat(8));
    std::fs::write(train.join(CORRUPT), bytes).expect("the corrupt file");
    good.sort();
    (dir, train, good)
}

/// A manifest over `train` in `dir`, with `errors` as the `spec.errors` line (or none).
fn manifest(dir: &Path, train: &Path, errors: &str) -> PathBuf {
    let path = dir.join(format!("pipeline{}.yaml", if errors.is_empty() { "" } else { "-skip" }));
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: files, filesPerSplit: 50}}
  stages:
    - op: image.decode
    - {{op: image.center_crop, size: 32}}
    - {{op: image.flip, p: 0.5}}
  shuffle: {{buffer: 8}}
  batch: {{size: 10}}
  seed: 7
  epochs: 1
{errors}",
        train.display()
    );
    std::fs::write(&path, text).expect("manifest");
    path
}

/// `granary run MANIFEST --workers WORKERS ARGS…` to its end (bounded): exit success, stdout,
/// stderr. With 0 workers the engine runs in the `granary run` process itself.
fn granary_run(manifest: &Path, workers: u32, args: &[&str]) -> (bool, String, String) {
    let child = Command::new(granary_bin())
        .arg("run")
        .arg(manifest)
        .args(["--workers", &workers.to_string(), "--threads", "1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("granary run starts");
    let mut proc = Proc { child };
    let out = drain(proc.child.stdout.take());
    let err = drain(proc.child.stderr.take());
    assert!(proc.wait_for(LONG), "granary run did not end within {LONG:?}");
    let success = proc.child.try_wait().ok().flatten().is_some_and(|s| s.success());
    (success, out.join().unwrap_or_default(), err.join().unwrap_or_default())
}

/// Reads `pipe` to its end on a thread of its own.
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

#[test]
fn under_fail_the_split_fails_three_times_and_the_run_names_the_file() {
    let (dir, train, _) = images();
    let manifest = manifest(dir.path(), &train, "");
    let (success, _, stderr) = granary_run(&manifest, 1, &[]);
    assert!(!success, "the run should fail: {stderr}");
    assert!(stderr.contains(CORRUPT), "the error names the file: {stderr}");
    assert!(stderr.contains("failed 3 times"), "the split was tried 3 times, then not again: {stderr}");
}

#[test]
fn under_skip_every_other_image_arrives_once_and_the_skip_is_counted() {
    let (dir, train, good) = images();
    assert_eq!(good.len(), IMAGES - 1);
    let manifest = manifest(dir.path(), &train, "  errors: {policy: skip, maxSkipped: 10}\n");

    // Served: two consumers, one worker, metrics on both sides.
    let dispatcher_metrics = format!("127.0.0.1:{}", free_port());
    let d = start_dispatcher_with(
        &manifest,
        "127.0.0.1:0",
        &dir.path().join("journal"),
        &["--workers", "0", "--metrics-addr", &dispatcher_metrics],
    );
    let worker_metrics = format!("127.0.0.1:{}", free_port());
    let _worker = start_worker_with(&d.address, &["--metrics-addr", &worker_metrics, "--pipeline", "e2e"]);
    let mut a = start_consumer(&d.address, &["--index", "0", "--consumers", "2"]);
    let mut b = start_consumer(&d.address, &["--index", "1", "--consumers", "2"]);
    assert!(a.finish(LONG), "consumer 0 did not finish");
    assert!(b.finish(LONG), "consumer 1 did not finish");
    assert_exactly_once(a.seen.iter().chain(&b.seen), &good, 1);
    assert_eq!(a.seen.len(), b.seen.len(), "equal batch counts");
    assert_eq!(a.seen.len(), (IMAGES - 1).div_ceil(10).div_ceil(2));
    let labels = [("namespace", "local"), ("pipeline", "e2e")];
    let skipped = |addr: &str, name: &str| {
        // Bounded: the worker refreshes its metrics with each heartbeat, the dispatcher hears of
        // the last split's completion just after its consumer has it.
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let n = sample_with(&scrape(addr), name, &labels);
            if n == Some(1.0) || Instant::now() >= end {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(skipped(&dispatcher_metrics, "granary_dispatcher_elements_skipped_total"), Some(1.0));
    assert_eq!(skipped(&worker_metrics, "granary_worker_elements_skipped_total"), Some(1.0));

    // Run, with a worker process and with the engine in the run's own process: the summary
    // counts the skip, and the items that arrived.
    for workers in [1, 0] {
        let (success, stdout, stderr) = granary_run(&manifest, workers, &["--json"]);
        assert!(success, "--workers {workers}: {stderr}");
        let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_default();
        let summary: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(summary["items"], (IMAGES - 1) as u64, "--workers {workers}: {summary}");
        assert_eq!(summary["skipped_elements"], 1, "--workers {workers}: {summary}");
    }
}

#[test]
fn past_max_skipped_the_run_fails_and_names_the_file() {
    let (dir, train, _) = images();
    let manifest = manifest(dir.path(), &train, "  errors: {policy: skip, maxSkipped: 0}\n");
    for workers in [1, 0] {
        let (success, _, stderr) = granary_run(&manifest, workers, &[]);
        assert!(!success, "--workers {workers}: the run should fail: {stderr}");
        assert!(stderr.contains("maxSkipped"), "--workers {workers}: the error names the limit: {stderr}");
        assert!(stderr.contains(CORRUPT), "--workers {workers}: the error names the file: {stderr}");
    }
}
