//! Placement follows the trainer's host, end to end. With idle cores to spare, the job's images
//! move to the client: the worker sends each JPEG with its plan, and the client makes the pixels
//! and normalizes them. Once the host is busy, the images and the normalization move back to the
//! worker, and the wire carries `float32` tensors. With some room again, they return. Every element
//! arrives once per epoch throughout, with the bytes the in-process engine makes, wherever it was
//! made.
//!
//! The trainer, the worker and the dispatcher share this machine's cores, and a client whose
//! workers are all on its own host reports no idle figure. So the trainer's host is a stand-in:
//! the client reads its idle cores from a file the test writes (`GRANARY_TEST_HOST_IDLE`).

use granary_e2e::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes of one element's `uint8` 224×224 RGB pixels.
const PIXELS: u64 = 224 * 224 * 3;

/// The job's placement as the dispatcher's gauges show it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Placement {
    image_share: f64,
    normalize_on_worker: bool,
}

fn placement(metrics: &str) -> Option<Placement> {
    let body = scrape(metrics);
    let job = [("trainer_job", "e2e")];
    Some(Placement {
        image_share: sample_with(&body, "granary_dispatcher_job_image_share", &job)?,
        normalize_on_worker: sample_with(&body, "granary_dispatcher_job_normalize_on_worker", &job)? == 1.0,
    })
}

/// Collects batches until the job's placement is `want`, within `timeout`, and returns how long
/// that took; panics with the last placement seen otherwise.
fn until(consumer: &mut Consumer, metrics: &str, want: Placement, timeout: Duration) -> Duration {
    until_that(consumer, metrics, &format!("{want:?}"), |p| p == want, timeout)
}

/// [`until`] a placement for which `holds` is true, described by `what`.
fn until_that(
    consumer: &mut Consumer,
    metrics: &str,
    what: &str,
    holds: impl Fn(Placement) -> bool,
    timeout: Duration,
) -> Duration {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        consumer.collect(consumer.seen.len() + 1_000, Duration::from_millis(250));
        last = placement(metrics);
        if last.is_some_and(&holds) {
            return start.elapsed();
        }
    }
    panic!("placement {last:?} after {timeout:?}, not {what}");
}

/// Lets leases placed before settle out for `settle`, then collects for `window` and returns the
/// batches that arrived in it.
fn window(consumer: &mut Consumer, settle: Duration, window: Duration) -> Vec<Seen> {
    let from = Instant::now() + settle;
    let to = from + window;
    while Instant::now() < to {
        consumer.collect(consumer.seen.len() + 1_000, Duration::from_millis(100));
    }
    let within = |s: &Seen| s.arrived.is_some_and(|at| from <= at && at < to);
    consumer.seen.iter().filter(|s| within(s)).cloned().collect()
}

/// Wire bytes per element over `batches`.
fn wire_per_element(batches: &[Seen]) -> u64 {
    let elements: usize = batches.iter().map(|s| s.keys.len()).sum();
    assert!(elements > 0, "no batch arrived in the window");
    batches.iter().map(|s| s.wire).sum::<u64>() / elements as u64
}

/// The consumer's row digests (`--rows`: SHA-256 over each tensor's name and the row's bytes, in
/// order) of the in-process engine's `epoch`, by element key.
fn in_process_rows(manifest: &Path, epoch: u32) -> BTreeMap<String, String> {
    use sha2::Digest;
    let manifest = granary_crds::load_manifest(manifest, &[]).expect("manifest loads");
    let engine = granary_worker::Engine::open(&manifest, granary_worker::EngineOptions::default())
        .expect("engine opens");
    let mut out = BTreeMap::new();
    for batch in engine.run_epoch(epoch) {
        let batch = batch.expect("batch");
        let rows = batch.keys.len();
        for (i, key) in batch.keys.iter().enumerate() {
            let mut hash = sha2::Sha256::new();
            for t in &batch.tensors {
                let row = t.data.len() / rows;
                hash.update(t.name.as_bytes());
                hash.update(&t.data[i * row..(i + 1) * row]);
            }
            let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
            out.insert(key.clone(), hex);
        }
    }
    out
}

/// Every row of `batches` has the in-process engine's bytes (two epochs of them at most).
fn assert_same_bytes(manifest: &Path, batches: &[Seen], phase: &str) {
    let epochs: BTreeSet<u32> = batches.iter().map(|s| s.epoch).collect();
    for &epoch in epochs.iter().take(2) {
        let want = in_process_rows(manifest, epoch);
        for s in batches.iter().filter(|s| s.epoch == epoch) {
            assert_eq!(s.rows.len(), s.keys.len(), "{phase}: a digest per row");
            for (key, row) in s.keys.iter().zip(&s.rows) {
                assert_eq!(
                    Some(row),
                    want.get(key),
                    "{phase}: epoch {epoch}, {key} differs from the engine's"
                );
            }
        }
    }
}

#[test]
fn images_and_normalization_follow_the_trainer_hosts_idle_cores() {
    let data = large_dataset(48, 8, 8, 100_000);
    let idle = data.dir.path().join("host-idle");
    std::fs::write(&idle, "4").expect("idle file");
    let metrics = format!("127.0.0.1:{}", free_port());
    let d = start_dispatcher_with(
        &data.manifest,
        "127.0.0.1:0",
        &data.dir.path().join("journal"),
        &["--workers", "0", "--metrics-addr", &metrics],
    );
    let _worker = start_worker(&d.address);
    let idle_env = idle.to_str().expect("a UTF-8 path");
    let mut consumer =
        start_consumer_env(&d.address, "e2e", &["--rows"], &[("GRANARY_TEST_HOST_IDLE", idle_env)]);

    // 4 idle cores: every lease's images are made by the client, from JPEGs and plans.
    let on_client = Placement { image_share: 1.0, normalize_on_worker: false };
    let rise = until(&mut consumer, &metrics, on_client, Duration::from_secs(90));
    let idle_batches = window(&mut consumer, Duration::from_secs(2), Duration::from_secs(2));
    let jpegs = wire_per_element(&idle_batches);
    assert!(jpegs < PIXELS / 2, "images on the client: {jpegs} bytes an element on the wire, not JPEGs");
    assert_same_bytes(&data.manifest, &idle_batches, "images on the client");

    // A busy host (0.2 idle cores, under the 0.5 reserve): the worker makes and normalizes them.
    std::fs::write(&idle, "0.2").expect("idle file");
    let on_workers = Placement { image_share: 0.0, normalize_on_worker: true };
    let fall = until(&mut consumer, &metrics, on_workers, Duration::from_secs(30));
    let busy_batches = window(&mut consumer, Duration::from_secs(2), Duration::from_secs(2));
    let floats = wire_per_element(&busy_batches);
    assert!(floats >= PIXELS * 4, "all on the worker: {floats} bytes an element, not float32 pixels");
    assert_same_bytes(&data.manifest, &busy_batches, "all on the worker");

    // Room again, 1.5 cores: enough for the normalization (it comes back for its own cost, not
    // the images' the client made before), and above the share's band, so the images follow.
    // Held at their first step (the host then reports idle cores within the band): every lease
    // has a share of its images made by the client and the rest sent as pixels, so the wire
    // carries less than pixels and more than JPEGs, with the same bytes.
    std::fs::write(&idle, "1.5").expect("idle file");
    let some = |p: Placement| p.image_share > 0.0 && p.image_share < 1.0 && !p.normalize_on_worker;
    until_that(&mut consumer, &metrics, "a share of the images on the client", some, Duration::from_secs(30));
    std::fs::write(&idle, "1.0").expect("idle file");
    let held = window(&mut consumer, Duration::from_secs(2), Duration::from_secs(2));
    let share = placement(&metrics).map(|p| p.image_share).unwrap_or(f64::NAN);
    assert!(share > 0.0 && share < 1.0, "the share held within the band: {share}");
    let mixed = wire_per_element(&held);
    assert!(mixed > jpegs && mixed < PIXELS, "a share of {share}: {mixed} bytes an element on the wire");
    assert_same_bytes(&data.manifest, &held, "a share of the images on the client");
    std::fs::write(&idle, "1.5").expect("idle file");
    let rise_again = until(&mut consumer, &metrics, on_client, Duration::from_secs(90));
    let back = wire_per_element(&window(&mut consumer, Duration::from_secs(2), Duration::from_secs(2)));
    assert!(back < PIXELS / 2, "back on the client: {back} bytes an element");

    // Exactly once in every epoch completed while the work moved.
    let last = consumer.seen.iter().map(|s| s.epoch).max().expect("batches");
    assert!(last >= 3, "only {last} epochs completed");
    assert_exactly_once(&consumer.seen, &data.keys, last);
    eprintln!(
        "to the client in {rise:.1?}, to the worker in {fall:.1?}, back in {rise_again:.1?}; wire bytes an \
         element: {jpegs} (images on the client), {floats} (on the worker), {mixed} (a share of {share:.3} on the \
         client), {back} (back); {last} whole epochs"
    );
}
