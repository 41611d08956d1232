//! A trainer that stops reading (a long checkpoint, a hung step) while its client keeps
//! heartbeating and asking for data must not hold up the other jobs its worker produces for:
//! real processes on 127.0.0.1, one dispatcher and one worker.
//!
//! The worker queues what it computes without waiting for room, and names the jobs whose queues
//! are full when it asks for a lease, so the dispatcher leases it only the other jobs' splits.
//! Before, the worker's producer waited for room in the stalled trainer's queue, and every other
//! job of the pipeline waited behind it.

use granary_e2e::*;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_stalled_trainer_holds_up_no_other_job_on_its_worker() {
    // 600 KB elements: a batch part is about 5 MB, so the stalled trainer's stream and client
    // buffers take a few parts only, and its queue on the worker fills.
    let data = large_dataset(64, 8, 8, 3);
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join("journal"));
    let _worker = start_worker(&d.address);
    // Reads one batch, then "trains" for ten minutes, heartbeating all along.
    let mut stalled =
        start_consumer(&d.address, &["--job", "stalled", "--slow-after", "1", "--slow-step-ms", "600000"]);
    stalled.collect(1, LONG);
    assert_eq!(stalled.seen.len(), 1, "the stalled trainer reads its first batch");
    // Time for the worker to fill the stalled trainer's queue, and more.
    std::thread::sleep(Duration::from_secs(3));
    let mut live = start_consumer(&d.address, &["--job", "live"]);
    assert!(live.finish(LONG), "the live trainer did not finish while the other one stalled");
    assert_exactly_once(&live.seen, &data.keys, 3);
    stalled.collect(2, Duration::from_millis(100));
    assert!(stalled.seen.len() <= 2, "the stalled trainer read on");
}
