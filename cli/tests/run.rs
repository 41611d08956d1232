//! `granary run` and `granary demo` as a user runs them: real processes, generated data.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn granary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_granary"))
}

/// Runs granary and returns stdout; panics with stderr on failure.
fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("granary runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn json_line(stdout: &str) -> Value {
    let line = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(line).expect("valid JSON")
}

fn examples() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples"))
}

fn demo_data(dir: &Path, images: usize) {
    ok(granary().args(["demo", "--no-run", "--images", &images.to_string(), "--dir"]).arg(dir));
}

#[test]
fn demo_generates_data_and_runs_every_example() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(granary().args(["demo", "--json", "--images", "96", "--dir"]).arg(dir.path()));
    let runs: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(runs.len(), 4, "{out}");
    let by_name =
        |n: &str| runs.iter().find(|r| r["pipeline"] == n).unwrap_or_else(|| panic!("{n} in {out}"));
    assert_eq!(by_name("imagenet-resnet50")["items"], 96);
    assert_eq!(by_name("imagenet-resnet50-uint8")["items"], 96);
    // 2048 lines in batches of 256 with dropRemainder: 8 batches.
    assert_eq!(by_name("bert-tokenize")["batches"], 8);
    assert_eq!(by_name("parquet-features")["items"], 4096);
}

#[test]
fn run_json_reports_epochs_and_is_deterministic_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 70);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let run = |threads: &str| {
        json_line(&ok(granary()
            .arg("run")
            .arg(examples().join("imagenet-resnet50.yaml"))
            .args(["--json", "--digest", "--epochs", "2", "--threads", threads])
            .args(["--set", &url, "--set", "spec.batch.size=16"])))
    };
    let one = run("1");
    let two = run("2");
    assert_eq!(one["items"], 140);
    assert_eq!(one["batches"], 10, "4 full + 1 partial per epoch");
    let epochs = one["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    assert_eq!(epochs[0]["items"], 70);
    for key in ["items", "batches", "seconds", "items_per_s"] {
        assert!(one.get(key).is_some(), "missing {key}");
    }
    let digests =
        |v: &Value| v["epochs"].as_array().unwrap().iter().map(|e| e["digest"].clone()).collect::<Vec<_>>();
    assert_eq!(digests(&one), digests(&two), "same batches with 1 and 2 threads");
    assert_ne!(digests(&one)[0], digests(&one)[1], "another epoch, another augmentation");
}

#[test]
fn limit_batches_stops_early() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 40);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let v = json_line(&ok(granary().arg("run").arg(examples().join("imagenet-resnet50.yaml")).args([
        "--json",
        "--limit-batches",
        "2",
        "--set",
        &url,
        "--set",
        "spec.batch.size=8",
    ])));
    assert_eq!(v["batches"], 2);
    assert_eq!(v["items"], 16);
}

#[test]
fn invalid_manifest_is_rejected_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let out = granary()
        .arg("run")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--set", "spec.batch.size=0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.batch.size"), "{stderr}");
}

/// A dataset ten times larger than `--prefetch-bytes` runs within budget + 256 MiB of peak RSS.
/// The JPEGs decode and augment into far more bytes than they occupy on disk (float32 224×224),
/// so an engine that did not bound its in-flight data would exceed the bound many times over.
#[test]
fn peak_rss_stays_within_prefetch_budget() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 1200);
    let dataset: u64 = std::fs::read_dir(dir.path().join("images/train"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let budget = dataset / 10;
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let v = json_line(&ok(granary()
        .arg("run")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--prefetch-bytes", &budget.to_string(), "--set", &url])
        .args(["--set", "spec.batch.size=32", "--set", "spec.shuffle.buffer=16"])));
    assert_eq!(v["items"], 1200);
    // The start-up, then the first batch, both counted from the command's start.
    let startup = v["startup_seconds"].as_f64().expect("startup_seconds");
    let first = v["first_batch_seconds"].as_f64().expect("first_batch_seconds once a batch arrived");
    assert!(startup > 0.0 && first >= startup, "start-up {startup} s, first batch {first} s");
    let peak = v["peak_rss_bytes"].as_u64().expect("VmHWM is reported on Linux");
    let output_bytes = v["bytes"].as_u64().unwrap();
    assert!(output_bytes > dataset * 5, "the test must move far more bytes than the budget");
    assert!(
        peak <= budget + (256 << 20),
        "peak RSS {} MiB exceeds budget {} MiB + 256 MiB (dataset {} MiB)",
        peak >> 20,
        budget >> 20,
        dataset >> 20
    );
}

#[test]
fn bench_reports_the_fast_path_and_its_same_run_ratios() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 48);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let out = ok(granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--warmup", "1", "--batches", "3", "--threads", "2"])
        .args(["--set", &url, "--set", "spec.batch.size=8"]));
    let r = json_line(&out);
    assert_eq!(r["system"], "granary");
    assert_eq!(r["pipeline"], "imagenet-resnet50");
    assert_eq!(r["config"], "float32");
    assert_eq!(r["batches"], 3);
    assert_eq!(r["items"], 24, "3 timed batches of 8");
    for key in
        ["items_per_s", "baseline_items_per_s", "decode_only_items_per_s", "vs_baseline", "vs_decode_only"]
    {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    assert!(r["cores"].as_u64().is_some_and(|c| c >= 1));
    assert_eq!(r["rounds"], 1);

    // In alternating rounds: the same figures, each a median, and the rounds said.
    let out = ok(granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--warmup", "1", "--batches", "2", "--threads", "2", "--rounds", "3"])
        .args(["--set", &url, "--set", "spec.batch.size=8"]));
    let r = json_line(&out);
    assert_eq!((r["rounds"].as_u64(), r["items"].as_u64()), (Some(3), Some(16)), "{r}");
    for key in ["vs_baseline", "vs_decode_only"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    let refused = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--rounds", "0", "--set", &url])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--rounds"), "{refused:?}");
    // Rounds of a comparison that does not run are refused, not ignored.
    for other in [&["--fast-only"][..], &["--workers", "1"]] {
        let refused = granary()
            .arg("bench")
            .arg(examples().join("imagenet-resnet50.yaml"))
            .args(["--rounds", "2", "--set", &url])
            .args(other)
            .output()
            .unwrap();
        assert!(!refused.status.success(), "{other:?}");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be used with"), "{refused:?}");
    }

    // Text mode names the fused stages, the normalization finished per batch, and prints the
    // three figures.
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--warmup", "0", "--batches", "2", "--set", &url, "--set", "spec.batch.size=8"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.stages[0..=2]"), "{err}");
    assert!(err.contains("spec.stages[3]: image.normalize (per batch)"), "{err}");
    assert!(
        text.contains("fast path") && text.contains("baseline") && text.contains("decode only"),
        "{text}"
    );
}

#[test]
fn bench_with_workers_measures_the_served_path_against_in_process() {
    let dir = tempfile::tempdir().unwrap();
    demo_data(dir.path(), 48);
    let url = format!("spec.source.url=file://{}/images/train/", dir.path().display());
    let r = json_line(&ok(granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--json", "--workers", "1", "--warmup", "1", "--batches", "4", "--threads", "2"])
        .args(["--set", &url, "--set", "spec.batch.size=8"])));
    assert_eq!(r["transport"], "grpc-loopback");
    assert_eq!(r["service_workers"], 1);
    assert_eq!(r["items"], 32, "4 timed batches of 8");
    for key in ["items_per_s", "in_process_items_per_s", "vs_in_process", "mb_per_s", "wire_mb_per_s"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    // float32 is normalized by the client: the wire carries a quarter of the bytes.
    let ratio = r["wire_mb_per_s"].as_f64().unwrap() / r["mb_per_s"].as_f64().unwrap();
    assert!(ratio < 0.5, "wire/delivered = {ratio} in {r}");
    assert!(r.get("baseline_items_per_s").is_none(), "served mode skips the baselines: {r}");
}

#[test]
fn bench_rejects_zero_batches_and_bad_manifests() {
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--batches", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batches"));
    let out = granary()
        .arg("bench")
        .arg(examples().join("imagenet-resnet50.yaml"))
        .args(["--set", "spec.batch.size=0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.batch.size"));
}

/// A jsonl pipeline over `files` files of `lines` lines `{"x": i}` each, `test.sleep` for `ms`
/// per element, batches of 8, one split per file.
fn numbers_pipeline(dir: &Path, files: usize, lines: usize, ms: u32, epochs: u32) -> std::path::PathBuf {
    let data = dir.join("numbers");
    std::fs::create_dir_all(&data).unwrap();
    for f in 0..files {
        let text: String = (0..lines).map(|i| format!("{{\"x\": {}}}\n", f * lines + i)).collect();
        std::fs::write(data.join(format!("part-{f:03}.jsonl")), text).unwrap();
    }
    let manifest = dir.join("numbers.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: numbers}}\nspec:\n  \
             source: {{url: 'file://{}/', format: jsonl}}\n  stages: [{{op: test.sleep, ms: {ms}}}]\n  \
             batch: {{size: 8}}\n  epochs: {epochs}\n",
            data.display()
        ),
    )
    .unwrap();
    manifest
}

/// The epoch digests of `granary run --digest --json` with `--workers N`.
fn digests(manifest: &Path, workers: &str) -> (Value, Vec<String>) {
    let v = json_line(&ok(granary().arg("run").arg(manifest).args([
        "--json",
        "--digest",
        "--threads",
        "1",
        "--workers",
        workers,
    ])));
    let d = v["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e["digest"].as_str().expect("a digest per epoch").to_string())
        .collect();
    (v, d)
}

/// The in-process engine batches each split on its own and merges the split tails; the service
/// batches the splits laid end to end and delivers in completion order. Three splits of 10 with
/// batches of 8 cut the same 30 elements differently, and the digest is the same.
#[test]
fn the_digest_is_the_same_in_process_and_through_workers() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = numbers_pipeline(dir.path(), 3, 10, 0, 2);
    let (local, in_process) = digests(&manifest, "0");
    let (served, through_workers) = digests(&manifest, "2");
    assert_eq!(local["items"], 60);
    assert_eq!(served["items"], 60);
    assert_eq!(in_process.len(), 2);
    assert_eq!(in_process, through_workers, "{local}\n{served}");
    // The definition is pinned: SHA-256 over the sorted SHA-256s of the elements (key, and per
    // tensor its name, dtype, row shape and row bytes), here 30 elements `part-00F.jsonl:N` with
    // one int64 `x`. A change to the definition changes this value.
    assert_eq!(in_process[0], "6a0086586ab634e8cb6b3fee1866b4d7362ea1701810462afebcf3f09d367555");
    assert_eq!(in_process[0], in_process[1], "the same elements every epoch: nothing is random");
}

/// A process as `/proc` shows it: its id and start time (so that a reused id is not taken for
/// it), and its parent.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Proc {
    pid: i32,
    parent: i32,
    started: u64,
    zombie: bool,
}

fn read_proc(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: the command may hold spaces and parentheses.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    Some(Proc {
        pid,
        parent: fields.get(1)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
        zombie: fields.first()? == &"Z",
    })
}

/// The living children of `parent`.
fn children(parent: u32) -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_proc)
        .filter(|p| p.parent == parent as i32 && !p.zombie)
        .collect()
}

/// Whether `p` still runs (a zombie has ended; the same id with another start time is another
/// process).
fn alive(p: &Proc) -> bool {
    read_proc(p.pid).is_some_and(|now| now.started == p.started && !now.zombie)
}

/// Polls `done` every 20 ms for at most `seconds` (and at most 50 times a second).
fn within(seconds: u64, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    for _ in 0..seconds * 50 {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    done()
}

/// `granary run --workers 2` mid-epoch, and its two worker processes. Killed on drop, workers
/// too, whatever the test found.
struct Running {
    run: std::process::Child,
    workers: Vec<Proc>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start() -> Running {
        let dir = tempfile::tempdir().unwrap();
        // 4 × 500 elements at 20 ms each on one thread per worker: far longer than the test.
        let manifest = numbers_pipeline(dir.path(), 4, 500, 20, 1);
        let run = granary()
            .arg("run")
            .arg(&manifest)
            .args(["--json", "--workers", "2", "--threads", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("granary runs");
        let mut running = Running { run, workers: Vec::new(), _dir: dir };
        let pid = running.run.id();
        let found = within(60, || {
            running.workers = children(pid);
            running.workers.len() >= 2
        });
        assert!(found, "granary run started {} workers, not 2", running.workers.len());
        assert_eq!(running.workers.len(), 2, "{:?}", running.workers);
        assert!(running.run.try_wait().unwrap().is_none(), "the run is still going");
        running
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, with a valid signal.
        assert_eq!(unsafe { libc::kill(self.run.id() as libc::pid_t, signal) }, 0);
    }

    /// Waits at most 30 s for the run to exit.
    fn exit_status(&mut self) -> std::process::ExitStatus {
        let mut status = None;
        within(30, || {
            status = self.run.try_wait().unwrap();
            status.is_some()
        });
        status.expect("granary run exits")
    }

    fn workers_gone_within(&self, seconds: u64) -> bool {
        within(seconds, || !self.workers.iter().any(alive))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for w in self.workers.iter().filter(|w| alive(w)) {
            // SAFETY: kill(2) on a process this test started (checked by its start time).
            unsafe { libc::kill(w.pid, libc::SIGKILL) };
        }
        let _ = self.run.kill();
        let _ = self.run.wait();
    }
}

/// SIGTERM stops the workers and ends the run with 143 (128 + SIGTERM), as `--serve` stops.
#[test]
fn sigterm_stops_the_run_and_its_workers() {
    let mut running = Running::start();
    running.signal(libc::SIGTERM);
    let status = running.exit_status();
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert!(running.workers_gone_within(5), "workers left: {:?}", running.workers);
}

/// SIGKILL leaves the run no say: the workers end with it all the same.
#[test]
fn sigkill_takes_the_workers_along() {
    let mut running = Running::start();
    running.signal(libc::SIGKILL);
    let status = running.exit_status();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    assert!(running.workers_gone_within(5), "workers left: {:?}", running.workers);
}

/// A filtering pipeline's split counts are learnt as its splits are computed; the service still
/// delivers exactly what the in-process engine does. 40 lines over 4 files, each with a text of
/// `i mod 7` characters; the filter keeps texts of 3 characters or more (4 of each 7).
#[test]
fn a_filtered_pipeline_gives_the_same_digest_in_process_and_through_workers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("texts");
    std::fs::create_dir_all(&data).unwrap();
    let mut kept = 0;
    for f in 0..4 {
        let text: String = (0..10)
            .map(|i| {
                let n = f * 10 + i;
                kept += usize::from(n % 7 >= 3);
                format!("{{\"x\": {n}, \"text\": \"{}\"}}\n", "a".repeat(n % 7))
            })
            .collect();
        std::fs::write(data.join(format!("part-{f:03}.jsonl")), text).unwrap();
    }
    let manifest = dir.path().join("filtered.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: granary.dev/v1alpha1\nkind: InputPipeline\nmetadata: {{name: filtered}}\nspec:\n  \
             source: {{url: 'file://{}/', format: jsonl}}\n  stages:\n    \
             - {{op: filter, predicate: text.length, field: text, unit: chars, min: 3}}\n    \
             - {{op: table.select, columns: [x]}}\n  batch: {{size: 4}}\n  epochs: 2\n",
            data.display()
        ),
    )
    .unwrap();
    let (local, in_process) = digests(&manifest, "0");
    let (served, through_workers) = digests(&manifest, "2");
    assert_eq!(local["items"], 2 * kept);
    assert_eq!(served["items"], 2 * kept);
    assert_eq!(in_process, through_workers, "{local}\n{served}");
}
