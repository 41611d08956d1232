//! The memory this process may use, and the budgets a worker takes from it by default: for data
//! in flight (the prefetch budget), and for the Parquet footers a source keeps.
//!
//! A fixed budget for data in flight fits one size of worker: 512 MiB is little beside a node's
//! memory, but in a pod with `limits.memory: 512Mi` the budget alone could reach the limit
//! (under a stalled trainer, a worker at the 512 MiB budget was measured at 307 MiB after 6 s,
//! and the budget bounds how far it may go). As tf.data sizes its autotuned buffers within a
//! share of the memory it has, the default budget is a quarter of the tightest limit on this
//! process, at most [`MAX_PREFETCH_BYTES`] (more does not feed a trainer any faster: the pacer
//! and the client's buffer keep the pipeline ahead) and at least [`MIN_PREFETCH_BYTES`] (under
//! two batches of 128 `uint8` 224×224 images, 19 MB each: below it a worker could not hold one
//! batch while it makes the next).
//!
//! The limit is the smaller of the machine's memory (`/proc/meminfo`'s `MemTotal`) and the
//! tightest `memory.max` on the process's cgroup v2 path (a Kubernetes pod's `limits.memory`).
//! The rest of a worker's memory (the engine, decode buffers, the shuffle buffer, the serving
//! queues) is what the other three quarters leave room for. `--prefetch-bytes` overrides it.
//!
//! A source keeps the decoded footers of its Parquet files (`source/parquet/footers.rs`) within a
//! sixteenth of the limit, at most [`MAX_FOOTER_BYTES`] and at least [`MIN_FOOTER_BYTES`]: 32 MiB
//! in a pod limited to 512 MiB, beside its 128 MiB prefetch budget.

use std::path::{Path, PathBuf};

/// The largest default prefetch budget.
pub const MAX_PREFETCH_BYTES: usize = 512 << 20;
/// The smallest default prefetch budget.
pub const MIN_PREFETCH_BYTES: usize = 32 << 20;
/// The default budget is this fraction (1 / it) of the memory limit.
const LIMIT_SHARE: u64 = 4;
/// The largest budget for the Parquet footers a source keeps.
pub const MAX_FOOTER_BYTES: usize = 128 << 20;
/// The smallest such budget.
pub const MIN_FOOTER_BYTES: usize = 8 << 20;
/// The footers' budget is this fraction (1 / it) of the memory limit.
const FOOTER_SHARE: u64 = 16;
/// Where cgroup v2 is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The default prefetch budget of a process whose memory limit is `limit` bytes (`None`:
/// unknown): a quarter of it within [`MIN_PREFETCH_BYTES`] and [`MAX_PREFETCH_BYTES`].
pub fn prefetch_for(limit: Option<u64>) -> usize {
    share_of(limit, LIMIT_SHARE, MIN_PREFETCH_BYTES..=MAX_PREFETCH_BYTES)
}

/// The budget for the Parquet footers a source keeps, in a process whose memory limit is `limit`
/// bytes (`None`: unknown): a sixteenth of it within [`MIN_FOOTER_BYTES`] and [`MAX_FOOTER_BYTES`].
pub fn footers_for(limit: Option<u64>) -> usize {
    share_of(limit, FOOTER_SHARE, MIN_FOOTER_BYTES..=MAX_FOOTER_BYTES)
}

/// `1 / share` of `limit`, within `bounds`; the largest bound when the limit is unknown.
fn share_of(limit: Option<u64>, share: u64, bounds: std::ops::RangeInclusive<usize>) -> usize {
    let Some(limit) = limit else {
        return *bounds.end();
    };
    let part = usize::try_from(limit / share).unwrap_or(usize::MAX);
    part.clamp(*bounds.start(), *bounds.end())
}

/// The default prefetch budget of this process, from [`memory_limit`].
pub fn default_prefetch_bytes() -> usize {
    prefetch_for(memory_limit())
}

/// The memory this process may use, in bytes: the smaller of the machine's and its cgroup's
/// limit; `None` where neither can be read.
pub fn memory_limit() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().as_deref().and_then(mem_total);
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .as_deref()
        .and_then(cgroup_path)
        .and_then(|path| tightest_limit(Path::new(CGROUP_ROOT), path));
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib = line.split_whitespace().next()?.parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The cgroup v2 path of this process, from the text of `/proc/self/cgroup` (its `0::` line).
fn cgroup_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim).filter(|p| p.starts_with('/'))
}

/// The bytes a `memory.max` file allows; `None` for `max` (no limit) or text that is not a
/// number.
fn limit_bytes(memory_max: &str) -> Option<u64> {
    memory_max.trim().parse::<u64>().ok().filter(|&b| b > 0)
}

/// The tightest `memory.max` from the cgroup at `path` (under the mount `root`) up to the root.
fn tightest_limit(root: &Path, path: &str) -> Option<u64> {
    let mut dir: PathBuf = root.join(path.trim_start_matches('/'));
    let mut tightest: Option<u64> = None;
    // Bounded: each step goes one folder up, and stops at the mount.
    while dir.starts_with(root) {
        if let Some(limit) =
            std::fs::read_to_string(dir.join("memory.max")).ok().as_deref().and_then(limit_bytes)
        {
            tightest = Some(tightest.map_or(limit, |t| t.min(limit)));
        }
        if !dir.pop() {
            break;
        }
    }
    tightest
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_budget_is_a_quarter_of_the_limit_within_its_bounds() {
        assert_eq!(prefetch_for(None), MAX_PREFETCH_BYTES, "unknown: the largest");
        assert_eq!(prefetch_for(Some(64 << 30)), MAX_PREFETCH_BYTES, "a large machine: the largest");
        assert_eq!(prefetch_for(Some(2048 * MIB)), 512 << 20);
        assert_eq!(prefetch_for(Some(1024 * MIB)), 256 << 20, "a pod limited to 1Gi");
        assert_eq!(prefetch_for(Some(512 * MIB)), 128 << 20, "a pod limited to 512Mi");
        assert_eq!(prefetch_for(Some(64 * MIB)), MIN_PREFETCH_BYTES, "never below the least");
        assert_eq!(prefetch_for(Some(u64::MAX)), MAX_PREFETCH_BYTES);
    }

    #[test]
    fn the_footers_budget_is_a_sixteenth_of_the_limit_within_its_bounds() {
        assert_eq!(footers_for(None), MAX_FOOTER_BYTES, "unknown: the largest");
        assert_eq!(footers_for(Some(64 << 30)), MAX_FOOTER_BYTES, "a large machine: the largest");
        assert_eq!(footers_for(Some(1024 * MIB)), 64 << 20, "a pod limited to 1Gi");
        assert_eq!(footers_for(Some(512 * MIB)), 32 << 20, "a pod limited to 512Mi");
        assert_eq!(footers_for(Some(64 * MIB)), MIN_FOOTER_BYTES, "never below the least");
    }

    #[test]
    fn proc_and_cgroup_files_are_read_or_refused() {
        assert_eq!(mem_total("MemTotal:       24588136 kB\nMemFree: 1 kB\n"), Some(24_588_136 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(
            cgroup_path("0::/kubepods.slice/pod1/cri-containerd-a.scope\n"),
            Some("/kubepods.slice/pod1/cri-containerd-a.scope")
        );
        assert_eq!(cgroup_path("12:memory:/docker/abc\n"), None, "cgroup v1 only");
        assert_eq!(limit_bytes("536870912\n"), Some(512 * MIB));
        assert_eq!(limit_bytes("max\n"), None, "no limit");
        assert_eq!(limit_bytes("0"), None);
        assert_eq!(limit_bytes(""), None);
    }

    #[test]
    fn the_tightest_limit_on_the_path_wins() {
        let root = std::env::temp_dir().join(format!("granary-memory-{}", std::process::id()));
        let pod = root.join("kubepods/pod");
        let container = pod.join("container");
        std::fs::create_dir_all(&container).unwrap();
        std::fs::write(root.join("kubepods/memory.max"), "max\n").unwrap();
        std::fs::write(pod.join("memory.max"), format!("{}\n", 768 * MIB)).unwrap();
        std::fs::write(container.join("memory.max"), format!("{}\n", 1024 * MIB)).unwrap();
        assert_eq!(tightest_limit(&root, "/kubepods/pod/container"), Some(768 * MIB), "the pod's, above");
        std::fs::write(container.join("memory.max"), format!("{}\n", 256 * MIB)).unwrap();
        assert_eq!(tightest_limit(&root, "/kubepods/pod/container"), Some(256 * MIB), "the container's");
        assert_eq!(tightest_limit(&root, "/kubepods"), None, "no limit set");
        assert_eq!(tightest_limit(&root, "/elsewhere"), None, "a path with no files");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
