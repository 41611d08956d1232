//! 1,000 bogus clients against real processes on 127.0.0.1: a dispatcher (`granary run --serve
//! --workers 0`), one worker process (`granary worker`) and a legitimate trainer process. Quiet
//! windows and attacks alternate, three attacks between four quiet windows. In each attack, each
//! bogus client (a task of this test, with connections of its own to the dispatcher and to the
//! worker) registers jobs with random names (some over the name limit), heartbeats its sessions,
//! and keeps idle `StreamBatches` streams open that it never reads, while the trainer reads on.
//! The test prints the trainer's throughput in every window and the cores each process used,
//! quiet and under attack.
//!
//! Acceptance (the robustness issue's "bogus clients"):
//! - the dispatcher's and the worker's peak RSS (`VmHWM` of `/proc/<pid>/status`) stay under
//!   [`RSS_BOUND`];
//! - the trainer keeps at least [`THROUGHPUT_RATIO`] of its quiet throughput under attack: the
//!   median over the attacks of each one's throughput over the mean of the quiet windows on
//!   either side of it.
//!
//! The throughput ratio is the acceptance criterion, not a measure of code speed: it
//! checks that the servers neither stall nor starve the trainer while they refuse and bound the
//! bogus load. Cores stand for hosts: the worker has the first allowed core to itself, and the
//! dispatcher, the trainer and the bogus clients share the rest (with one core, all share it),
//! the bogus clients' threads at the lowest priority. So the bogus load still reaches the
//! worker's and the dispatcher's processes (their connections, streams and service threads run
//! on their cores), but the attackers' own CPU, which in a deployment is on other machines, comes
//! out of neither the worker's core nor the trainer's. At the same priority as the trainer, the
//! attackers' 0.44 cores and the dispatcher's 0.45 filled the second core: the trainer and the
//! dispatcher answered late, the worker's core idled 7% of the time, and the ratio ranged
//! 0.76-0.89 over a dozen runs (0.83 and 0.90 in the first two at the lowest priority, the
//! worker's core 97% busy under attack). With every process free to run anywhere,
//! on a 2-core VM the test measured the contention of co-located processes instead: 0.85-0.88
//! one day and 0.73-0.77 another, with the same code, as the attackers' 0.34 cores and the
//! dispatcher's extra 0.25 took the room the worker's service threads had used quiet. The
//! measured figures are printed; the test runs alone (see `.config/nextest.toml`).
//!
//! Why alternate: with one attack between one quiet window before it and one after, two
//! minutes apart, the machine's own drift entered the ratio. In one CI run the trainer read
//! 2,239 elements/s quiet before the attack and 1,672 after it (a quarter less, with nothing of
//! the test's load left), and the ratio came out 0.79. Windows a few seconds apart drift less,
//! and the median of three attacks is not decided by one slow stretch of the machine.

use granary_e2e::*;
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_client::DispatcherClient;
use granary_proto::v1::worker_client::WorkerClient;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Bogus clients, each with a connection of its own to the dispatcher and to the worker.
const BOGUS: usize = 1_000;
/// How long each attack lasts.
const ATTACK: Duration = Duration::from_secs(25);
/// How many attacks, each between two quiet windows.
const ATTACKS: usize = 3;
/// How long the bogus clients take to connect, all of them (they start staggered).
const RAMP: Duration = Duration::from_secs(8);
/// How long each quiet window lasts. Every window counts the batches that arrived in it (see
/// [`window_throughput`]): counted as collected, a quiet window after an attack took in the
/// batches that piled up while the bogus clients ended, and read 10-25% above the one before.
const QUIET: Duration = Duration::from_secs(8);
/// Batches read before measuring: the worker's pipeline and the trainer's streams are warm.
const WARMUP: usize = 40;
/// Elements per batch of the dataset.
const BATCH: usize = 8;
/// The bound on each server's peak resident memory. Measured on a 2-core machine under this
/// attack: the dispatcher peaked at 88-90 MiB (1,000 HTTP/2 connections' buffers, 1,024 jobs) and
/// the worker at 78-83 MiB (figures printed by the test); 256 MiB leaves room for allocator and
/// thread-count differences while still failing on state that grows with the bogus load (about
/// 10,000 job registrations and 11,000 streams a minute here).
const RSS_BOUND: u64 = 256 << 20;
/// The share of its quiet throughput the trainer keeps under attack (the median of the attacks).
const THROUGHPUT_RATIO: f64 = 0.8;

/// What one window of the test measured.
struct Window {
    /// Elements per second that arrived at the trainer.
    rate: f64,
    /// Cores each process used (in the order of the test's `pids`).
    cores: Vec<f64>,
    /// How long the window lasted.
    span: Duration,
}

/// Peak and current resident memory of process `pid`, in bytes (`VmHWM`, `VmRSS`).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb << 10)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// CPU seconds process `pid` has used so far, user and system, all its threads (`utime` and
/// `stime` of `/proc/<pid>/stat`, at the usual 100 ticks a second); 0 when it cannot be read.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// Cores each process used between two [`cpu_seconds`] readings `elapsed` apart.
fn cores_used(before: &[f64], after: &[f64], elapsed: Duration) -> Vec<f64> {
    before.iter().zip(after).map(|(b, a)| (a - b) / elapsed.as_secs_f64().max(1e-3)).collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// The cores this thread may run on (its affinity, which a container's cpuset narrows), in
/// order; empty when it cannot be read.
fn allowed_cores() -> Vec<usize> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set; `sched_getaffinity` writes at most its
    // size into it, and CPU_ISSET reads within it for cores under CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&core| libc::CPU_ISSET(core, &set)).collect()
    }
}

/// Keeps thread `tid` (0: the calling thread) on `cores`; false when the kernel refused.
fn pin(tid: i32, cores: &[usize]) -> bool {
    // SAFETY: as in `allowed_cores`; `set` outlives the call, which only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &core in cores.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(core, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) == 0
    }
}

/// Gives the calling thread the lowest scheduling priority (nice 19): it runs on its core when
/// the other processes there wait. On Linux the nice value is each thread's own.
fn yield_to_others() {
    // SAFETY: plain system calls on the calling thread's id; a refusal leaves the priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// Keeps every thread process `pid` has now on `cores` (threads they start later inherit it);
/// false when the kernel refused one.
fn pin_process(pid: u32, cores: &[usize]) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    let tids: Vec<i32> = tasks.filter_map(|t| t.file_name().to_str()?.parse().ok()).collect();
    // Every thread is tried, refused or not.
    let refused = tids.iter().filter(|&&tid| !pin(tid, cores)).count();
    !tids.is_empty() && refused == 0
}

/// How long the trainer's batches are still collected after a window ends: those that arrived
/// in it but were still on their way to the test are counted too.
const SETTLE: Duration = Duration::from_millis(300);

/// Reads the trainer's batches for `window`; returns the elements per second that arrived in it.
fn throughput(trainer: &mut Consumer, window: Duration) -> f64 {
    let start = Instant::now();
    window_throughput(trainer, start, start + window)
}

/// Reads the trainer's batches until `end` (and [`SETTLE`] after); returns the elements per
/// second that arrived from `start` to `end`. Batches are counted by when they arrived, not by
/// when they were collected: what piled up while the test did something else (waiting for the
/// bogus clients to end) belongs to the time it arrived in.
fn window_throughput(trainer: &mut Consumer, start: Instant, end: Instant) -> f64 {
    read_until(trainer, end + SETTLE);
    let elements = trainer.elements_between(start, end);
    assert!(elements > 0, "the trainer stalled");
    elements as f64 / end.saturating_duration_since(start).as_secs_f64().max(1e-3)
}

/// Collects the trainer's batches as they come until `until`. The trainer must still be reading
/// then: one that ran out of epochs would make every later figure meaningless.
fn read_until(trainer: &mut Consumer, until: Instant) {
    // Bounded: each collect waits at most the time left, and a trainer that exited ends it.
    while Instant::now() < until {
        let (before, left) = (trainer.seen.len(), until.saturating_duration_since(Instant::now()));
        trainer.collect(before + 1, left);
        if trainer.seen.len() == before && Instant::now() < until {
            let exited = trainer.proc.child.try_wait().ok().flatten();
            assert!(exited.is_none(), "the trainer ended ({exited:?}) before the measurement did");
        }
    }
}

/// A small deterministic generator (xorshift64*), for names and jitter.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A random job name: mostly short, one in eight over the 253-byte limit.
    fn job(&mut self) -> String {
        let len = if self.next().is_multiple_of(8) { 300 } else { 8 + (self.next() % 48) as usize };
        let mut name = String::with_capacity(len);
        while name.len() < len {
            name.push_str(&format!("{:016x}", self.next()));
        }
        name.truncate(len);
        name
    }

    fn jitter(&mut self, around: Duration) -> Duration {
        let ms = around.as_millis() as u64;
        Duration::from_millis(ms / 2 + self.next() % ms.max(1))
    }
}

/// Answers the bogus clients got, by call and status code.
#[derive(Default)]
struct Tally(BTreeMap<String, u64>);

impl Tally {
    fn count<T>(tally: &Mutex<Tally>, call: &str, result: &Result<T, tonic::Status>) {
        let code = match result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        let mut t = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *t.0.entry(format!("{call} {code:?}")).or_default() += 1;
    }
}

async fn connect(address: &str) -> Option<Channel> {
    Endpoint::from_shared(format!("http://{address}"))
        .ok()?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .ok()
}

/// Bogus client `i` (numbered on across attacks) until `end`: joins random jobs, heartbeats its sessions about every second,
/// keeps at most two idle streams open on the worker, and never reads them.
async fn bogus(i: usize, dispatcher: String, worker: String, end: Instant, tally: Arc<Mutex<Tally>>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0x1000_0000_01b3));
    tokio::time::sleep(RAMP.mul_f64((i % BOGUS) as f64 / BOGUS as f64)).await;
    let (Some(d), Some(w)) = (connect(&dispatcher).await, connect(&worker).await) else {
        Tally::count::<()>(&tally, "connect", &Err(tonic::Status::unavailable("no connection")));
        return;
    };
    let mut rpc = DispatcherClient::new(d);
    let mut streams = WorkerClient::new(w);
    let mut sessions: Vec<pb::RegisterClientResponse> = Vec::new();
    let mut idle: Vec<tonic::Streaming<pb::StreamMessage>> = Vec::new();
    // Bounded: one round a second or so, for a minute.
    for round in 0..200u32 {
        if Instant::now() >= end {
            break;
        }
        if round.is_multiple_of(5) {
            let job = rng.job();
            let req = pb::RegisterClientRequest {
                pipeline: "e2e".into(),
                job: job.clone(),
                num_consumers: 1 + (rng.next() % 4) as u32,
                ..Default::default()
            };
            let joined = rpc.register_client(req).await;
            Tally::count(&tally, "RegisterClient", &joined);
            if let Ok(joined) = joined {
                sessions.push(joined.into_inner());
                if sessions.len() > 2 {
                    sessions.remove(0);
                }
            }
            let req = pb::StreamBatchesRequest {
                pipeline: "e2e".into(),
                job,
                consumer_index: 0,
                client_id: format!("bogus-{i}"),
                capability: String::new(),
            };
            let opened = streams.stream_batches(req).await;
            Tally::count(&tally, "StreamBatches", &opened);
            if let Ok(stream) = opened {
                idle.push(stream.into_inner());
                if idle.len() > 2 {
                    idle.remove(0);
                }
            }
        }
        for s in &sessions {
            let req = pb::ClientHeartbeatRequest {
                client_id: s.client_id.clone(),
                pipeline: "e2e".into(),
                job: s.job.clone(),
                consumer_index: s.consumer_index,
                ..Default::default()
            };
            let beat = rpc.client_heartbeat(req).await;
            Tally::count(&tally, "ClientHeartbeat", &beat);
        }
        // A heartbeat for a session that does not exist.
        let req = pb::ClientHeartbeatRequest {
            client_id: format!("client-{:x}", rng.next()),
            pipeline: "e2e".into(),
            job: rng.job(),
            ..Default::default()
        };
        let beat = rpc.client_heartbeat(req).await;
        Tally::count(&tally, "ClientHeartbeat (no session)", &beat);
        tokio::time::sleep(rng.jitter(Duration::from_secs(1))).await;
    }
    drop(idle);
}

#[test]
fn a_thousand_bogus_clients_leave_memory_bounded_and_the_trainer_reading() {
    // 64 images in splits of 8, batches of 8, epochs enough to read through the whole test
    // (about 2 minutes at up to 5,000 elements a second).
    let data = dataset(64, BATCH as u32, 8, 10_000);
    // Cores stand for hosts, as in a deployment: the worker (one compute thread) has the first
    // core this test may use to itself; the dispatcher, the trainer and the bogus clients (this
    // thread's runtime) share the others. So the attackers' own CPU, which would be on other
    // machines, and the dispatcher's do not come out of the worker's, while every request
    // still reaches the worker's process and the trainer's path through the dispatcher.
    let cores = allowed_cores();
    let (worker_core, rest) =
        cores.split_first().map_or((&[][..], &[][..]), |(first, rest)| (std::slice::from_ref(first), rest));
    let mut hosts = !rest.is_empty() && pin(0, rest);
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal"));
    let worker = start_worker(&d.address);
    hosts = hosts && pin_process(worker.child.id(), worker_core);
    let mut trainer = start_consumer(&d.address, &[]);
    trainer.collect(WARMUP, Duration::from_secs(60));
    assert_eq!(trainer.seen.len(), WARMUP, "the trainer reads");
    // Threads the worker started before the first pin ran on the other cores.
    hosts = hosts && pin_process(worker.child.id(), worker_core);
    if !hosts && !cores.is_empty() {
        // Placed in part or not at all: every process (this one's threads too) may run
        // anywhere again.
        for pid in [std::process::id(), d.proc.child.id(), worker.child.id(), trainer.proc.child.id()] {
            pin_process(pid, &cores);
        }
    }
    println!(
        "placement: {}",
        if hosts {
            format!("worker on core {worker_core:?}; dispatcher, trainer, bogus clients on {rest:?}")
        } else {
            format!("every process on any of cores {cores:?}")
        }
    );
    // Where the machine's CPU goes, by process, quiet and under attack.
    let pids = [
        ("dispatcher", d.proc.child.id().to_string()),
        ("worker", worker.child.id().to_string()),
        ("trainer", trainer.proc.child.id().to_string()),
        ("bogus clients (this test)", "self".to_string()),
    ];
    let cpu = || -> Vec<f64> { pids.iter().map(|(_, pid)| cpu_seconds(pid)).collect() };

    // The bogus clients' threads yield their core to the trainer and the dispatcher beside
    // them: their CPU stands for other machines', as the worker's core stands for its host.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(yield_to_others)
        .enable_all()
        .build()
        .expect("a runtime");
    let worker_address = runtime.block_on(async {
        let mut rpc = DispatcherClient::new(connect(&d.address).await.expect("the dispatcher"));
        let listed = rpc.list_workers(pb::ListWorkersRequest { pipeline: "e2e".into() }).await;
        let workers = listed.expect("ListWorkers").into_inner().workers;
        workers.first().expect("a registered worker").address.clone()
    });
    let worker_pid = worker.child.id();
    let tally = Arc::new(Mutex::new(Tally::default()));

    // Quiet and attacked windows alternate, a quiet one first and last: each attack is compared
    // with the quiet windows on either side of it, so the machine's drift weighs on both sides
    // of its ratio alike.
    let quiet_window = |trainer: &mut Consumer| -> Window {
        let (cpu_before, from) = (cpu(), Instant::now());
        let rate = throughput(trainer, QUIET);
        Window { rate, cores: cores_used(&cpu_before, &cpu(), from.elapsed()), span: from.elapsed() }
    };
    let mut quiet = vec![quiet_window(&mut trainer)];
    let mut attacked = Vec::new();
    for round in 0..ATTACKS {
        let start = Instant::now();
        let end = start + ATTACK;
        let attack: Vec<_> = (0..BOGUS)
            .map(|i| {
                let (dispatcher, worker, tally) =
                    (d.address.clone(), worker_address.clone(), Arc::clone(&tally));
                runtime.spawn(bogus(round * BOGUS + i, dispatcher, worker, end, tally))
            })
            .collect();
        // The trainer reads through the attack: measured once every bogus client is connected
        // and streaming, until the attack ends.
        read_until(&mut trainer, start + RAMP + Duration::from_secs(2));
        let (measured, cpu_before) = (Instant::now(), cpu());
        read_until(&mut trainer, end);
        let span = measured.elapsed();
        let cores = cores_used(&cpu_before, &cpu(), span);
        let rate = window_throughput(&mut trainer, measured, end);
        attacked.push(Window { rate, cores, span });
        runtime.block_on(async {
            for task in attack {
                tokio::time::timeout(Duration::from_secs(20), task).await.expect("bogus clients end").ok();
            }
        });
        quiet.push(quiet_window(&mut trainer));
    }
    let (dispatcher_peak, dispatcher_now) = memory(d.proc.child.id());
    let (worker_peak, worker_now) = memory(worker_pid);
    // Each attack over the mean of the quiet windows before and after it.
    let mut ratios: Vec<f64> = attacked
        .iter()
        .zip(quiet.windows(2))
        .map(|(a, q)| a.rate / ((q[0].rate + q[1].rate) / 2.0))
        .collect();
    println!(
        "bogus clients: {BOGUS} for {} s, {ATTACKS} times; trainer elements/s in the {} s windows:",
        ATTACK.as_secs(),
        QUIET.as_secs()
    );
    for (i, q) in quiet.iter().enumerate() {
        println!("  quiet {:.0} elements/s ({:.0} s)", q.rate, q.span.as_secs_f64());
        if let (Some(a), Some(r)) = (attacked.get(i), ratios.get(i)) {
            println!("  under attack {:.0} elements/s ({:.0} s), ratio {r:.2}", a.rate, a.span.as_secs_f64());
        }
    }
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ratios.len() / 2];
    println!("median ratio {ratio:.2}");
    println!(
        "peak RSS: dispatcher {:.1} MiB (now {:.1}), worker {:.1} MiB (now {:.1}); bound {:.0} MiB",
        mib(dispatcher_peak),
        mib(dispatcher_now),
        mib(worker_peak),
        mib(worker_now),
        mib(RSS_BOUND)
    );
    let mean_cores =
        |windows: &[Window], i: usize| windows.iter().map(|w| w.cores[i]).sum::<f64>() / windows.len() as f64;
    for (i, (name, _)) in pids.iter().enumerate() {
        println!(
            "  cores used by {name}: {:.2} quiet, {:.2} under attack (means over the windows)",
            mean_cores(&quiet, i),
            mean_cores(&attacked, i)
        );
    }
    let tally = tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (answer, n) in &tally.0 {
        println!("  {answer}: {n}");
    }
    assert!(dispatcher_peak > 0 && worker_peak > 0, "the servers' memory was read");
    assert!(dispatcher_peak < RSS_BOUND, "dispatcher peak RSS {:.1} MiB", mib(dispatcher_peak));
    assert!(worker_peak < RSS_BOUND, "worker peak RSS {:.1} MiB", mib(worker_peak));
    assert!(
        ratio >= THROUGHPUT_RATIO,
        "under attack the trainer read a median {ratio:.2} of its quiet throughput (ratios {ratios:.2?})"
    );
    // The bogus load was served and refused, not dropped: joins past the caps were refused by
    // name, never with an internal error.
    let count = |key: &str| tally.0.get(key).copied().unwrap_or(0);
    assert!(count("RegisterClient Ok") > 0 && count("StreamBatches Ok") >= (ATTACKS * BOGUS) as u64 / 2);
    assert!(count("RegisterClient InvalidArgument") > 0, "over-long job names are refused");
    assert!(tally.0.keys().all(|k| !k.ends_with("Internal") && !k.ends_with("Unknown")), "{:?}", tally.0);
}
