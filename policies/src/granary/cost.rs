//! Cost weighting: the worker count of least cost per delivered batch.
//!
//! With `n` workers of capacity `r` each and a demand of `d` batches per second, training runs at
//! `min(n·r, d)` batches per second and costs `C_t + n·c_w` per hour (`C_t` all trainers,
//! `c_w` one worker). The cost of a batch, `(C_t + n·c_w) / min(n·r, d)`, falls with `n` while
//! `n·r < d` (when `C_t > 0`) and rises after, so the cheapest count is `n₀ = ceil(d/r)` or
//! `n₀ − 1`: the last worker is dropped exactly when the trainer time it saves is worth less than
//! it costs.

/// Cost per batch with `n` workers; infinite when nothing is delivered.
pub fn cost_per_batch(n: u32, demand: f64, per_worker: f64, worker_price: f64, trainer_price: f64) -> f64 {
    let delivered = (f64::from(n) * per_worker).min(demand);
    if delivered <= 0.0 || !delivered.is_finite() {
        return f64::INFINITY;
    }
    (trainer_price + f64::from(n) * worker_price) / delivered
}

/// The count in `lo..=hi` of least cost per batch (ties go to the larger count). `trainer_price`
/// is the price of all trainers together.
pub fn cheapest_count(
    demand: f64,
    per_worker: f64,
    worker_price: f64,
    trainer_price: f64,
    lo: u32,
    hi: u32,
) -> u32 {
    let hi = hi.max(lo);
    if demand <= 0.0 || per_worker <= 0.0 {
        return lo;
    }
    let no_wait = crate::counts::count_at_least(demand / per_worker).clamp(lo, hi);
    let floor = lo.max(1).min(hi);
    let candidates = [no_wait, no_wait.saturating_sub(1).max(floor), floor];
    let mut best = no_wait;
    let mut best_cost = cost_per_batch(best, demand, per_worker, worker_price, trainer_price);
    for n in candidates {
        let c = cost_per_batch(n, demand, per_worker, worker_price, trainer_price);
        let cheaper = c < best_cost * (1.0 - 1e-9);
        let tie_larger = (c - best_cost).abs() <= best_cost * 1e-9 && n > best;
        if cheaper || tie_larger {
            best = n;
            best_cost = c;
        }
    }
    best
}

/// Trainer time saved by one more worker beyond `n`, as a fraction of the trainers' time.
pub fn waiting_removed_by_one_more(n: u32, demand: f64, per_worker: f64) -> f64 {
    if demand <= 0.0 {
        return 0.0;
    }
    let now = (f64::from(n) * per_worker).min(demand);
    let more = (f64::from(n.saturating_add(1)) * per_worker).min(demand);
    ((more - now) / demand).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expensive_workers_drop_the_last_partial_one() {
        // d/r = 4.15: the fifth worker is 15% used.
        let (d, r) = (14.4, 14.4 / 4.15);
        assert_eq!(cheapest_count(d, r, 1.0, 2.0, 1, 10), 4);
        // Expensive trainers: keep the fifth.
        assert_eq!(cheapest_count(d, r, 1.0, 100.0, 1, 10), 5);
        // Free trainers: every partially used count costs the same per batch; ties go to the
        // larger count, so the trainer waits least among the cheapest.
        assert_eq!(cheapest_count(d, r, 1.0, 0.0, 1, 10), 4);
    }

    #[test]
    fn bounds_hold() {
        assert_eq!(cheapest_count(100.0, 1.0, 1.0, 100.0, 2, 6), 6);
        assert_eq!(cheapest_count(0.0, 1.0, 1.0, 100.0, 2, 6), 2);
        assert_eq!(cheapest_count(1.0, 10.0, 1.0, 100.0, 0, 6), 1);
    }
}
