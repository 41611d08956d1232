//! One evaluation of the Granary policy once its estimates are ready: the model's count, the
//! evidence from trainer waiting, worker buffers and idle worker cores, and the reason in words.

use super::GranaryPolicy;
use super::cost;
use super::policy::Model;
use crate::counts::count_at_least;
use crate::decision::Decision;
use crate::estimate::{self, RateSource};
use crate::inputs::{Observation, PoolConfig};
use crate::wording::{make, rate, workers};

impl GranaryPolicy {
    pub(super) fn decide(&mut self, obs: &Observation, m: &Model) -> Decision {
        let cfg = &obs.config;
        let desired = obs.desired_workers;
        let consumers = obs.consumer_count();
        let needed = |d: f64| self.needed(cfg, consumers, d, m.per_worker);
        let (low, mid, high) =
            (needed(m.demand * (1.0 - m.band)), needed(m.demand), needed(m.demand * (1.0 + m.band)));
        let supply = f64::from(desired) * m.per_worker;
        let waits = estimate::wait_fraction(obs)
            .map_or(String::new(), |w| format!("trainers wait {:.0}% of each step; ", w * 100.0));
        let how = match self.source {
            Some(RateSource::Measured) => " (measured)",
            Some(RateSource::Stages) => " (from stage times)",
            Some(RateSource::CpuScaled) => " (from CPU use)",
            None => "",
        };
        let hosts = if m.hosts.is_empty() { String::new() } else { format!(" ({})", m.hosts) };
        let model_text = format!(
            "{waits}{} {} {} batches/s{how}{hosts}, demand is {}/s",
            workers(desired),
            make(desired),
            rate(supply),
            rate(m.demand)
        );
        let cost_text = self.cost_text(cfg, consumers, mid, m);
        let settled = self.settled(obs.now_s);
        let w = self.wait.mean().unwrap_or(0.0);
        // Workers that report no buffer capacity leave only the trainers' waiting as evidence.
        let fill = self.fill.mean().unwrap_or(1.0);
        // Evidence that supply is ample: settled, trainers never wait, and buffers stay full or
        // the workers' cores are idle enough that fewer workers would carry the load.
        let idle_enough = |down: u32| {
            let recent = self.busy.recent_max(self.config.feedback_samples.max(1));
            recent.is_some_and(|b| b <= f64::from(down) / f64::from(desired.max(1)))
        };
        let ample = |down: u32| {
            settled && w < self.config.idle_wait && (fill >= self.config.full_buffer || idle_enough(down))
        };
        // Evidence that supply keeps up: settled, trainers never wait, buffers are not draining.
        let draining = self.fill.ends().is_some_and(|(first, last)| last < first);
        let keeping_up = settled && w < self.config.idle_wait && !draining;
        let expected = 1.0 - (supply / m.demand.max(f64::MIN_POSITIVE)).min(1.0);
        let persistent = self.wait.recent_min(self.config.feedback_samples.max(1)).unwrap_or(0.0);
        // Without prices any waiting is too much; with prices, only more than planned.
        let tolerated = if cfg.prices().is_some() { expected } else { 0.0 };
        let still_waiting = settled && persistent > tolerated + self.config.wait_threshold;
        if low > desired || (mid > desired && still_waiting) {
            if keeping_up {
                let reason = format!(
                    "{model_text}: the model asks for {}, but trainers never wait and buffers are {:.0}% full; holding",
                    workers(mid),
                    fill * 100.0
                );
                return Decision::hold(desired, reason);
            }
            return self.finish(obs, mid, format!("{model_text} → {}{cost_text}", workers(mid)));
        }
        if settled {
            if persistent > expected + self.config.wait_threshold && desired < cfg.upper() {
                return self.feedback_up(obs, m, w, expected);
            }
            let enough = self.config.down_samples.max(1);
            // Down only as far as the high end of the band: scaling down is never urgent.
            let down = high.max(cfg.clamp(self.floor));
            if down < desired {
                if ample(down) && self.demand.len() >= enough && self.rate.len() >= enough {
                    let evidence = match self.busy.recent_max(self.config.feedback_samples.max(1)) {
                        Some(b) if fill < self.config.full_buffer => {
                            format!("workers are busy {:.0}% of the time", b * 100.0)
                        }
                        _ => format!("worker buffers are {:.0}% full", fill * 100.0),
                    };
                    let reason = format!(
                        "trainers never wait and {evidence}; {} {} {} batches/s, demand is {}/s → {}{cost_text}",
                        workers(desired),
                        make(desired),
                        rate(supply),
                        rate(m.demand),
                        workers(down)
                    );
                    return self.finish(obs, down, reason);
                }
                let reason = format!(
                    "{model_text}: {} would do, but trainers wait {:.1}% and buffers are {:.0}% full; holding",
                    workers(down),
                    w * 100.0,
                    fill * 100.0
                );
                return Decision::hold(desired, reason);
            }
        }
        let unbounded = self.needed_unbounded(cfg, consumers, m.demand, m.per_worker);
        if unbounded > desired && desired >= cfg.upper() {
            let reason =
                format!("{model_text}: {} needed, max_workers is {}", workers(unbounded), cfg.upper());
            return Decision::hold(desired, reason);
        }
        Decision::hold(desired, format!("{model_text}; holding {}", workers(desired)))
    }

    /// Trainers wait more than the model expects: add workers in proportion to the waiting (at
    /// least one), or with prices one more if the trainer time it saves is worth its price, and
    /// keep that count as a floor until demand or supply shifts.
    fn feedback_up(&mut self, obs: &Observation, m: &Model, w: f64, expected: f64) -> Decision {
        let cfg = &obs.config;
        let desired = obs.desired_workers;
        let delivered = m.demand * (1.0 - w.min(1.0));
        let text = format!(
            "trainers still wait {:.0}% of each step at {} (model expected {:.0}%); they get {} of {} batches/s",
            w * 100.0,
            workers(desired),
            expected * 100.0,
            rate(delivered),
            rate(m.demand)
        );
        let target = match cfg.prices() {
            Some((worker, trainer)) => {
                let removed = w.min(m.per_worker / m.demand.max(f64::MIN_POSITIVE));
                let worth = removed * trainer * obs.consumer_count() as f64;
                if worth < worker {
                    let reason = format!(
                        "{text}; one more worker (${worker:.2}/h) would save trainer time worth ${worth:.2}/h; holding {}",
                        workers(desired)
                    );
                    return Decision::hold(desired, reason);
                }
                desired.saturating_add(1)
            }
            None => {
                let scaled = f64::from(desired) * (1.0 - expected) / (1.0 - w.min(0.95));
                count_at_least(scaled).max(desired.saturating_add(1))
            }
        };
        let target = cfg.clamp(target);
        self.floor = target;
        self.finish(obs, target, format!("{text} → {}", workers(target)))
    }

    fn cost_text(&self, cfg: &PoolConfig, consumers: usize, n: u32, m: &Model) -> String {
        let Some((worker, trainer)) = cfg.prices() else { return String::new() };
        let r = m.per_worker / self.config.headroom.max(1.0);
        let removed = cost::waiting_removed_by_one_more(n, m.demand, r);
        if removed <= 0.0 || n >= cfg.upper() {
            return String::new();
        }
        let worth = removed * trainer * consumers as f64;
        format!(
            " (one more worker, ${worker:.2}/h, would remove {:.1}% of trainer time, worth ${worth:.2}/h)",
            removed * 100.0
        )
    }
}
