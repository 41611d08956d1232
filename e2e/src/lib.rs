//! The harness of Granary's multi-process tests: a generated dataset, the `granary` binary as
//! dispatcher (`run --serve`) and workers (`worker`), and consumer processes, all on 127.0.0.1.
//! Every wait is bounded; every child is killed when its handle drops.

pub mod chaos;
pub mod node;
pub mod prometheus;
pub mod s3;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The folder the test binaries live in (`target/<profile>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> → target/<profile>
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
}

/// The `granary` binary: `$GRANARY_BIN`, or the one built next to the tests.
pub fn granary_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GRANARY_BIN") {
        return p.into();
    }
    let path = target_dir().join("granary");
    assert!(path.exists(), "{} is missing: build it first (cargo build -p granary-cli)", path.display());
    path
}

/// The consumer stand-in binary of this crate (built with the tests).
pub fn consume_bin() -> PathBuf {
    target_dir().join("granary-e2e-consume")
}

/// A child process killed on drop.
pub struct Proc {
    /// The child.
    pub child: Child,
}

impl Proc {
    /// Sends `signal` (e.g. `libc::SIGKILL`).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// Waits for the exit, up to `timeout`; true when it exited.
    pub fn wait_for(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A dataset of generated JPEGs and a manifest over it.
pub struct Dataset {
    /// Temporary folder holding everything.
    pub dir: tempfile::TempDir,
    /// The manifest file.
    pub manifest: PathBuf,
    /// Every element key.
    pub keys: Vec<String>,
}

/// `granary demo --no-run`'s `images` JPEGs (160 to 400 pixels a side) in a new temporary
/// folder; returns it and the folder of the images (`images/train`, beside `labels.jsonl`).
pub fn demo_images(images: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let status = Command::new(granary_bin())
        .args(["demo", "--no-run", "--images", &images.to_string(), "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .status()
        .expect("granary demo runs");
    assert!(status.success(), "granary demo failed");
    let train = dir.path().join("images/train");
    (dir, train)
}

/// Generates `images` JPEGs and writes a manifest: 32×32 uint8 crops, batches of `batch`,
/// splits of `files_per_split`, `epochs` epochs.
pub fn dataset(images: usize, batch: u32, files_per_split: u32, epochs: u32) -> Dataset {
    dataset_with(images, batch, files_per_split, epochs, "")
}

/// [`dataset`] with 224×224 float32 CHW crops (600 KB an element), so that buffers hold only a
/// small part of an epoch and workers are still producing when a test interrupts them.
pub fn large_dataset(images: usize, batch: u32, files_per_split: u32, epochs: u32) -> Dataset {
    let normalize = "    - {op: image.normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], dtype: float32, layout: CHW}\n";
    dataset_with(images, batch, files_per_split, epochs, normalize)
}

/// [`dataset`] with `extra` stage lines after the flip (224×224 crops when there are any).
pub fn dataset_with(images: usize, batch: u32, files_per_split: u32, epochs: u32, extra: &str) -> Dataset {
    let size = if extra.is_empty() { 32 } else { 224 };
    let (dir, train) = demo_images(images);
    let mut keys: Vec<String> = std::fs::read_dir(&train)
        .expect("images")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jpg"))
        .collect();
    keys.sort();
    let manifest = dir.path().join("pipeline.yaml");
    let text = format!(
        "apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: e2e}}
spec:
  source: {{url: 'file://{}/', format: files, labels: ../labels.jsonl, filesPerSplit: {files_per_split}}}
  stages:
    - op: image.decode
    - {{op: image.random_resized_crop, size: {size}}}
    - {{op: image.flip, p: 0.5}}
{extra}  shuffle: {{buffer: 8}}
  batch: {{size: {batch}}}
  seed: 5
  epochs: {epochs}
",
        train.display()
    );
    std::fs::write(&manifest, text).expect("manifest");
    Dataset { dir, manifest, keys }
}

/// `granary run MANIFEST --serve ADDR --workers 0 --journal DIR`: the dispatcher alone.
pub struct Dispatcher {
    /// The process.
    pub proc: Proc,
    /// `host:port`.
    pub address: String,
    /// Its ready line (`dispatcher`, `pipeline`, and with `--tls` `tls_ca` and `token_file`).
    pub ready: serde_json::Value,
    /// The lines it prints after the ready line.
    pub lines: std::sync::mpsc::Receiver<String>,
}

/// Starts the dispatcher on `listen` (port 0 picks one) and waits for its ready line.
pub fn start_dispatcher(manifest: &Path, listen: &str, journal: &Path) -> Dispatcher {
    start_dispatcher_with(manifest, listen, journal, &["--workers", "0"])
}

/// `granary run MANIFEST --serve LISTEN --journal JOURNAL EXTRA…`, once it printed its ready line.
pub fn start_dispatcher_with(manifest: &Path, listen: &str, journal: &Path, extra: &[&str]) -> Dispatcher {
    let mut command = Command::new(granary_bin());
    command.arg("run").arg(manifest).args(["--serve", listen, "--journal"]).arg(journal).args(extra);
    start_serving(command)
}

/// Spawns `command` (a `granary run … --serve`) and returns it once it printed its ready line
/// (within 60 s, or this panics naming the command).
pub fn start_serving(mut command: Command) -> Dispatcher {
    let mut child = command.stdout(Stdio::piped()).spawn().expect("dispatcher starts");
    let stdout = child.stdout.take().expect("stdout");
    let proc = Proc { child };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{command:?} printed no ready line within 60 s: {e}"));
    let ready: serde_json::Value = serde_json::from_str(line.trim()).expect("a JSON ready line");
    let address = ready["dispatcher"].as_str().expect("dispatcher address").to_string();
    Dispatcher { proc, address, ready, lines: rx }
}

/// Starts a worker process.
pub fn start_worker(dispatcher: &str) -> Proc {
    start_worker_with(dispatcher, &[])
}

/// Starts a worker process with extra `granary worker` flags.
pub fn start_worker_with(dispatcher: &str, extra: &[&str]) -> Proc {
    let child = Command::new(granary_bin())
        .args(["worker", "--dispatcher", dispatcher, "--threads", "1", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .expect("worker starts");
    Proc { child }
}

/// One batch a consumer printed.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Seen {
    /// Epoch.
    pub epoch: u32,
    /// Slot.
    pub slot: u64,
    /// Element keys.
    pub keys: Vec<String>,
    /// Per row, a digest of its data (with the consumer's `--rows`).
    #[serde(default)]
    pub rows: Vec<String>,
    /// Tensor bytes that crossed the wire for the batch.
    #[serde(default)]
    pub wire: u64,
    /// When it was read from the process's output, which may be some time before a collect
    /// took it.
    #[serde(skip)]
    pub arrived: Option<Instant>,
}

/// A consumer process whose batches are collected as it prints them.
pub struct Consumer {
    /// The process.
    pub proc: Proc,
    lines: std::sync::mpsc::Receiver<Seen>,
    /// Batches so far.
    pub seen: Vec<Seen>,
}

/// Starts `granary-e2e-consume` with `args` after `--dispatcher ADDR --pipeline e2e`.
pub fn start_consumer(dispatcher: &str, args: &[&str]) -> Consumer {
    start_consumer_for(dispatcher, "e2e", args)
}

/// Starts `granary-e2e-consume` with `args` after `--dispatcher ADDR --pipeline PIPELINE`.
pub fn start_consumer_for(dispatcher: &str, pipeline: &str, args: &[&str]) -> Consumer {
    start_consumer_env(dispatcher, pipeline, args, &[])
}

/// [`start_consumer_for`] with environment variables `env` set (`GRANARY_TOKEN`, …).
pub fn start_consumer_env(dispatcher: &str, pipeline: &str, args: &[&str], env: &[(&str, &str)]) -> Consumer {
    let mut child = Command::new(consume_bin())
        .args(["--dispatcher", dispatcher, "--pipeline", pipeline])
        .args(args)
        .env_remove("GRANARY_TOKEN")
        .env_remove("GRANARY_TLS_CA")
        .env_remove("GRANARY_TOKEN_FILE")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("consumer starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(seen) = serde_json::from_str::<Seen>(&line)
                && tx.send(Seen { arrived: Some(Instant::now()), ..seen }).is_err()
            {
                return;
            }
        }
    });
    Consumer { proc: Proc { child }, lines: rx, seen: Vec::new() }
}

impl Consumer {
    /// Elements of the collected batches that arrived in `[from, to)`: a window's throughput
    /// counts what came in the window, not what a collect took in it after a pause.
    pub fn elements_between(&self, from: Instant, to: Instant) -> usize {
        let within = |s: &&Seen| s.arrived.is_some_and(|at| from <= at && at < to);
        self.seen
            .iter()
            .rev()
            .take_while(|s| s.arrived.is_none_or(|at| at >= from))
            .filter(within)
            .map(|s| s.keys.len())
            .sum()
    }

    /// Collects batches until `n` were seen or `timeout` passed.
    pub fn collect(&mut self, n: usize, timeout: Duration) {
        let end = Instant::now() + timeout;
        while self.seen.len() < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(s) => self.seen.push(s),
                Err(_) => return,
            }
            if Instant::now() >= end {
                return;
            }
        }
    }

    /// Collects until the process exits (or `timeout`), then returns whether it exited
    /// successfully.
    pub fn finish(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(s) => self.seen.push(s),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= end {
                return false;
            }
        }
        self.proc.wait_for(end.saturating_duration_since(Instant::now()))
            && self.proc.child.try_wait().ok().flatten().is_some_and(|s| s.success())
    }
}

/// Key counts per epoch over all `seen` batches.
pub fn counts_per_epoch<'a>(
    seen: impl IntoIterator<Item = &'a Seen>,
) -> BTreeMap<u32, BTreeMap<String, usize>> {
    let mut out: BTreeMap<u32, BTreeMap<String, usize>> = BTreeMap::new();
    for s in seen {
        for k in &s.keys {
            *out.entry(s.epoch).or_default().entry(k.clone()).or_default() += 1;
        }
    }
    out
}

/// Asserts that each of `epochs` epochs holds every key exactly once.
pub fn assert_exactly_once<'a>(seen: impl IntoIterator<Item = &'a Seen>, keys: &[String], epochs: u32) {
    let counts = counts_per_epoch(seen);
    for epoch in 0..epochs {
        let got = counts.get(&epoch).cloned().unwrap_or_default();
        let lost: Vec<&String> = keys.iter().filter(|k| !got.contains_key(*k)).collect();
        let dup: Vec<(&String, &usize)> = got.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            lost.is_empty() && dup.is_empty(),
            "epoch {epoch}: {} lost {lost:?}, {} duplicated {dup:?}",
            lost.len(),
            dup.len()
        );
        assert_eq!(got.len(), keys.len(), "epoch {epoch}: unexpected keys");
    }
}

/// Writes `lines` JSON lines `{"x": i}` over `files` files `part-NNN.jsonl` in `dir` (one split
/// each, so that several workers can share an epoch).
pub fn write_numbers(dir: &Path, lines: usize, files: usize) -> std::io::Result<()> {
    let per_file = lines / files;
    for f in 0..files {
        let text: Vec<String> =
            (f * per_file..(f + 1) * per_file).map(|i| format!("{{\"x\": {i}}}")).collect();
        std::fs::write(dir.join(format!("part-{f:03}.jsonl")), text.join("\n") + "\n")?;
    }
    Ok(())
}

/// A free port on 127.0.0.1 right now (bound and released; another process may take it first,
/// which the tests would report as a failure to bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// `GET /metrics` from `addr`: the body, in the Prometheus text format.
pub fn scrape(addr: &str) -> String {
    get(addr, "/metrics")
}

/// The body of `GET path` from the HTTP server at `addr`, which must answer 200.
pub fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the metrics endpoint accepts");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The value of the sample `name{labels}` (exactly as written) in a scrape, if present.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The value of the first series of `name` (in the text format `body`) that has every label of
/// `labels`, whatever its other labels.
pub fn sample_with(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(rest) => rest.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let pairs: Vec<&str> = if set.is_empty() { Vec::new() } else { set.split(',').collect() };
        let all = labels.iter().all(|(k, v)| pairs.contains(&format!("{k}=\"{v}\"").as_str()));
        if all { value.trim().parse().ok() } else { None }
    })
}
