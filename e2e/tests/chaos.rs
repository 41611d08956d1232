//! Chaos across real processes on 127.0.0.1: two distributed consumers read three epochs while a
//! random worker is SIGKILLed and replaced about every half second and the dispatcher, whose
//! journal lives on the S3-compatible server, is SIGKILLed and restarted three times on the same
//! address. Every epoch must still reach the two consumers together exactly once, with equal
//! batch counts, within a bound.
//!
//! The fault schedule comes from a seed, printed at the start and again on failure; set
//! `GRANARY_CHAOS_SEED` to the printed value to replay a schedule. (Process timing is not
//! replayed, so a replay explores the same schedule, not the same interleaving.)

use granary_e2e::chaos::{Rng, SEED_VAR, seed, start_dispatcher_env};
use granary_e2e::s3::S3Server;
use granary_e2e::*;
use std::time::{Duration, Instant};

const EPOCHS: u32 = 3;
const IMAGES: usize = 480;
const BATCH: u32 = 8;
const FILES_PER_SPLIT: u32 = 8;
/// Milliseconds a worker spends on each element (`test.sleep`, no CPU): workers are still
/// producing, holding leases, when they are killed, and an epoch outlasts many kills.
const ELEMENT_MS: u32 = 25;
const WORKERS: usize = 3;
const CONSUMERS: usize = 2;
/// Milliseconds each consumer spends on a "training step".
const STEP_MS: &str = "20";
const DISPATCHER_RESTARTS: usize = 3;
/// Kills the run must have suffered for a pass to mean anything.
const MIN_WORKER_KILLS: usize = 20;
/// The whole run, faults included, must finish within this.
const DEADLINE: Duration = Duration::from_secs(150);
/// How long the loop waits for batches between two looks at the clock.
const TICK: Duration = Duration::from_millis(20);
/// Most lines kept of what the chaos did, printed on failure.
const LOG_LINES: usize = 40;

/// Everything one chaos run holds; on a panic it prints the seed and where the run stood.
struct Chaos {
    seed: u64,
    rng: Rng,
    started: Instant,
    manifest: std::path::PathBuf,
    journal: String,
    s3_env: Vec<(String, String)>,
    dispatcher: Dispatcher,
    address: String,
    workers: Vec<Proc>,
    consumers: Vec<Consumer>,
    worker_kills: usize,
    worker_exits: usize,
    dispatcher_restarts: usize,
    log: std::collections::VecDeque<String>,
}

impl Chaos {
    fn note(&mut self, what: String) {
        let line = format!("{:>6.2}s {what}", self.started.elapsed().as_secs_f64());
        println!("chaos: {line}");
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    /// Batches each consumer received so far, per epoch.
    fn progress(&self) -> Vec<Vec<usize>> {
        self.consumers
            .iter()
            .map(|c| (0..EPOCHS).map(|epoch| c.seen.iter().filter(|s| s.epoch == epoch).count()).collect())
            .collect()
    }

    fn delivered(&self) -> usize {
        self.consumers.iter().map(|c| c.seen.len()).sum()
    }

    fn standing(&self) -> String {
        format!(
            "seed {} (replay: {SEED_VAR}={}), after {:.1} s: batches per consumer per epoch {:?}, \
             {} worker kills, {} workers exited by themselves, {} dispatcher restarts",
            self.seed,
            self.seed,
            self.started.elapsed().as_secs_f64(),
            self.progress(),
            self.worker_kills,
            self.worker_exits,
            self.dispatcher_restarts
        )
    }

    /// Takes in every batch printed so far, waiting up to [`TICK`] for the first.
    fn gather(&mut self) {
        let n = self.consumers.len();
        for c in &mut self.consumers {
            c.collect(c.seen.len() + 1, TICK / n as u32);
            c.collect(usize::MAX, Duration::ZERO);
        }
    }

    /// True once every consumer process has exited.
    fn consumers_exited(&mut self) -> bool {
        self.consumers.iter_mut().all(|c| matches!(c.proc.child.try_wait(), Ok(Some(_))))
    }

    fn kill_a_worker(&mut self) {
        let victim = self.rng.below(self.workers.len() as u64) as usize;
        self.workers[victim].signal(libc::SIGKILL);
        let gone = self.workers[victim].wait_for(Duration::from_secs(10));
        assert!(gone, "worker {victim} survived SIGKILL for 10 s; {}", self.standing());
        self.workers[victim] = start_worker(&self.address);
        self.worker_kills += 1;
        let progress = self.progress();
        self.note(format!("killed and replaced worker {victim} at {progress:?}"));
    }

    /// Replaces the workers that exited without being killed (counted, not hidden).
    fn replace_exited_workers(&mut self) {
        for i in 0..self.workers.len() {
            if let Ok(Some(status)) = self.workers[i].child.try_wait() {
                self.workers[i] = start_worker(&self.address);
                self.worker_exits += 1;
                self.note(format!("worker {i} exited by itself ({status}); replaced"));
            }
        }
    }

    fn restart_the_dispatcher(&mut self) {
        let progress = self.progress();
        self.dispatcher.proc.signal(libc::SIGKILL);
        let gone = self.dispatcher.proc.wait_for(Duration::from_secs(10));
        assert!(gone, "the dispatcher survived SIGKILL for 10 s; {}", self.standing());
        let down = Instant::now();
        self.dispatcher = start_dispatcher_env(&self.manifest, &self.address, &self.journal, &self.s3_env);
        assert_eq!(self.dispatcher.address, self.address, "the dispatcher came back elsewhere");
        self.dispatcher_restarts += 1;
        self.note(format!(
            "dispatcher SIGKILLed at {progress:?} and back after {} ms (restart {})",
            down.elapsed().as_millis(),
            self.dispatcher_restarts
        ));
    }
}

impl Drop for Chaos {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("chaos run FAILED: {}", self.standing());
            eprintln!("its last events:");
            for line in &self.log {
                eprintln!("  {line}");
            }
        }
    }
}

/// `IMAGES` small generated JPEGs and a manifest over them: decode, a random 32×32 crop, a
/// flip, and [`ELEMENT_MS`] of sleep per element.
fn paced_dataset() -> Dataset {
    let (dir, train) = demo_images(IMAGES);
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
  source: {{url: 'file://{}/', format: files, labels: ../labels.jsonl, filesPerSplit: {FILES_PER_SPLIT}}}
  stages:
    - op: image.decode
    - {{op: image.random_resized_crop, size: 32}}
    - {{op: image.flip, p: 0.5}}
    - {{op: test.sleep, ms: {ELEMENT_MS}}}
  shuffle: {{buffer: 8}}
  batch: {{size: {BATCH}}}
  seed: 5
  epochs: {EPOCHS}
",
        train.display()
    );
    std::fs::write(&manifest, text).expect("manifest");
    Dataset { dir, manifest, keys }
}

/// Files under `dir`, at any depth (the objects `s3s-fs` keeps for a bucket).
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => files_under(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

#[test]
fn epochs_survive_worker_kills_and_dispatcher_restarts_with_the_journal_on_s3() {
    let seed = seed();
    println!("chaos seed {seed} (replay with {SEED_VAR}={seed})");
    let mut rng = Rng::new(seed);
    let data = paced_dataset();
    let s3 = S3Server::start(&data.dir.path().join("s3"), 0, &["journal"]);
    let journal = "s3://journal/chaos".to_string();
    let s3_env = s3.env();
    let dispatcher = start_dispatcher_env(&data.manifest, "127.0.0.1:0", &journal, &s3_env);
    let address = dispatcher.address.clone();
    let workers = (0..WORKERS).map(|_| start_worker(&address)).collect();
    let consumers = (0..CONSUMERS)
        .map(|i| {
            let index = i.to_string();
            let count = CONSUMERS.to_string();
            start_consumer(&address, &["--index", &index, "--consumers", &count, "--step-ms", STEP_MS])
        })
        .collect();

    // The dispatcher restarts at drawn points of the run's progress, one in each of three
    // windows, so that all three happen before the end and usually mid-epoch.
    let expected = EPOCHS as usize * IMAGES.div_ceil(BATCH as usize);
    let restart_at: Vec<usize> = (0..DISPATCHER_RESTARTS as u64)
        .map(|i| expected * rng.between(10 + 25 * i, 25 + 25 * i) as usize / 100)
        .collect();
    println!("chaos: about {expected} batches in all; dispatcher restarts after {restart_at:?} of them");

    let mut chaos = Chaos {
        seed,
        rng,
        started: Instant::now(),
        manifest: data.manifest.clone(),
        journal,
        s3_env,
        dispatcher,
        address,
        workers,
        consumers,
        worker_kills: 0,
        worker_exits: 0,
        dispatcher_restarts: 0,
        log: Default::default(),
    };
    let mut next_kill = Instant::now() + chaos.rng.millis(300, 700);
    loop {
        chaos.gather();
        if chaos.consumers_exited() {
            break;
        }
        assert!(
            chaos.started.elapsed() < DEADLINE,
            "the run did not finish within {DEADLINE:?}: {}",
            chaos.standing()
        );
        chaos.replace_exited_workers();
        if chaos.dispatcher_restarts < DISPATCHER_RESTARTS
            && chaos.delivered() >= restart_at[chaos.dispatcher_restarts]
        {
            chaos.restart_the_dispatcher();
        }
        if Instant::now() >= next_kill {
            chaos.kill_a_worker();
            next_kill = Instant::now() + chaos.rng.millis(300, 700);
        }
    }

    let elapsed = chaos.started.elapsed();
    for i in 0..CONSUMERS {
        let ok = chaos.consumers[i].finish(Duration::from_secs(10));
        assert!(ok, "consumer {i} failed or did not exit cleanly: {}", chaos.standing());
    }
    println!("chaos: finished in {:.1} s: {}", elapsed.as_secs_f64(), chaos.standing());
    assert_eq!(
        chaos.dispatcher_restarts,
        DISPATCHER_RESTARTS,
        "the run ended before every dispatcher restart: {}",
        chaos.standing()
    );
    assert!(
        chaos.worker_kills >= MIN_WORKER_KILLS,
        "only {} worker kills: the run proves nothing: {}",
        chaos.worker_kills,
        chaos.standing()
    );
    // On a failure below, dropping `chaos` prints the seed and where the run stood.
    let standing = chaos.standing();
    assert_exactly_once(chaos.consumers.iter().flat_map(|c| &c.seen), &data.keys, EPOCHS);
    let progress = chaos.progress();
    let objects = files_under(&s3.root.join("journal"));
    assert!(objects > 0, "the journal bucket on the S3 server holds nothing: {standing}");
    println!("chaos: the journal holds {objects} objects on the S3 server");
    for (epoch, (na, nb)) in progress[0].iter().zip(&progress[1]).enumerate() {
        assert_eq!(na, nb, "epoch {epoch}: the consumers got {na} and {nb} batches: {standing}");
        assert!(*na > 0, "epoch {epoch}: no batches: {standing}");
    }
}
