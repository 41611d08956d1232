//! The progress line of `granary run` and `granary demo`.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

/// A spinner with the batch count, hidden when `quiet`.
pub fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {pos} batches · {elapsed} · {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
