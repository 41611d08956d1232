//! `--metrics-addr`: the dispatcher (`granary run --serve`) and a worker serve Prometheus
//! metrics that follow a real run.

use granary_e2e::*;
use std::time::Duration;

#[test]
fn dispatcher_and_worker_serve_metrics_that_follow_the_run() {
    let data = dataset(40, 8, 8, 1);
    let dispatcher_metrics = format!("127.0.0.1:{}", free_port());
    let d = start_dispatcher_with(
        &data.manifest,
        "127.0.0.1:0",
        &data.dir.path().join("journal"),
        &["--workers", "0", "--metrics-addr", &dispatcher_metrics],
    );
    let worker_metrics = format!("127.0.0.1:{}", free_port());
    let _worker = start_worker_with(&d.address, &["--metrics-addr", &worker_metrics, "--pipeline", "e2e"]);
    // The consumer sleeps per step, so that its heartbeats report a step time while it runs.
    let mut c = start_consumer(&d.address, &["--step-ms", "150"]);
    c.collect(2, Duration::from_secs(60));
    let body = scrape(&dispatcher_metrics);
    assert_eq!(
        sample(&body, "granary_workers_ready{namespace=\"local\",pipeline=\"e2e\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "granary_dispatcher_consumers{namespace=\"local\",pipeline=\"e2e\",trainer_job=\"e2e\"}"
        ),
        Some(1.0),
        "{body}"
    );
    // Its client reads from a worker on this host (loopback), so the client keeps any finishing.
    assert_eq!(
        sample(
            &body,
            "granary_dispatcher_job_normalize_on_worker{namespace=\"local\",pipeline=\"e2e\",trainer_job=\"e2e\"}"
        ),
        Some(0.0),
        "{body}"
    );
    assert!(c.finish(Duration::from_secs(60)), "consumer did not finish");
    assert_exactly_once(&c.seen, &data.keys, 1);
    let body = scrape(&dispatcher_metrics);
    // The trainer's step times arrive as a histogram: about 150 ms a step.
    assert!(body.contains("# TYPE granary_trainer_step_seconds histogram"), "{body}");
    let job = [("namespace", "local"), ("pipeline", "e2e"), ("trainer_job", "e2e")];
    let steps = sample_with(&body, "granary_trainer_step_seconds_count", &job).unwrap_or_default();
    let under =
        sample_with(&body, "granary_trainer_step_seconds_bucket", &[job[0], job[1], job[2], ("le", "0.1")]);
    let within =
        sample_with(&body, "granary_trainer_step_seconds_bucket", &[job[0], job[1], job[2], ("le", "0.25")]);
    assert!(steps >= 1.0 && under == Some(0.0) && within == Some(steps), "{body}");
    let batches = sample_with(&body, "granary_trainer_batches_total", &job).unwrap_or_default();
    assert!(batches >= 5.0, "{body}");
    assert_eq!(
        sample_with(&body, "granary_dispatcher_worker_registrations_total", &job[..2]),
        Some(1.0),
        "{body}"
    );
    // Every split was leased and completed; the journal took every change.
    let splits = |event: &str| {
        sample(
            &body,
            &format!(
                "granary_dispatcher_splits_total{{event=\"{event}\",namespace=\"local\",pipeline=\"e2e\"}}"
            ),
        )
        .unwrap_or_default()
    };
    assert!(splits("completed") >= 1.0 && splits("leased") >= splits("completed"), "{body}");
    let journal = |result: &str| {
        sample(&body, &format!("granary_dispatcher_journal_writes_total{{result=\"{result}\"}}"))
            .unwrap_or_default()
    };
    assert!(journal("ok") >= 1.0 && journal("error") == 0.0, "{body}");
    // The worker refreshes its metrics with each heartbeat (every 500 ms).
    let mut worker = scrape(&worker_metrics);
    for _ in 0..50 {
        if sample_with(&worker, "granary_worker_elements_produced_total", &[]).unwrap_or_default() >= 40.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        worker = scrape(&worker_metrics);
    }
    let labels = [("namespace", "local"), ("pipeline", "e2e")];
    let produced =
        sample_with(&worker, "granary_worker_elements_produced_total", &labels).unwrap_or_default();
    assert!(produced >= 40.0, "produced {produced}:\n{worker}");
    assert!(
        sample_with(&worker, "granary_worker_sent_bytes_total", &labels).unwrap_or_default() > 0.0,
        "{worker}"
    );
    assert_eq!(sample_with(&worker, "granary_worker_cores", &labels), Some(1.0), "{worker}");
    assert!(
        sample_with(&worker, "granary_worker_compute_threads", &labels).is_some_and(|t| t >= 1.0),
        "{worker}"
    );
    // A files source: its reads in flight start at 16 and only grow while the store is slow.
    assert!(
        sample_with(&worker, "granary_worker_read_depth", &labels)
            .is_some_and(|d| (16.0..=256.0).contains(&d)),
        "{worker}"
    );
    assert!(
        sample_with(&worker, "granary_worker_split_seconds_count", &labels).unwrap_or_default() >= 1.0,
        "{worker}"
    );
    assert!(worker.contains("worker=\"worker-"), "the worker label is its id: {worker}");
    // The dispatcher lists the worker's endpoint for Prometheus' service discovery.
    let targets = get(&dispatcher_metrics, "/targets");
    assert!(targets.contains(&format!("\"{worker_metrics}\"")), "{targets}");
}
