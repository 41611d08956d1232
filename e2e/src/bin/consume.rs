//! A trainer stand-in for the end-to-end tests: consumes a pipeline through `granary-client` and
//! prints one JSON line per batch (`{"epoch":E,"slot":S,"keys":[…],"wire":BYTES}`, `wire` being
//! the tensor bytes that crossed the wire for it), optionally stopping after N batches with its
//! checkpoint written to a file, or resuming from one.

use clap::Parser;
use granary_client::{Client, ClientOptions, Mode, Position};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    dispatcher: String,
    #[arg(long)]
    pipeline: String,
    #[arg(long)]
    job: Option<String>,
    #[arg(long)]
    index: Option<u32>,
    #[arg(long, default_value_t = 1)]
    consumers: u32,
    #[arg(long)]
    replicated: bool,
    /// Stop after this many batches, writing the checkpoint to --checkpoint.
    #[arg(long)]
    stop_after: Option<u64>,
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Resume from the checkpoint file.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Milliseconds of "training step" after each batch.
    #[arg(long, default_value_t = 0)]
    step_ms: u64,
    /// After `--slow-after` batches, take this many milliseconds per step instead.
    #[arg(long, requires = "slow_after")]
    slow_step_ms: Option<u64>,
    #[arg(long)]
    slow_after: Option<u64>,
    /// Also print each row's digest (`rows`): SHA-256 of its bytes in every tensor, in order.
    #[arg(long)]
    rows: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut options = ClientOptions::new(&args.pipeline);
    options.dispatcher = Some(args.dispatcher.clone());
    options.job = args.job.clone();
    options.consumer_index = args.index;
    options.num_consumers = args.consumers;
    if args.replicated {
        options.mode = Mode::Replicated;
    }
    if let Some(path) = &args.resume {
        options.resume = Some(Position::from_bytes(&std::fs::read(path)?)?);
    }
    let mut client = Client::open(options).await?;
    let mut out = std::io::stdout().lock();
    let mut n = 0u64;
    while let Some(batch) = client.next().await {
        let batch = batch?;
        let mut line = serde_json::json!({
            "epoch": batch.epoch,
            "slot": batch.slot,
            "keys": batch.keys,
            "wire": batch.wire_bytes,
        });
        if args.rows {
            line["rows"] = row_digests(&batch).into();
        }
        writeln!(out, "{line}")?;
        out.flush()?;
        let step = match (args.slow_step_ms, args.slow_after) {
            (Some(slow), Some(after)) if n >= after => slow,
            _ => args.step_ms,
        };
        if step > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(step)).await;
        }
        n += 1;
        if args.stop_after == Some(n) {
            if let Some(path) = &args.checkpoint {
                std::fs::write(path, client.checkpoint().to_bytes())?;
            }
            // Leave abruptly, as a crashed trainer would.
            std::process::exit(0);
        }
    }
    Ok(())
}

/// Per row, the SHA-256 (hex) of the row's bytes in each tensor, tensors in order.
fn row_digests(batch: &granary_client::Batch) -> Vec<String> {
    use sha2::Digest;
    let rows = batch.keys.len();
    (0..rows)
        .map(|i| {
            let mut hash = sha2::Sha256::new();
            for t in &batch.tensors {
                let row = t.data.len() / rows.max(1);
                hash.update(t.name.as_bytes());
                hash.update(&t.data[i * row..(i + 1) * row]);
            }
            hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}
