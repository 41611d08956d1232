//! The CPU this process may use, and how much of it went unused: placement asks how many idle
//! cores the trainer could give to finishing tensors, and on a shared machine that is not the
//! host's idle cores. A trainer pinned to some cores (`taskset`, a cpuset) can use only those,
//! and a container with a CPU limit (a Kubernetes pod's `limits.cpu`, cgroup v2's `cpu.max`)
//! only its quota, however idle the rest of the node is.
//!
//! So a reading holds two counters, and the idle figure over an interval is the smaller of:
//! - the idle and I/O-wait time of the CPUs in this process's affinity (`/proc/stat`'s per-CPU
//!   lines; all CPUs when the affinity cannot be read);
//! - the quota of the tightest `cpu.max` on the process's cgroup v2 path, less what that cgroup
//!   used (`cpu.stat`'s `usage_usec`), where a quota is set.
//!
//! Both count every process that shares the allowance, the trainer's own included. Under cgroup
//! v1, or where `/sys/fs/cgroup` is not mounted, only the first applies.

use std::path::{Path, PathBuf};

/// The kernel's clock ticks a second (`USER_HZ`, 100 on every Linux architecture).
const TICKS_PER_SECOND: f64 = 100.0;

/// Where cgroup v2 is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The counters of one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// Idle and I/O-wait ticks of the CPUs this process may run on, together.
    pub(crate) idle_ticks: u64,
    /// The tightest CPU quota on the process's cgroup path, in cores, and the CPU time that
    /// cgroup has used, in microseconds; `None` when no quota is set or it cannot be read.
    pub(crate) quota: Option<Quota>,
}

/// A cgroup's CPU quota and its usage so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Quota {
    /// Cores the cgroup may use (`cpu.max`'s quota over its period).
    pub(crate) cores: f64,
    /// CPU time it used so far, microseconds (`cpu.stat`'s `usage_usec`).
    pub(crate) usage_usec: u64,
}

impl Reading {
    /// The counters now; `None` when `/proc/stat` cannot be read (another OS).
    pub(crate) fn now() -> Option<Reading> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let idle_ticks = idle_ticks(&stat, allowed_cpus().as_deref())?;
        Some(Reading { idle_ticks, quota: own_quota() })
    }

    /// Idle cores from `earlier` to this reading, `seconds` apart (more than 0).
    pub(crate) fn idle_since(&self, earlier: &Reading, seconds: f64) -> f64 {
        let cpus = self.idle_ticks.saturating_sub(earlier.idle_ticks) as f64 / TICKS_PER_SECOND / seconds;
        match (self.quota, earlier.quota) {
            (Some(now), Some(then)) => {
                let used = now.usage_usec.saturating_sub(then.usage_usec) as f64 / 1e6 / seconds;
                cpus.min((now.cores - used).max(0.0))
            }
            _ => cpus,
        }
    }
}

/// Idle and I/O-wait ticks of the CPUs in `allowed` (all of them with `None`), from the text of
/// `/proc/stat`. A CPU of `allowed` that has no line (offline) counts nothing.
pub(crate) fn idle_ticks(stat: &str, allowed: Option<&[usize]>) -> Option<u64> {
    // user nice system idle iowait ...
    let idle = |fields: &str| -> Option<u64> {
        let mut numbers = fields.split_whitespace().skip(3).map(|f| f.parse::<u64>().ok());
        let idle = numbers.next()??;
        Some(idle + numbers.next().flatten().unwrap_or(0))
    };
    let Some(allowed) = allowed else {
        return stat.lines().find_map(|l| l.strip_prefix("cpu ")).and_then(idle);
    };
    let mut total = None;
    for line in stat.lines() {
        let Some((cpu, fields)) = line.strip_prefix("cpu").and_then(|rest| rest.split_once(' ')) else {
            continue;
        };
        if cpu.parse::<usize>().is_ok_and(|cpu| allowed.contains(&cpu)) {
            *total.get_or_insert(0) += idle(fields)?;
        }
    }
    total
}

/// The CPUs the calling thread may run on (threads inherit the process's affinity); `None`
/// where it cannot be read.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set; `sched_getaffinity` writes at most its
    // size into it, and CPU_ISSET reads within it for CPUs under CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) != 0 {
            return None;
        }
        let cpus: Vec<usize> =
            (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect();
        Some(cpus).filter(|c| !c.is_empty())
    }
}

/// The CPUs this process may run on: not read on this OS.
#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Option<Vec<usize>> {
    None
}

/// The cgroup v2 path of this process, from the text of `/proc/self/cgroup` (its `0::` line).
pub(crate) fn cgroup_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim).filter(|p| p.starts_with('/'))
}

/// Cores a `cpu.max` file allows: its quota over its period; `None` for `max` (no limit) or
/// text that is not a quota.
pub(crate) fn quota_cores(cpu_max: &str) -> Option<f64> {
    let mut fields = cpu_max.split_whitespace();
    let quota = fields.next()?.parse::<f64>().ok()?;
    let period = fields.next().map_or(Some(100_000.0), |p| p.parse::<f64>().ok())?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// A `cpu.stat` file's `usage_usec`.
pub(crate) fn usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse().ok())
}

/// The tightest quota on this process's cgroup v2 path, with that cgroup's usage.
fn own_quota() -> Option<Quota> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    quota_on_path(Path::new(CGROUP_ROOT), cgroup_path(&text)?)
}

/// The tightest quota from the cgroup at `path` (under the mount `root`) up to the root, with
/// the usage of the cgroup that sets it.
fn quota_on_path(root: &Path, path: &str) -> Option<Quota> {
    let mut dir: PathBuf = root.join(path.trim_start_matches('/'));
    let mut tightest: Option<(f64, PathBuf)> = None;
    // Bounded: each step goes one folder up, and stops at the mount.
    while dir.starts_with(root) {
        let cores = std::fs::read_to_string(dir.join("cpu.max")).ok().as_deref().and_then(quota_cores);
        if let Some(cores) = cores
            && tightest.as_ref().is_none_or(|(least, _)| cores < *least)
        {
            tightest = Some((cores, dir.clone()));
        }
        if !dir.pop() {
            break;
        }
    }
    let (cores, dir) = tightest?;
    let usage_usec = usage_usec(&std::fs::read_to_string(dir.join("cpu.stat")).ok()?)?;
    Some(Quota { cores, usage_usec })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 1000 20 0 0 0 0 0\n\
                        cpu0 50 0 25 300 10 0 0 0 0 0\n\
                        cpu1 50 0 25 700 10 0 0 0 0 0\n\
                        intr 12345\nctxt 678\n";

    #[test]
    fn idle_ticks_count_the_allowed_cpus_only() {
        assert_eq!(idle_ticks(STAT, None), Some(1_020), "every CPU: the aggregate line");
        assert_eq!(idle_ticks(STAT, Some(&[0])), Some(310));
        assert_eq!(idle_ticks(STAT, Some(&[1])), Some(710));
        assert_eq!(idle_ticks(STAT, Some(&[0, 1, 7])), Some(1_020), "an offline CPU counts nothing");
        assert_eq!(idle_ticks(STAT, Some(&[7])), None, "none of the allowed CPUs is listed");
        assert_eq!(idle_ticks("cpu0 1 2\n", Some(&[0])), None, "a line without an idle field");
        assert_eq!(idle_ticks("", None), None);
    }

    #[test]
    fn cgroup_files_are_read_or_refused() {
        assert_eq!(
            cgroup_path("0::/kubepods.slice/pod1/cri-containerd-a.scope\n"),
            Some("/kubepods.slice/pod1/cri-containerd-a.scope")
        );
        assert_eq!(cgroup_path("12:cpu,cpuacct:/docker/abc\n0::/\n"), Some("/"));
        assert_eq!(cgroup_path("12:cpu,cpuacct:/docker/abc\n"), None, "cgroup v1 only");
        assert_eq!(quota_cores("200000 100000\n"), Some(2.0));
        assert_eq!(quota_cores("50000 100000"), Some(0.5));
        assert_eq!(quota_cores("max 100000\n"), None, "no limit");
        assert_eq!(quota_cores("0 100000"), None);
        assert_eq!(quota_cores(""), None);
        assert_eq!(usage_usec("usage_usec 1234567\nuser_usec 1000000\n"), Some(1_234_567));
        assert_eq!(usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn the_tightest_quota_on_the_path_wins_with_its_cgroups_usage() {
        let root = std::env::temp_dir().join(format!("granary-cgroup-{}", std::process::id()));
        let pod = root.join("kubepods/pod");
        let container = pod.join("container");
        std::fs::create_dir_all(&container).unwrap();
        std::fs::write(root.join("kubepods/cpu.max"), "max 100000\n").unwrap();
        std::fs::write(pod.join("cpu.max"), "150000 100000\n").unwrap();
        std::fs::write(pod.join("cpu.stat"), "usage_usec 9000000\n").unwrap();
        std::fs::write(container.join("cpu.max"), "400000 100000\n").unwrap();
        std::fs::write(container.join("cpu.stat"), "usage_usec 5000000\n").unwrap();
        let quota = quota_on_path(&root, "/kubepods/pod/container");
        assert_eq!(quota, Some(Quota { cores: 1.5, usage_usec: 9_000_000 }));
        assert_eq!(quota_on_path(&root, "/kubepods"), None, "no quota above");
        assert_eq!(quota_on_path(&root, "/elsewhere"), None, "missing folders");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn idle_is_the_smaller_of_the_cpus_and_the_quota() {
        let then = Reading { idle_ticks: 1_000, quota: Some(Quota { cores: 2.0, usage_usec: 0 }) };
        // 2 s: 600 idle ticks (3 cores idle), and 1.5 cores used of a 2-core quota.
        let now = Reading { idle_ticks: 1_600, quota: Some(Quota { cores: 2.0, usage_usec: 3_000_000 }) };
        assert_eq!(now.idle_since(&then, 2.0), 0.5);
        // Over the quota (a burst the kernel throttles later): no room, not less than none.
        let over = Reading { idle_ticks: 1_600, quota: Some(Quota { cores: 2.0, usage_usec: 5_000_000 }) };
        assert_eq!(over.idle_since(&then, 2.0), 0.0);
        let unlimited = |ticks| Reading { idle_ticks: ticks, quota: None };
        assert_eq!(unlimited(1_600).idle_since(&unlimited(1_000), 2.0), 3.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pinned_to_one_cpu_sees_at_most_that_cpu_idle() {
        let Some(cpus) = allowed_cpus() else { return };
        let first = cpus[0];
        let idle = std::thread::spawn(move || {
            // SAFETY: as in `allowed_cpus`; the set outlives the call, which only reads it.
            let pinned = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(first, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) == 0
            };
            assert!(pinned, "pinning this thread");
            assert_eq!(allowed_cpus(), Some(vec![first]));
            let before = Reading::now().expect("/proc/stat");
            let start = std::time::Instant::now();
            std::thread::sleep(std::time::Duration::from_millis(300));
            let after = Reading::now().expect("/proc/stat");
            after.idle_since(&before, start.elapsed().as_secs_f64())
        })
        .join()
        .unwrap();
        // One CPU's idle time, give or take a tick at each end of the interval.
        assert!((0.0..=1.0 + 2.0 / (TICKS_PER_SECOND * 0.3)).contains(&idle), "{idle}");
    }
}
