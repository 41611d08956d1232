//! CPU time of the bench process and of its child processes (the local service's workers), read
//! from `/proc`: user plus system time of every thread, the figure `top` shows, so a window's
//! cost is the difference of two readings taken while the workers run.

use std::path::Path;

/// Clock ticks per second of the `/proc/*/stat` times: Linux fixes `USER_HZ` at 100 for user
/// space on every architecture it supports.
const TICKS_PER_SECOND: f64 = 100.0;

/// Most `/proc` entries looked at when listing children (a bound on the scan, far above any
/// machine's process count).
const MAX_PROC_ENTRIES: usize = 1 << 20;

/// CPU seconds used so far by this process and by its children alive now; `None` where `/proc`
/// cannot be read (not Linux).
pub fn process_tree_seconds() -> Option<f64> {
    let own = stat_of(Path::new("/proc/self/stat"))?;
    let pid = std::process::id();
    let mut ticks = own.ticks;
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.take(MAX_PROC_ENTRIES).flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may exit between the listing and the read: skip it.
        if let Some(stat) = stat_of(&entry.path().join("stat"))
            && stat.ppid == pid
        {
            ticks += stat.ticks;
        }
    }
    Some(ticks as f64 / TICKS_PER_SECOND)
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
    fn this_process_reads_a_growing_cpu_time() {
        let Some(before) = process_tree_seconds() else { return };
        // Burn a little CPU (bounded) so the reading can only grow.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = process_tree_seconds().unwrap();
        assert!(after >= before, "{after} < {before}");
    }
}
