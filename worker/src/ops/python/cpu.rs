//! CPU time of the Python runners, so that the worker's CPU-busy figure counts them: the kernel
//! reports a live child's time only in `/proc/<pid>/stat`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

struct Ledger {
    /// Live runners and the CPU ticks last read for each.
    live: BTreeMap<u32, u64>,
    /// Ticks of runners that ended.
    retired: u64,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger { live: BTreeMap::new(), retired: 0 });

fn ledger() -> std::sync::MutexGuard<'static, Ledger> {
    LEDGER.lock().unwrap_or_else(|e| e.into_inner())
}

/// User and system ticks of process `pid`, from `/proc/<pid>/stat`.
fn ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Starts counting runner `pid`.
pub fn track(pid: u32) {
    ledger().live.insert(pid, 0);
}

/// Stops counting runner `pid`, keeping the time it used (read one last time, while it still
/// exists).
pub fn retire(pid: u32) {
    let last = ticks(pid);
    let mut l = ledger();
    if let Some(seen) = l.live.remove(&pid) {
        l.retired += last.unwrap_or(seen).max(seen);
    }
}

/// CPU time every runner of this process used so far.
pub fn runners_cpu_time() -> Duration {
    let mut l = ledger();
    let pids: Vec<u32> = l.live.keys().copied().collect();
    let mut total = l.retired;
    for pid in pids {
        let now = ticks(pid).unwrap_or(0);
        if let Some(seen) = l.live.get_mut(&pid) {
            *seen = (*seen).max(now);
            total += *seen;
        }
    }
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Duration::from_nanos(total.saturating_mul(1_000_000_000) / hz)
}
