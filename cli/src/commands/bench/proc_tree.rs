//! The bench process and its child processes (the local service's workers), read from `/proc`:
//! CPU time (user plus system time of every thread, the figure `top` shows, so a window's cost is
//! the difference of two readings taken while the workers run) and the children's peak resident
//! memory.

use std::path::Path;

/// Clock ticks per second of the `/proc/*/stat` times: Linux fixes `USER_HZ` at 100 for user
/// space on every architecture it supports.
const TICKS_PER_SECOND: f64 = 100.0;

/// Most `/proc` entries looked at when listing children (a bound on the scan, far above any
/// machine's process count).
const MAX_PROC_ENTRIES: usize = 1 << 20;

/// CPU seconds used so far, split between this process and its children.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSeconds {
    /// This process: the dispatcher and the trainers' clients.
    pub own: f64,
    /// Its children alive now: the workers.
    pub children: f64,
}

impl CpuSeconds {
    /// Both together.
    pub fn total(&self) -> f64 {
        self.own + self.children
    }

    /// What was used between `before` and this reading (never negative: a child that exited
    /// takes its seconds with it).
    pub fn since(&self, before: &CpuSeconds) -> CpuSeconds {
        CpuSeconds {
            own: (self.own - before.own).max(0.0),
            children: (self.children - before.children).max(0.0),
        }
    }
}

/// CPU seconds used so far by this process and by its children alive now; `None` where `/proc`
/// cannot be read (not Linux).
pub fn cpu_seconds() -> Option<CpuSeconds> {
    let own = stat_of(Path::new("/proc/self/stat"))?;
    let children: u64 = children()?.iter().map(|(_, stat)| stat.ticks).sum();
    Some(CpuSeconds {
        own: own.ticks as f64 / TICKS_PER_SECOND,
        children: children as f64 / TICKS_PER_SECOND,
    })
}

/// The largest peak resident set (`VmHWM`) of this process's children alive now, in bytes;
/// `None` where `/proc` cannot be read or there is no child.
pub fn children_peak_rss_bytes() -> Option<u64> {
    children()?
        .iter()
        .filter_map(|(pid, _)| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| crate::summary::peak_rss_of(&status))
        .max()
}

/// The children of this process alive now, with their stat; `None` where `/proc` cannot be
/// listed.
fn children() -> Option<Vec<(u32, Stat)>> {
    let pid = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.take(MAX_PROC_ENTRIES).flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process may exit between the listing and the read: skip it.
        if let Some(stat) = stat_of(&entry.path().join("stat"))
            && stat.ppid == pid
        {
            found.push((child, stat));
        }
    }
    Some(found)
}

/// The fields of `/proc/PID/stat` this module uses.
struct Stat {
    ppid: u32,
    /// `utime + stime`, in clock ticks.
    ticks: u64,
}

fn stat_of(path: &Path) -> Option<Stat> {
    parse(&std::fs::read_to_string(path).ok()?)
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
fn parse(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    // After the name: state (3), ppid (4), … utime (14), stime (15).
    let fields: Vec<&str> = rest.split_whitespace().take(13).collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(Stat { ppid: u32::try_from(field(4)?).ok()?, ticks: field(14)? + field(15)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let line = "4242 (granary (w) 1) S 17 4242 17 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9 0";
        let stat = parse(line).unwrap();
        assert_eq!(stat.ppid, 17);
        assert_eq!(stat.ticks, 281);
        assert!(parse("4242 granary S 17").is_none(), "no parenthesised name");
        assert!(parse("4242 (g) S 17 1 2").is_none(), "too short");
    }

    #[test]
    fn reads_the_peak_resident_set_in_bytes() {
        let status = "Name:\tgranary\nVmPeak:\t  900 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(crate::summary::peak_rss_of(status), Some(2048 * 1024));
        assert_eq!(crate::summary::peak_rss_of("Name:\tgranary\n"), None, "a kernel thread has no VmHWM");
    }

    #[test]
    fn a_child_reports_its_peak_resident_set() {
        if !Path::new("/proc/self/status").exists() {
            return;
        }
        // A bounded child that lives long enough to be read.
        let Ok(mut child) = std::process::Command::new("sleep").arg("5").spawn() else { return };
        let peak = children_peak_rss_bytes();
        let _ = child.kill();
        let _ = child.wait();
        assert!(peak.is_some_and(|bytes| bytes > 0), "{peak:?}");
    }

    #[test]
    fn this_process_reads_a_growing_cpu_time() {
        let Some(before) = cpu_seconds() else { return };
        // Burn a little CPU (bounded) so the reading can only grow.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = cpu_seconds().unwrap();
        assert!(after.own >= before.own, "{after:?} < {before:?}");
        assert!(after.since(&before).total() >= 0.0);
    }
}
