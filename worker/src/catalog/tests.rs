//! Counting against a store that counts what it hands out: shards with large members are counted
//! from their headers, JSONL files through a fixed buffer, with the counts reading yields.

use super::ranged::Deadline;
use super::{lines, shards};
use crate::counting_store::counting_store;
use crate::source::{Object, Source, SourceError, SplitKind};
use granary_crds::SourceSpec;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn object(dir: &std::path::Path, name: &str) -> Object {
    Object { location: StorePath::from(name), size: std::fs::metadata(dir.join(name)).unwrap().len() }
}

/// A regular file's header, named `path` when given (else by `append_data`, which writes a long
/// name as a GNU extension).
fn header(path: Option<&str>, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    if let Some(path) = path {
        h.set_path(path).unwrap();
    }
    h.set_cksum();
    h
}

/// Writes shard `name` in `dir`: for each `(path, size, data)`, a member of `size` bytes holding
/// `data`, or when `data` is `None` a hole (zeros the file system need not store).
fn write_shard(dir: &std::path::Path, name: &str, members: &[(&str, u64, Option<&[u8]>)]) {
    let mut builder = tar::Builder::new(std::fs::File::create(dir.join(name)).unwrap());
    for (path, size, data) in members {
        match data {
            Some(data) => builder.append_data(&mut header(None, *size), path, *data).unwrap(),
            None => {
                builder.append(&header(Some(path), *size), std::io::empty()).unwrap();
                let file = builder.get_mut();
                file.seek(SeekFrom::Current(size.div_ceil(512) as i64 * 512)).unwrap();
            }
        }
    }
    builder.into_inner().unwrap().flush().unwrap();
}

/// What reading object `name` of the `format` source at `dir` yields: its elements' keys.
fn read_keys(
    dir: &std::path::Path,
    format: &str,
    name: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<String>, SourceError> {
    let spec: SourceSpec = serde_json::from_value(
        serde_json::json!({"url": format!("file://{}/", dir.display()), "format": format}),
    )
    .unwrap();
    let source = rt.block_on(Source::open(&spec, 1))?;
    let split = source
        .splits()
        .iter()
        .find(|s| match &s.kind {
            SplitKind::Shard(o) | SplitKind::Jsonl(o) => o.location.filename() == Some(name),
            _ => false,
        })
        .unwrap();
    let mut keys = Vec::new();
    source.read_split(split, rt.handle(), &mut |e| {
        keys.push(e.key.clone());
        true
    })?;
    Ok(keys)
}

const BIG: u64 = 64 << 20;

#[test]
fn a_shard_with_large_members_is_counted_from_its_headers() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}/2", "deep".repeat(40));
    let long_txt = format!("{long}.txt");
    write_shard(
        dir.path(),
        "big.tar",
        &[
            ("0.cls", 1, Some(b"1")),
            ("0.bin", BIG, None),
            ("1.cls", 1, Some(b"2")),
            ("1.bin", BIG + 3, None),
            // A GNU long name (over 100 bytes), and a hidden member that is no sample.
            (&long_txt, 5, Some(b"hello")),
            (".hidden", 2, Some(b"xx")),
        ],
    );
    let (rt, counting) = counting_store(dir.path());
    let store: Arc<dyn ObjectStore> = counting.clone();
    let shard = object(dir.path(), "big.tar");
    assert!(shard.size > 2 * BIG);

    let n = shards::count(&store, &shard, rt.handle(), Deadline::after(Duration::from_secs(60))).unwrap();
    assert_eq!(n, 3);
    let fetched = counting.bytes.load(Ordering::Relaxed);
    let gets = counting.gets.load(Ordering::Relaxed);
    eprintln!("counted {n} samples of a {} byte shard fetching {fetched} bytes in {gets} reads", shard.size);
    // Headers (and the long name) with at most a read-through gap after each: not the members.
    assert!(
        fetched <= 4 * super::ranged::READ_THROUGH,
        "{fetched} bytes fetched of a {} byte shard",
        shard.size
    );
    assert!(gets <= 4, "{gets} reads");

    // Reading agrees (the hidden member is not a sample, the long name is kept whole).
    let keys = read_keys(dir.path(), "webdataset", "big.tar", &rt).unwrap();
    assert_eq!(keys, ["big.tar/0", "big.tar/1", format!("big.tar/{long}").as_str()]);
    assert_eq!(n as usize, keys.len());
    // The store counts what a whole read fetches.
    let before = counting.bytes.load(Ordering::Relaxed);
    rt.block_on(async { store.get(&shard.location).await.unwrap().bytes().await.unwrap() });
    assert_eq!(counting.bytes.load(Ordering::Relaxed) - before, shard.size);
}

#[test]
fn shard_counts_match_reading_and_failures_name_the_member() {
    let dir = tempfile::tempdir().unwrap();
    // Small members read through; consecutive members of one sample make one element.
    let data = vec![7u8; 3000];
    let mut members: Vec<(String, u64, Option<&[u8]>)> = Vec::new();
    for i in 0..40 {
        members.push((format!("s/{i:03}.jpg"), data.len() as u64, Some(&data)));
        members.push((format!("s/{i:03}.cls"), 1, Some(b"3")));
    }
    let members: Vec<(&str, u64, Option<&[u8]>)> =
        members.iter().map(|(p, s, d)| (p.as_str(), *s, *d)).collect();
    write_shard(dir.path(), "small.tar", &members);
    write_shard(dir.path(), "twice.tar", &[("a.jpg", 1, Some(b"x")), ("a.png", 1, Some(b"y"))]);
    write_shard(dir.path(), "huge.tar", &[("a.bin", (1 << 30) + 1, None)]);
    let (rt, counting) = counting_store(dir.path());
    let store: Arc<dyn ObjectStore> = counting.clone();
    let deadline = || Deadline::after(Duration::from_secs(60));

    let small = object(dir.path(), "small.tar");
    let n = shards::count(&store, &small, rt.handle(), deadline()).unwrap();
    assert_eq!(n, 40);
    assert_eq!(n as usize, read_keys(dir.path(), "webdataset", "small.tar", &rt).unwrap().len());

    let twice = shards::count(&store, &object(dir.path(), "twice.tar"), rt.handle(), deadline()).unwrap_err();
    assert!(twice.to_string().contains("two members for field `image`"), "{twice}");
    let huge = shards::count(&store, &object(dir.path(), "huge.tar"), rt.handle(), deadline()).unwrap_err();
    assert!(huge.to_string().contains("huge.tar/a.bin") && huge.to_string().contains("1 GiB"), "{huge}");

    // A shard cut inside a member fails as reading would, instead of counting what is not there.
    let bytes = std::fs::read(dir.path().join("small.tar")).unwrap();
    std::fs::write(dir.path().join("cut.tar"), &bytes[..bytes.len() / 2 + 100]).unwrap();
    let cut = object(dir.path(), "cut.tar");
    assert!(read_keys(dir.path(), "webdataset", "cut.tar", &rt).is_err());
    let error = shards::count(&store, &cut, rt.handle(), deadline()).unwrap_err();
    assert!(error.to_string().contains("not a readable tar shard"), "{error}");
}

#[test]
fn a_jsonl_file_streams_through_a_fixed_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = std::fs::File::create(dir.path().join("a.jsonl")).unwrap();
    // One line far larger than the buffer, then many short ones and blank ones.
    let long = format!("{{\"text\": \"{}\"}}\n", "x".repeat(3 << 20));
    file.write_all(long.as_bytes()).unwrap();
    for i in 0..5000 {
        writeln!(file, "{{\"i\": {i}}}").unwrap();
        if i % 100 == 0 {
            writeln!(file, "   ").unwrap();
        }
    }
    drop(file);
    let (rt, counting) = counting_store(dir.path());
    let store: Arc<dyn ObjectStore> = counting.clone();
    let jsonl = object(dir.path(), "a.jsonl");
    let n = lines::count(&store, &jsonl, rt.handle(), Deadline::after(Duration::from_secs(60))).unwrap();
    assert_eq!(n, 5001);
    assert_eq!(counting.bytes.load(Ordering::Relaxed), jsonl.size, "one pass over the file");
    assert_eq!(n as usize, read_keys(dir.path(), "jsonl", "a.jsonl", &rt).unwrap().len());
}

#[test]
fn a_spent_budget_stops_counting_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.jsonl"), "{}\n{}\n").unwrap();
    let (rt, counting) = counting_store(dir.path());
    let store: Arc<dyn ObjectStore> = counting.clone();
    let spent = Deadline::after(Duration::ZERO);
    let error = lines::count(&store, &object(dir.path(), "a.jsonl"), rt.handle(), spent).unwrap_err();
    assert!(error.to_string().contains("budget"), "{error}");
    assert_eq!(counting.gets.load(Ordering::Relaxed), 0, "nothing is read once the budget is spent");
}
