//! The data plane across real processes on 127.0.0.1: exactly-once visitation with several
//! workers and consumers, worker and dispatcher failures, checkpoint and resume.

use granary_e2e::*;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn distributed_consumers_get_every_element_once_and_equal_batch_counts() {
    let data = dataset(150, 8, 12, 3);
    let journal = data.dir.path().join("journal");
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &journal);
    let _workers: Vec<Proc> = (0..3).map(|_| start_worker(&d.address)).collect();
    let mut a = start_consumer(&d.address, &["--index", "0", "--consumers", "2"]);
    let mut b = start_consumer(&d.address, &["--index", "1", "--consumers", "2"]);
    assert!(a.finish(LONG), "consumer 0 did not finish");
    assert!(b.finish(LONG), "consumer 1 did not finish");
    assert_exactly_once(a.seen.iter().chain(&b.seen), &data.keys, 3);
    for epoch in 0..3 {
        let na = a.seen.iter().filter(|s| s.epoch == epoch).count();
        let nb = b.seen.iter().filter(|s| s.epoch == epoch).count();
        assert_eq!(na, nb, "epoch {epoch}: consumers got {na} and {nb} batches");
        assert!(na > 0);
    }
}

#[test]
fn replicated_consumers_each_see_every_element() {
    let data = dataset(60, 8, 12, 2);
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal"));
    let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
    let args = ["--replicated", "--consumers", "2"];
    let mut a = start_consumer(&d.address, &[&args[..], &["--index", "0"]].concat());
    let mut b = start_consumer(&d.address, &[&args[..], &["--index", "1"]].concat());
    assert!(a.finish(LONG) && b.finish(LONG), "replicated consumers did not finish");
    assert_exactly_once(&a.seen, &data.keys, 2);
    assert_exactly_once(&b.seen, &data.keys, 2);
}

/// A small deterministic generator for test choices.
fn pick(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % n.max(1)
}

#[test]
fn a_worker_killed_mid_epoch_loses_and_duplicates_nothing() {
    // 480 elements of 600 KB: buffers hold a small part of the epoch, so the victim is still
    // producing (and holds leases) when it dies.
    let data = large_dataset(480, 8, 16, 1);
    let total_batches = data.keys.len().div_ceil(8) / 2;
    for seed in 0..5u64 {
        let d =
            start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join(format!("journal-{seed}")));
        let workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
        let mut c = start_consumer(&d.address, &["--step-ms", "5"]);
        let at = 1 + pick(seed, total_batches as u64 - 2) as usize;
        c.collect(at, LONG);
        let victim = pick(seed + 100, 2) as usize;
        workers[victim].signal(libc::SIGKILL);
        assert!(
            c.finish(LONG),
            "seed {seed}: the consumer did not finish after a worker was killed at batch {at}"
        );
        assert_exactly_once(&c.seen, &data.keys, 1);
    }
}

#[test]
fn a_restarted_dispatcher_resumes_the_epoch() {
    let data = dataset(120, 8, 8, 2);
    let journal = data.dir.path().join("journal");
    let mut d = start_dispatcher(&data.manifest, "127.0.0.1:0", &journal);
    let address = d.address.clone();
    let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&address)).collect();
    let mut c = start_consumer(&address, &[]);
    c.collect(6, LONG);
    d.proc.signal(libc::SIGKILL);
    assert!(d.proc.wait_for(Duration::from_secs(10)));
    let _d2 = start_dispatcher(&data.manifest, &address, &journal);
    assert!(c.finish(LONG), "the consumer did not finish after the dispatcher restarted");
    assert_exactly_once(&c.seen, &data.keys, 2);
}

#[test]
fn a_checkpoint_resumes_in_a_new_process() {
    let data = dataset(120, 8, 8, 1);
    let total = data.keys.len().div_ceil(8) as u64;
    for seed in 0..2u64 {
        let d =
            start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join(format!("journal-{seed}")));
        let _workers: Vec<Proc> = (0..2).map(|_| start_worker(&d.address)).collect();
        let checkpoint = data.dir.path().join(format!("position-{seed}"));
        let cp = checkpoint.display().to_string();
        let stop = 1 + pick(seed + 7, total - 2);
        let mut first = start_consumer(&d.address, &["--stop-after", &stop.to_string(), "--checkpoint", &cp]);
        assert!(first.finish(LONG), "the first consumer did not stop cleanly");
        assert_eq!(first.seen.len() as u64, stop);
        let mut second = start_consumer(&d.address, &["--resume", &cp]);
        assert!(second.finish(LONG), "the resumed consumer did not finish");
        assert_exactly_once(first.seen.iter().chain(&second.seen), &data.keys, 1);
    }
}
