//! What the trainer's host has to spare, for placement: its idle cores over the last interval,
//! and the cores this client spent finishing tensors the workers left to it. The dispatcher
//! moves a pipeline's final normalization to the workers when the host is busy and back when it
//! has room again (`granary_policies::placement`).
//!
//! Idle cores are those of the CPU this process may use ([`allowance`]: the CPUs of its
//! affinity, within its cgroup's quota), from the kernel's counters, so they count every process
//! that shares them, the trainer's own included. Where they cannot be read (another OS), the
//! figure is left unset and the dispatcher treats the host as having room, as it did before
//! placement.

mod allowance;

use allowance::Reading;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Test-only: names a file holding a number of cores, read at every sample in place of the host's
/// idle cores. The figure stands for a trainer host of its own, so it is reported even when every
/// worker is on this host (loopback). End-to-end tests on one machine use it to make the trainer's
/// host idle or busy at will; a file that cannot be read as a number of cores reports no figure.
pub(crate) const HOST_IDLE_ENV: &str = "GRANARY_TEST_HOST_IDLE";

/// Nanoseconds this process spent finishing tensors (a deferred normalization, and the images
/// made from the workers' plans), all sessions.
static FINISH_NANOS: AtomicU64 = AtomicU64::new(0);
/// Of those, the nanoseconds spent making images.
static IMAGE_NANOS: AtomicU64 = AtomicU64::new(0);

/// A stretch of one thread's work finishing tensors. [`Finishing::end`] counts the CPU time the
/// thread used in it, so that images made on several threads count each thread's share and a
/// thread the host preempted does not count the time it waited; where the thread's CPU clock
/// cannot be read, the time that passed counts instead.
pub(crate) struct Finishing {
    cpu: Option<u64>,
    wall: Instant,
    /// It makes images (counted apart too, so that placement can tell them from the
    /// normalization).
    images: bool,
}

impl Finishing {
    /// Starts a stretch on the calling thread.
    pub(crate) fn start() -> Self {
        Finishing { cpu: thread_cpu_nanos(), wall: Instant::now(), images: false }
    }

    /// Starts a stretch of making images on the calling thread.
    pub(crate) fn images() -> Self {
        Finishing { images: true, ..Finishing::start() }
    }

    /// Ends the stretch on the thread that started it and counts it.
    pub(crate) fn end(self) {
        let nanos = match (self.cpu, thread_cpu_nanos()) {
            (Some(start), Some(now)) => now.saturating_sub(start),
            _ => u64::try_from(self.wall.elapsed().as_nanos()).unwrap_or(u64::MAX),
        };
        // Images first: a sample that reads both between the two adds sees the images within
        // the finishing, never more images than finishing.
        if self.images {
            IMAGE_NANOS.fetch_add(nanos, Ordering::Relaxed);
        }
        FINISH_NANOS.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// CPU time the calling thread has used, in nanoseconds; `None` where it cannot be read.
#[cfg(unix)]
fn thread_cpu_nanos() -> Option<u64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec that the call only writes.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) } != 0 {
        return None;
    }
    let seconds = u64::try_from(now.tv_sec).ok()?;
    let nanos = u64::try_from(now.tv_nsec).ok()?;
    seconds.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// CPU time the calling thread has used: not read on this OS.
#[cfg(not(unix))]
fn thread_cpu_nanos() -> Option<u64> {
    None
}

/// Whether a worker's `host:port` (or `http(s)://host:port`) is on this host by its name: a
/// loopback address or `localhost`.
pub(crate) fn is_loopback(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Samples the host between heartbeats.
#[derive(Debug)]
pub(crate) struct HostSampler {
    /// When the idle counters were last read, and their values then.
    last: Option<(Instant, Reading)>,
    /// The idle cores measured then.
    idle: Option<f64>,
    finish_nanos: u64,
    image_nanos: u64,
    finish_at: Instant,
    /// The file read in place of the counters ([`HOST_IDLE_ENV`]).
    stand_in: Option<PathBuf>,
}

/// What one sample found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HostSample {
    /// Idle cores over the interval; `None` when unmeasured.
    pub(crate) idle_cores: Option<f64>,
    /// Cores spent finishing tensors over the interval.
    pub(crate) finish_cores: f64,
    /// Of those, cores spent making images.
    pub(crate) image_cores: f64,
    /// The idle figure is a stand-in's ([`HOST_IDLE_ENV`]), not this host's.
    pub(crate) stand_in: bool,
}

impl HostSampler {
    pub(crate) fn new(now: Instant) -> HostSampler {
        HostSampler {
            last: None,
            idle: None,
            finish_nanos: FINISH_NANOS.load(Ordering::Relaxed),
            image_nanos: IMAGE_NANOS.load(Ordering::Relaxed),
            finish_at: now,
            stand_in: std::env::var_os(HOST_IDLE_ENV).filter(|p| !p.is_empty()).map(PathBuf::from),
        }
    }

    /// The figures since the previous sample (idle cores from the second sample on; a sample
    /// too soon after the one before repeats its idle figure).
    pub(crate) fn sample(&mut self, now: Instant) -> HostSample {
        let idle_cores = match &self.stand_in {
            Some(path) => stand_in_idle(path),
            None => self.idle_between(now, Reading::now()),
        };
        // Images before the finishing, as they are counted the other way round.
        let image_nanos = IMAGE_NANOS.load(Ordering::Relaxed);
        let nanos = FINISH_NANOS.load(Ordering::Relaxed);
        let seconds = now.saturating_duration_since(self.finish_at).as_secs_f64();
        let cores = |now: u64, then: u64| {
            if seconds > 0.0 { now.saturating_sub(then) as f64 / 1e9 / seconds } else { 0.0 }
        };
        let finish_cores = cores(nanos, self.finish_nanos);
        let image_cores = cores(image_nanos, self.image_nanos).min(finish_cores);
        (self.finish_nanos, self.image_nanos, self.finish_at) = (nanos, image_nanos, now);
        HostSample { idle_cores, finish_cores, image_cores, stand_in: self.stand_in.is_some() }
    }

    fn idle_between(&mut self, now: Instant, reading: Option<Reading>) -> Option<f64> {
        let Some(reading) = reading else {
            (self.last, self.idle) = (None, None);
            return None;
        };
        let Some((at, was)) = self.last else {
            self.last = Some((now, reading));
            return None;
        };
        let seconds = now.saturating_duration_since(at).as_secs_f64();
        // Under a tenth of a second the ticks are too coarse to tell: keep the last figure, and
        // measure the next one from the same reading. (A heartbeat sent early, as a consumer
        // registers again, would otherwise report the host unmeasured, which counts as room.)
        if seconds >= 0.1 {
            self.idle = Some(reading.idle_since(&was, seconds));
            self.last = Some((now, reading));
        }
        self.idle
    }
}

/// The idle cores a stand-in file holds ([`HOST_IDLE_ENV`]); `None`, with a warning, when it
/// cannot be read or holds no finite, non-negative number.
fn stand_in_idle(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| tracing::warn!("{HOST_IDLE_ENV}: cannot read {}: {e}", path.display()))
        .ok()?;
    let cores = text.trim().parse::<f64>().ok().filter(|c| c.is_finite() && *c >= 0.0);
    if cores.is_none() {
        tracing::warn!("{HOST_IDLE_ENV}: {} holds {:?}, not a number of cores", path.display(), text.trim());
    }
    cores
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn loopback_workers_are_told_by_their_address() {
        for here in
            ["127.0.0.1:7071", "http://127.0.0.2:1/", "localhost:9", "https://[::1]:7071", "LOCALHOST:1"]
        {
            assert!(is_loopback(here), "{here}");
        }
        for there in ["10.0.0.5:7071", "http://worker-0.granary:7071", "[2001:db8::1]:1", "example.com", ""] {
            assert!(!is_loopback(there), "{there}");
        }
    }

    #[test]
    fn idle_cores_are_the_idle_ticks_over_the_interval() {
        let ticks = |idle_ticks| Some(Reading { idle_ticks, quota: None });
        let t0 = Instant::now();
        let mut s = HostSampler::new(t0);
        assert_eq!(s.idle_between(t0, ticks(1_000)), None, "the first sample has nothing to compare");
        // 300 idle ticks in 2 s: 1.5 cores.
        assert_eq!(s.idle_between(t0 + Duration::from_secs(2), ticks(1_300)), Some(1.5));
        assert_eq!(
            s.idle_between(t0 + Duration::from_millis(2_050), ticks(1_310)),
            Some(1.5),
            "too soon: as before"
        );
        // 0.5 s after the reading at 2 s, not after the early one: 10 idle ticks, 0.2 cores.
        assert_eq!(s.idle_between(t0 + Duration::from_millis(2_500), ticks(1_310)), Some(0.2));
        assert_eq!(s.idle_between(t0 + Duration::from_secs(3), None), None, "unreadable");
        assert_eq!(s.idle_between(t0 + Duration::from_secs(4), ticks(1_400)), None, "measured afresh");
    }

    #[test]
    fn a_stand_in_file_is_read_at_every_sample() {
        let dir = std::env::temp_dir().join(format!("granary-host-idle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("idle");
        let t0 = Instant::now();
        let mut s = HostSampler::new(t0);
        s.stand_in = Some(file.clone());
        assert_eq!(s.sample(t0).idle_cores, None, "no file yet");
        for (text, want) in
            [("3.5\n", Some(3.5)), ("0", Some(0.0)), ("-1", None), ("NaN", None), ("two", None)]
        {
            std::fs::write(&file, text).expect("write");
            let sample = s.sample(t0);
            assert_eq!(sample.idle_cores, want, "{text:?}");
            assert!(sample.stand_in);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_live_sample_measures_this_host() {
        let t0 = Instant::now();
        let mut s = HostSampler::new(t0);
        s.sample(t0);
        std::thread::sleep(Duration::from_millis(150));
        let sample = s.sample(Instant::now());
        if std::path::Path::new("/proc/stat").exists() {
            let idle = sample.idle_cores.expect("measured on Linux");
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            // Counters of all CPUs of the host, which may have more than this process may use.
            assert!(idle >= 0.0 && idle.is_finite(), "{idle} of {cores}");
        }
        assert!(sample.finish_cores >= 0.0);
    }

    /// CPU seconds spinning on the calling thread, at least `cpu`, in bounded time.
    fn spin(cpu: Duration) {
        let start = thread_cpu_nanos();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut x = 0u64;
        while Instant::now() < deadline {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            match (start, thread_cpu_nanos()) {
                (Some(s), Some(n)) if n - s >= cpu.as_nanos() as u64 => return,
                (None, _) | (_, None) => return,
                _ => {}
            }
        }
    }

    #[test]
    fn finishing_counts_each_threads_cpu_time_not_the_time_it_slept() {
        if thread_cpu_nanos().is_none() {
            return;
        }
        let before = FINISH_NANOS.load(Ordering::Relaxed);
        // Four threads each spin 20 ms of CPU and sleep 200 ms inside their stretch: the sleep
        // does not count, and the four spins all do, however the host schedules them.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let stretch = Finishing::start();
                    spin(Duration::from_millis(20));
                    std::thread::sleep(Duration::from_millis(200));
                    stretch.end();
                });
            }
        });
        let counted = Duration::from_nanos(FINISH_NANOS.load(Ordering::Relaxed) - before);
        assert!(counted >= Duration::from_millis(80), "{counted:?}");
        assert!(counted < Duration::from_millis(400), "the sleeps were counted: {counted:?}");
    }

    #[test]
    fn images_count_apart_and_within_the_finishing() {
        if thread_cpu_nanos().is_none() {
            return;
        }
        let t0 = Instant::now();
        let mut s = HostSampler::new(t0);
        let images = Finishing::images();
        spin(Duration::from_millis(30));
        images.end();
        let normalization = Finishing::start();
        spin(Duration::from_millis(30));
        normalization.end();
        let sample = s.sample(t0 + Duration::from_secs(1));
        // Over 1 s: at least 0.06 cores finishing, at least 0.03 of them images, and not all.
        assert!(sample.finish_cores >= 0.06, "{sample:?}");
        assert!(sample.image_cores >= 0.03 && sample.image_cores < sample.finish_cores, "{sample:?}");
    }
}
