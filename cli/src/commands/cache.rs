//! `granary cache ls|inspect|rm STORE_URL ...`: look into and clean up an autocache store.
//!
//! - `ls STORE_URL [--json]`: one line per entry: fingerprint (first 12 hex digits), pipeline,
//!   cached stage, splits published/total, size, last use. `--json` prints the entries
//!   (`granary_store::cache::EntrySummary`) as a JSON array instead.
//! - `inspect STORE_URL FINGERPRINT [--json]`: the entry's info, a line per published split, the
//!   problems a reader would hit, and the count of unpublished objects (left by interrupted
//!   writers). `--json` prints `granary_store::cache::EntryDetail`.
//! - `rm STORE_URL FINGERPRINT... | --all`: removes entries, printing each with its object count.
//!
//! FINGERPRINT may be any unique prefix of at least 6 hex digits. Exit status: 0 on success, 2 for
//! bad input (an unusable URL, a malformed, unknown or ambiguous fingerprint; clap's usage errors
//! too), 1 when the store fails.

use crate::exit::InvalidInput;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use granary_store::cache::{
    CacheError, CacheStore, EntryDetail, EntrySummary, FINGERPRINT_HEX_LEN, Fingerprint,
};

/// Fewest hex digits accepted as a fingerprint prefix.
const MIN_PREFIX: usize = 6;
/// Hex digits of a fingerprint shown in the `ls` table.
const SHORT: usize = 12;

/// Arguments of `granary cache`.
#[derive(clap::Args, Clone, Debug)]
pub struct CacheArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CacheCommand,
}

/// The `granary cache` subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum CacheCommand {
    /// List the cache entries: fingerprint, pipeline, stage, splits done/total, size, last use.
    Ls {
        /// The cache store (file:///..., s3://bucket/prefix/, memory://name/, ...).
        #[arg(value_name = "STORE_URL")]
        store: String,
        /// Print the entries as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry: its info, published splits, problems and unpublished objects.
    Inspect {
        /// The cache store.
        #[arg(value_name = "STORE_URL")]
        store: String,
        /// The entry's fingerprint, or a unique prefix of at least 6 hex digits.
        fingerprint: String,
        /// Print the entry as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove entries (all their objects).
    Rm {
        /// The cache store.
        #[arg(value_name = "STORE_URL")]
        store: String,
        /// Fingerprints of the entries, or unique prefixes of at least 6 hex digits.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        fingerprints: Vec<String>,
        /// Remove every entry.
        #[arg(long)]
        all: bool,
    },
}

/// Runs `granary cache`.
pub fn cache(args: &CacheArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // What the user typed wrong is an `InvalidInput`: main reports it with exit status 2.
    let text = runtime.block_on(run(&args.command))?;
    let mut stdout = std::io::stdout().lock();
    // A closed pipe cannot be reported anywhere useful.
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
    Ok(ExitCode::SUCCESS)
}

/// Carries out `command` and returns what to print.
async fn run(command: &CacheCommand) -> anyhow::Result<String> {
    match command {
        CacheCommand::Ls { store, json } => {
            let cache = open(store)?;
            let entries = cache.list_entries().await.with_context(|| format!("cannot list {store}"))?;
            if *json {
                return Ok(serde_json::to_string_pretty(&entries)? + "\n");
            }
            Ok(ls_table(&entries, store, now_unix_s()))
        }
        CacheCommand::Inspect { store, fingerprint, json } => {
            let cache = open(store)?;
            let entries = cache.list_entries().await.with_context(|| format!("cannot list {store}"))?;
            let fp = resolve(&entries, fingerprint, store)?;
            let detail = cache.inspect(&fp).await.with_context(|| format!("cannot inspect entry {fp}"))?;
            if *json {
                return Ok(serde_json::to_string_pretty(&detail)? + "\n");
            }
            Ok(inspect_text(&detail, now_unix_s()))
        }
        CacheCommand::Rm { store, fingerprints, all } => {
            let cache = open(store)?;
            let entries = cache.list_entries().await.with_context(|| format!("cannot list {store}"))?;
            let doomed: BTreeSet<Fingerprint> = if *all {
                entries.iter().filter_map(|e| Fingerprint::parse(&e.fingerprint).ok()).collect()
            } else {
                fingerprints.iter().map(|p| resolve(&entries, p, store)).collect::<Result<_, _>>()?
            };
            if doomed.is_empty() {
                return Ok(format!("no cache entries at {store}\n"));
            }
            let mut out = String::new();
            for fp in &doomed {
                let objects = cache.remove(fp).await.with_context(|| format!("cannot remove entry {fp}"))?;
                let _ = writeln!(out, "removed {fp} ({objects} object{})", plural(objects));
            }
            Ok(out)
        }
    }
}

/// Opens the cache at `url`; an unusable URL is bad input.
fn open(url: &str) -> anyhow::Result<CacheStore> {
    CacheStore::open(url).map_err(|e| match e {
        CacheError::Url(_) => anyhow::Error::new(InvalidInput(e.to_string())),
        other => anyhow::Error::new(other),
    })
}

/// The one entry whose fingerprint starts with `prefix` (at least 6 hex digits, any case).
fn resolve(entries: &[EntrySummary], prefix: &str, store: &str) -> Result<Fingerprint, InvalidInput> {
    let wanted = prefix.to_ascii_lowercase();
    if wanted.len() < MIN_PREFIX
        || wanted.len() > FINGERPRINT_HEX_LEN
        || !wanted.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Err(InvalidInput(format!(
            "`{prefix}` is not a fingerprint: give {MIN_PREFIX} to {FINGERPRINT_HEX_LEN} hex digits"
        )));
    }
    let matches: Vec<&str> =
        entries.iter().map(|e| e.fingerprint.as_str()).filter(|fp| fp.starts_with(&wanted)).collect();
    match matches.as_slice() {
        [] => {
            Err(InvalidInput(format!("no cache entry at {store} has a fingerprint starting with `{wanted}`")))
        }
        [one] => Fingerprint::parse(one).map_err(|e| InvalidInput(e.to_string())),
        many => Err(InvalidInput(format!(
            "`{prefix}` is ambiguous: it starts {} fingerprints ({}); give more digits",
            many.len(),
            many.iter().map(|fp| &fp[..SHORT]).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The `ls` table.
fn ls_table(entries: &[EntrySummary], store: &str, now: u64) -> String {
    if entries.is_empty() {
        return format!("no cache entries at {store}\n");
    }
    let header = ["FINGERPRINT", "PIPELINE", "STAGE", "SPLITS", "SIZE", "LAST USED"].map(String::from);
    let mut rows = vec![header.to_vec()];
    for e in entries {
        let info = e.info.as_ref();
        rows.push(vec![
            e.fingerprint.chars().take(SHORT).collect(),
            info.map_or("-".into(), |i| i.pipeline.clone()),
            info.map_or("-".into(), |i| i.stage.clone()),
            format!("{}/{}", e.splits, info.map_or("?".into(), |i| i.splits_total.to_string())),
            human_bytes(e.bytes),
            ago(e.last_used_unix_s(), now),
        ]);
    }
    table(&rows)
}

/// The `inspect` report.
fn inspect_text(d: &EntryDetail, now: u64) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<12} {value}");
    };
    field("fingerprint", d.fingerprint.clone());
    match &d.info {
        Some(i) => {
            field("pipeline", i.pipeline.clone());
            field("source", i.source_url.clone());
            field("stage", format!("{} (boundary {}: {})", i.stage, i.boundary, i.stages.join(" → ")));
            field("splits", format!("{} published of {}", d.manifests.len(), i.splits_total));
            field("created", ago(i.created_unix_s, now));
            field("last used", ago(i.last_used_unix_s, now));
            field("format", format!("version {}", i.format_version));
        }
        None => {
            field("info", "missing or unreadable entry.json".into());
            field("splits", format!("{} published", d.manifests.len()));
        }
    }
    field("size", format!("{} in {} object{}", human_bytes(d.bytes), d.objects, plural(d.objects)));
    field("unpublished", format!("{} object{}", d.unpublished_objects, plural(d.unpublished_objects)));
    for p in &d.problems {
        field("problem", format!("split {}: {}", p.split, p.reason));
    }
    if !d.manifests.is_empty() {
        let mut rows = vec![
            ["SPLIT", "ELEMENTS", "CHUNKS", "STORED", "RAW", "WRITER", "WRITTEN"].map(String::from).to_vec(),
        ];
        for m in &d.manifests {
            rows.push(vec![
                m.split.to_string(),
                m.elements.to_string(),
                m.chunks.len().to_string(),
                human_bytes(m.stored_bytes()),
                human_bytes(m.raw_bytes()),
                m.writer.clone(),
                ago(m.written_unix_s, now),
            ]);
        }
        out.push('\n');
        out.push_str(&table(&rows));
    }
    out
}

/// Left-aligned columns two spaces apart, without trailing blanks.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `1.5 MiB` and the like.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `5m ago` and the like; `-` for an unknown (zero) time.
fn ago(then_unix_s: u64, now_unix_s: u64) -> String {
    if then_unix_s == 0 {
        return "-".into();
    }
    let s = now_unix_s.saturating_sub(then_unix_s);
    match s {
        0 => "just now".into(),
        1..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86_400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(fp: &str) -> EntrySummary {
        EntrySummary {
            fingerprint: fp.to_string(),
            info: None,
            splits: 1,
            bytes: 2048,
            objects: 3,
            last_modified_unix_s: 100,
        }
    }

    #[test]
    fn resolves_unique_prefixes_only() {
        let a = format!("abcdef01{}", "0".repeat(56));
        let b = format!("abcdef02{}", "0".repeat(56));
        let entries = [summary(&a), summary(&b)];
        assert_eq!(resolve(&entries, "ABCDEF01", "s").unwrap().as_str(), a);
        assert_eq!(resolve(&entries, &b, "s").unwrap().as_str(), b);
        assert!(resolve(&entries, "abcdef", "s").unwrap_err().0.contains("ambiguous"));
        assert!(resolve(&entries, "abcde", "s").unwrap_err().0.contains("6 to 64 hex digits"));
        assert!(resolve(&entries, "abcdefgh", "s").unwrap_err().0.contains("not a fingerprint"));
        assert!(resolve(&entries, "123456", "s").unwrap_err().0.contains("no cache entry at s"));
    }

    #[test]
    fn formats_sizes_times_and_tables() {
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(ago(0, 10), "-");
        assert_eq!(ago(10, 10), "just now");
        assert_eq!(ago(10, 70), "1m ago");
        assert_eq!(ago(1, 2 * 86_400 + 1), "2d ago");
        assert_eq!(
            table(&[vec!["a".into(), "bb".into()], vec!["ccc".into(), "d".into()]]),
            "a    bb\nccc  d\n"
        );
    }
}
