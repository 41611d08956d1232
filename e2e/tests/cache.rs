//! The autocacher end to end: `granary run` (dispatcher in process, worker processes) over large
//! JPEGs whose decode and resize dominate, with a real S3-compatible server (`s3s-fs`) or a
//! `file://` store as the cache.
//!
//! - With `policy: auto` the first epoch writes and the later ones read, delivering exactly what
//!   `policy: never` delivers; a second pipeline with the same deterministic prefix reads the
//!   first one's entry and writes nothing.
//! - Behind a slow store (the test-only throttle) the autocacher computes.
//! - The store going away mid-write and mid-read: every epoch is still delivered in full, and
//!   every split entry that became visible verifies.

use granary_e2e::s3::S3Server;
use granary_e2e::*;
use granary_store::cache::{CacheStore, Fingerprint};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Milliseconds a deterministic stage of the prefix waits per element, so that epochs outlast
/// the profile (measured beside the first splits, which compute until the decision), and so
/// that reading an entry is clearly faster than computing: near a tie, the closed loop may
/// rightly switch between the two on an epoch's noise, and these tests check the modes. It runs
/// right after the decode, so that no pipeline of these tests fuses the decode with the resize:
/// `policy: never` would fuse them where `auto` keeps them apart, and the two would compute
/// other (if close) pixels.
const SLEEP_MS: u32 = 60;
const EPOCHS: usize = 5;
const IMAGES: usize = 48;
const SPLITS: u64 = 12;

/// Writes `n` smooth, noisy `w`×`h` JPEGs under `dir/images/`.
fn images(dir: &Path, n: usize, w: u32, h: u32) -> PathBuf {
    let out = dir.join("images");
    std::fs::create_dir_all(&out).expect("image folder");
    for i in 0..n {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            let noise = ((x * 7919 + y * 104_729 + i as u32 * 31) % 23) as u8;
            let r = ((x / 7 + i as u32 * 9) % 256) as u8 ^ noise;
            let b = (((x + y) / 11) % 256) as u8;
            image::Rgb([r, ((y / 5) % 256) as u8, b.wrapping_add(noise)])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 85).encode_image(&img).expect("jpeg");
        std::fs::write(out.join(format!("{i:04}.jpg")), jpeg).expect("write jpeg");
    }
    out
}

/// A pipeline over `source`: decode, resize and crop (deterministic), then a random flip and
/// `extra` stages; `cache` is the `spec.cache` block.
fn manifest(dir: &Path, name: &str, source: &Path, size: u32, cache: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: {name}}}
spec:
  source: {{url: 'file://{}/', format: files, filesPerSplit: 4}}
  stages:
    - op: image.decode
    - {{op: test.sleep, ms: {SLEEP_MS}}}
    - {{op: image.resize, size: {size}}}
    - {{op: image.center_crop, size: {size}, name: crop}}
    - {{op: image.flip}}
{extra}  shuffle: {{buffer: 4}}
  batch: {{size: 4}}
  seed: 3
  epochs: {EPOCHS}
  cache:
{cache}",
        source.display()
    );
    std::fs::write(&path, text).expect("manifest");
    path
}

/// `granary run MANIFEST --json --digest --workers 1 ARGS` with `env`; the summary.
fn run(manifest: &Path, args: &[&str], env: &[(String, String)]) -> Value {
    let output = Command::new(granary_bin())
        .arg("run")
        .arg(manifest)
        .args(["--json", "--digest", "--workers", "1", "--threads", "2"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stderr(Stdio::inherit())
        .output()
        .expect("granary run starts");
    assert!(output.status.success(), "granary run failed: {}", String::from_utf8_lossy(&output.stdout));
    serde_json::from_slice(&output.stdout).expect("one JSON summary")
}

fn epochs(summary: &Value) -> &Vec<Value> {
    summary["epochs"].as_array().expect("epochs")
}

fn modes(summary: &Value) -> Vec<String> {
    epochs(summary).iter().map(|e| e["cache"].as_str().unwrap_or("-").to_string()).collect()
}

fn digests(summary: &Value) -> Vec<String> {
    epochs(summary).iter().map(|e| e["digest"].as_str().expect("digest").to_string()).collect()
}

fn items(summary: &Value) -> Vec<u64> {
    epochs(summary).iter().map(|e| e["items"].as_u64().expect("items")).collect()
}

fn bytes(summary: &Value, field: &str) -> Vec<u64> {
    epochs(summary).iter().map(|e| e[field].as_u64().unwrap_or(0)).collect()
}

fn s3_cache(policy: &str) -> String {
    let at = if policy == "at" { "    at: crop\n" } else { "" };
    format!("    policy: {policy}\n{at}    store: s3://cache/entries/\n")
}

/// Every split entry that is visible (has a manifest) reads back whole and verified.
fn assert_visible_entries_verify(store: &CacheStore, rt: &tokio::runtime::Runtime) -> usize {
    let entries = rt.block_on(store.list_entries()).expect("list entries");
    let mut splits = 0;
    for entry in entries {
        let fp = Fingerprint::parse(&entry.fingerprint).expect("fingerprint");
        let done = rt.block_on(store.completed_splits(&fp)).expect("completed splits");
        for split in done.keys() {
            let manifest = rt.block_on(store.open_split(&fp, *split)).expect("a visible manifest opens");
            for i in 0..manifest.chunks.len() {
                rt.block_on(store.read_chunk(&fp, &manifest, i)).unwrap_or_else(|e| {
                    panic!("split {split} of {fp}: a visible entry does not verify: {e}")
                });
            }
            splits += 1;
        }
    }
    splits
}

fn cache_store(server: &S3Server) -> CacheStore {
    // The library reads the same variables the workers do.
    for (k, v) in server.env() {
        // SAFETY: set before any thread of this test reads the environment.
        unsafe { std::env::set_var(k, v) };
    }
    CacheStore::open("s3://cache/entries/").expect("cache store")
}

#[test]
fn auto_writes_once_reads_after_and_shares_the_entry_with_a_second_pipeline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = images(dir.path(), IMAGES, 1600, 1200);
    let s3 = S3Server::start(&dir.path().join("s3"), 0, &["cache"]);
    let env = s3.env();

    let auto = manifest(dir.path(), "first", &source, 96, &s3_cache("auto"), "");
    let cached = run(&auto, &[], &env);
    // The first splits compute while the profile is measured; the epoch writes the rest, the
    // next writes what is missing (if anything) and reads the others; the last one only reads.
    let m = modes(&cached);
    assert!(m.iter().any(|m| m == "write") && m[EPOCHS - 1] == "read", "{cached}");
    let written = bytes(&cached, "cache_bytes_written");
    assert!(written.iter().sum::<u64>() > 0 && written[EPOCHS - 1] == 0, "{written:?}");
    let last = &cached["cache"]["epochs"][EPOCHS - 1];
    assert_eq!(
        (last["splits_read"].as_u64(), last["splits_computed"].as_u64()),
        (Some(SPLITS), Some(0)),
        "{cached}"
    );
    for e in epochs(&cached) {
        assert!(e["predicted_items_per_s"].as_f64().is_some_and(|p| p > 0.0), "{e}");
    }
    // The decision shown is the latest: the first one writes; when an epoch's outcome was off
    // its prediction by more than the tolerance, the closed loop re-decided, and with the entry
    // complete by then, it reads.
    let reason = cached["cache"]["decision"]["reason"].as_str().unwrap_or_default();
    if cached["cache"]["redecisions"].as_u64().unwrap_or(0) == 0 {
        assert!(reason.contains("write"), "{reason}");
    } else {
        let checks = cached["cache"]["checks"].as_array().cloned().unwrap_or_default();
        let redecided = checks.iter().filter(|c| c["verdict"] == "re-decided").count();
        assert!(reason.contains("read") && redecided >= 1, "{reason} / {checks:?}");
    }

    // Element for element what computing delivers, in every epoch.
    let never = manifest(dir.path(), "first-never", &source, 96, "    policy: never\n", "");
    let computed = run(&never, &[], &env);
    assert_eq!(items(&cached), vec![IMAGES as u64; EPOCHS]);
    assert_eq!(digests(&cached), digests(&computed));

    // Another pipeline, another name and suffix, the same deterministic prefix: it reads.
    let other_suffix = "    - {op: image.flip, p: 0.3}\n";
    let second = manifest(dir.path(), "second", &source, 96, &s3_cache("auto"), other_suffix);
    let shared = run(&second, &[], &env);
    // Its first splits compute while its own profile is measured; from then on it reads.
    assert_eq!(modes(&shared)[1..], vec!["read"; EPOCHS - 1], "{shared}");
    assert_eq!(bytes(&shared, "cache_bytes_written"), vec![0; EPOCHS]);
    // The decision in effect reads (its reason may start with the closed loop's last check).
    assert_eq!(shared["cache"]["decision"]["action"]["action"], "read", "{shared}");
    assert!(shared["cache"]["decision"]["reason"].as_str().unwrap_or_default().contains("read"), "{shared}");
    let alone = run(
        &manifest(dir.path(), "second-never", &source, 96, "    policy: never\n", other_suffix),
        &[],
        &env,
    );
    assert_eq!(digests(&shared), digests(&alone));

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = cache_store(&s3);
    assert_eq!(rt.block_on(store.list_entries()).expect("entries").len(), 1, "one entry, shared");
    assert_eq!(assert_visible_entries_verify(&store, &rt), SPLITS as usize);
}

#[test]
fn behind_a_slow_store_auto_computes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = images(dir.path(), IMAGES, 1600, 1200);
    let store = dir.path().join("cache");
    std::fs::create_dir_all(&store).expect("cache folder");
    let cache = format!("    policy: auto\n    store: 'file://{}/'\n", store.display());
    // A big output (256×256 pixels) from a 1 MB/s store is slower to read than to compute.
    let m = manifest(dir.path(), "slow", &source, 256, &cache, "");
    let throttle = [(
        "GRANARY_TEST_CACHE_THROTTLE".to_string(),
        "get_per_byte_ns=1000,put_per_byte_ns=1000".to_string(),
    )];
    let summary = run(&m, &[], &throttle);
    assert_eq!(modes(&summary), vec!["compute"; EPOCHS], "{summary}");
    assert_eq!(bytes(&summary, "cache_bytes_written"), vec![0; EPOCHS]);
    assert_eq!(summary["cache"]["decision"]["action"]["action"], "compute", "{summary}");
    let reason = summary["cache"]["decision"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("compute"), "{reason}");
}

/// Starts `granary run` in the background; its JSON summary comes from `finish`.
struct Background(std::process::Child);

impl Background {
    fn start(manifest: &Path, env: &[(String, String)], metrics: &str) -> Background {
        let child = Command::new(granary_bin())
            .arg("run")
            .arg(manifest)
            .args(["--json", "--digest", "--workers", "1", "--threads", "2", "--metrics-addr", metrics])
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .spawn()
            .expect("granary run starts");
        Background(child)
    }

    fn finish(self) -> Value {
        let output = self.0.wait_with_output().expect("granary run ends");
        assert!(output.status.success(), "granary run failed");
        serde_json::from_slice(&output.stdout).expect("one JSON summary")
    }
}

/// Waits until the dispatcher at `metrics` says the cache read something (bounded).
fn wait_for_reads(metrics: &str, pipeline: &str, timeout: Duration) -> bool {
    let series = format!(
        "granary_cache_bytes_total{{direction=\"read\",namespace=\"local\",pipeline=\"{pipeline}\"}}"
    );
    let start = Instant::now();
    while start.elapsed() < timeout {
        if std::net::TcpStream::connect(metrics).is_ok()
            && sample(&scrape(metrics), &series).is_some_and(|b| b > 0.0)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Waits until a split manifest of an entry exists under `root` (bounded).
fn wait_for_manifest(root: &Path, timeout: Duration) -> bool {
    let start = Instant::now();
    fn any_manifest(dir: &Path) -> bool {
        std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
            let p = e.path();
            if p.is_dir() { any_manifest(&p) } else { p.file_name().is_some_and(|n| n == "manifest.json") }
        })
    }
    while start.elapsed() < timeout {
        if any_manifest(root) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn the_store_going_away_mid_write_and_mid_read_loses_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let source = images(dir.path(), IMAGES, 1600, 1200);
    let root = dir.path().join("s3");
    let s3 = S3Server::start(&root, 0, &["cache"]);
    let port = s3.port;
    let env = s3.env();
    let m = manifest(dir.path(), "away", &source, 96, &s3_cache("at"), "");
    let computed =
        run(&manifest(dir.path(), "away-never", &source, 96, "    policy: never\n", ""), &[], &env);

    // Mid-write: slow uploads, and the server is killed once the first split is published.
    let mut slow = env.clone();
    slow.push(("GRANARY_TEST_CACHE_THROTTLE".into(), "put_per_byte_ns=4000".into()));
    let writing = Background::start(&m, &slow, &format!("127.0.0.1:{}", free_port()));
    assert!(wait_for_manifest(&root.join("cache"), Duration::from_secs(120)), "nothing was published");
    s3.kill();
    let summary = writing.finish();
    assert_eq!(items(&summary), vec![IMAGES as u64; EPOCHS], "{summary}");
    assert_eq!(digests(&summary), digests(&computed));

    // Back up: whatever became visible verifies; the rest was never published.
    let s3 = S3Server::start(&root, port, &["cache"]);
    let store = cache_store(&s3);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let visible = assert_visible_entries_verify(&store, &rt);
    assert!(
        (1..SPLITS as usize).contains(&visible),
        "{visible} splits visible: the kill came too late or too early"
    );

    // Mid-read: complete the entry, then read it slowly and kill the server during the reads.
    let complete = run(&m, &[], &env);
    assert_eq!(digests(&complete), digests(&computed));
    assert_eq!(assert_visible_entries_verify(&store, &rt), SPLITS as usize);
    let mut slow = env.clone();
    slow.push(("GRANARY_TEST_CACHE_THROTTLE".into(), "get_per_byte_ns=2000".into()));
    let metrics = format!("127.0.0.1:{}", free_port());
    let reading = Background::start(&m, &slow, &metrics);
    assert!(wait_for_reads(&metrics, "away", Duration::from_secs(120)), "nothing was read");
    s3.kill();
    let summary = reading.finish();
    assert_eq!(items(&summary), vec![IMAGES as u64; EPOCHS], "{summary}");
    assert_eq!(digests(&summary), digests(&computed));
    let read = bytes(&summary, "cache_bytes_read");
    assert!(read.iter().sum::<u64>() > 0, "nothing was read before the kill: {summary}");
    let report = &summary["cache"]["epochs"];
    let fell_back: u64 = report
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["splits_computed"].as_u64().unwrap_or(0) + e["recomputed"].as_u64().unwrap_or(0))
        .sum();
    assert!(fell_back > 0, "the reads never fell back to computing: {summary}");
}
