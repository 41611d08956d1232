//! The cost model: predicted seconds, newly stored bytes and dollars of each option, per element
//! and for the remaining epochs. Measurements that cannot be used are reported, never guessed.

use super::{Action, Boundary, CacheInputs, Candidate, Predicted, StoreRates};

const SECONDS_PER_HOUR: f64 = 3600.0;
/// Hours in an average month, as cloud storage prices count them.
const HOURS_PER_MONTH: f64 = 730.0;
const BYTES_PER_GB: f64 = 1e9;

/// Finite and above zero.
fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// Finite and not negative.
fn usable(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

/// `Ok` when `ok`, otherwise the measurement named `what` in words.
fn check(ok: bool, what: &str, x: f64) -> Result<(), String> {
    if ok { Ok(()) } else { Err(format!("no usable measurement: {what} is {x}")) }
}

/// A price: finite and positive, otherwise 0.
fn price(x: f64) -> f64 {
    if positive(x) { x } else { 0.0 }
}

/// The inputs as the model uses them.
pub(super) struct Model {
    /// Cores, at least 1.
    cores: f64,
    /// Parallel entry streams, at least 1 and at most the cores.
    readers: f64,
    /// CPU seconds per element of the whole pipeline, as measured.
    c: f64,
    /// Wall seconds per element computing with all cores, when the measurement is usable.
    t_c: Option<f64>,
    n: u64,
    /// Epochs still to run, the one being decided included.
    pub(super) epochs: u32,
    store: StoreRates,
    /// Dollars per hour of running time; 0: unpriced, time alone decides.
    per_hour: f64,
    /// Dollars per newly stored byte over the retention.
    per_byte: f64,
    /// Most bytes one entry may take.
    pub(super) max_bytes: Option<u64>,
}

/// One option as the model predicts it.
#[derive(Clone, Debug)]
pub(super) struct Estimate {
    pub(super) action: Action,
    /// Seconds for the remaining epochs.
    pub(super) seconds: f64,
    /// Bytes newly written.
    pub(super) bytes: f64,
    /// Time at the hourly price plus storage of the new bytes; 0 when unpriced.
    pub(super) dollars: f64,
    pub(super) predicted: Predicted,
    /// The whole entry at the cut: elements × bytes per element (0 for computing).
    pub(super) entry_bytes: f64,
}

impl Estimate {
    /// The estimate as a candidate, with `excluded` as given.
    pub(super) fn candidate(&self, excluded: Option<String>) -> Candidate {
        Candidate {
            action: self.action,
            seconds: self.seconds,
            bytes: self.bytes,
            dollars: self.dollars,
            excluded,
        }
    }
}

/// What the policy would do at `b`: read a complete entry, else write.
pub(super) fn action(b: &Boundary) -> Action {
    if b.existing_fraction >= 1.0 {
        Action::Read { boundary: b.index }
    } else {
        Action::Write { boundary: b.index }
    }
}

impl Model {
    /// The model of `inputs` with the store rates `store`; `priced` weighs dollars when
    /// `time_per_hour` is set; `max_bytes` limits entries written.
    pub(super) fn new(
        inputs: &CacheInputs,
        store: StoreRates,
        priced: bool,
        max_bytes: Option<u64>,
    ) -> Model {
        let cores = if inputs.cores.is_finite() { inputs.cores.max(1.0) } else { 1.0 };
        let readers = if inputs.readers.is_finite() { inputs.readers.clamp(1.0, cores) } else { 1.0 };
        let c = inputs.compute_s_per_element;
        let t_c = Some(c / cores).filter(|t| positive(c) && positive(*t) && positive(1.0 / *t));
        let costs = &inputs.costs;
        let per_hour = if priced { price(costs.time_per_hour) } else { 0.0 };
        let per_byte = if per_hour > 0.0 {
            price(costs.storage_per_gb_month) / BYTES_PER_GB * price(costs.retention_hours) / HOURS_PER_MONTH
        } else {
            0.0
        };
        Model {
            cores,
            readers,
            c,
            t_c,
            n: inputs.elements_per_epoch,
            epochs: inputs.remaining_epochs,
            store,
            per_hour,
            per_byte: if per_byte.is_finite() { per_byte } else { 0.0 },
            max_bytes,
        }
    }

    /// Whether dollars decide (a time price is set) rather than seconds.
    pub(super) fn priced(&self) -> bool {
        self.per_hour > 0.0
    }

    /// What decides between options: dollars when priced, else seconds.
    pub(super) fn key(&self, e: &Estimate) -> f64 {
        if self.priced() { e.dollars } else { e.seconds }
    }

    /// A key value in words.
    pub(super) fn key_text(&self, x: f64) -> String {
        if self.priced() { super::fmt::dollars(x) } else { super::fmt::duration(x) }
    }

    /// Whether `a` is better than `b`: cheaper, or as cheap and fewer bytes.
    pub(super) fn better(&self, a: &Estimate, b: &Estimate) -> bool {
        let (ka, kb) = (self.key(a), self.key(b));
        if (ka - kb).abs() <= 1e-9 * ka.abs().max(kb.abs()) { a.bytes < b.bytes } else { ka < kb }
    }

    /// Dollars of storing `bytes` for the retention.
    pub(super) fn storage_dollars(&self, bytes: f64) -> f64 {
        bytes * self.per_byte
    }

    /// Elements per second computing every stage, 0 when unmeasured.
    pub(super) fn compute_rate(&self) -> f64 {
        self.t_c.map_or(0.0, |t| 1.0 / t)
    }

    fn dollars(&self, seconds: f64, bytes: f64) -> f64 {
        if self.priced() {
            seconds / SECONDS_PER_HOUR * self.per_hour + self.storage_dollars(bytes)
        } else {
            0.0
        }
    }

    /// Computing every stage in every remaining epoch.
    pub(super) fn compute(&self) -> Result<Estimate, String> {
        if self.epochs == 0 {
            return Err("no epochs are left to run".to_string());
        }
        if self.n == 0 {
            return Err("the epoch has no elements".to_string());
        }
        let t_c = self
            .t_c
            .ok_or_else(|| format!("no usable measurement of compute time ({} s per element)", self.c))?;
        let seconds = f64::from(self.epochs) * self.n as f64 * t_c;
        self.finish(Estimate {
            action: Action::Compute,
            seconds,
            bytes: 0.0,
            dollars: 0.0,
            predicted: Predicted {
                compute_items_per_s: 1.0 / t_c,
                write_items_per_s: None,
                read_items_per_s: None,
            },
            entry_bytes: 0.0,
        })
        .map_err(|_| "the estimate of computing is out of range".to_string())
    }

    /// Caching at `b`: reading its complete entry, or writing it this epoch and reading after.
    pub(super) fn cut(&self, b: &Boundary) -> Result<Estimate, String> {
        let size = b.bytes_per_element;
        check(positive(size), "bytes_per_element", size)?;
        check(usable(b.decode_s_per_element), "decode_s_per_element", b.decode_s_per_element)?;
        check(usable(b.suffix_s_per_element), "suffix_s_per_element", b.suffix_s_per_element)?;
        check(b.existing_fraction.is_finite(), "existing_fraction", b.existing_fraction)?;
        let read = self.store.read_bytes_per_s;
        check(positive(read), "the store's read throughput", read)?;
        let f = b.existing_fraction.clamp(0.0, 1.0);
        let t_r = size / read + b.decode_s_per_element / self.readers + b.suffix_s_per_element / self.cores;
        if !positive(t_r) {
            return Err("the read time per element is out of range".to_string());
        }
        let n = self.n as f64;
        let entry = n * size;
        let read_rate = Some(1.0 / t_r);
        if f >= 1.0 {
            let seconds = f64::from(self.epochs) * n * t_r;
            let predicted = Predicted {
                compute_items_per_s: self.compute_rate(),
                write_items_per_s: None,
                read_items_per_s: read_rate,
            };
            let e = Estimate {
                action: action(b),
                seconds,
                bytes: 0.0,
                dollars: 0.0,
                predicted,
                entry_bytes: entry,
            };
            return self.finish(e);
        }
        check(positive(self.c), "compute_s_per_element", self.c)?;
        check(usable(b.encode_s_per_element), "encode_s_per_element", b.encode_s_per_element)?;
        let write = self.store.write_bytes_per_s;
        check(positive(write), "the store's write throughput", write)?;
        let t_w = self.c / self.cores + b.encode_s_per_element / self.readers + size / write;
        let t_first = f * t_r + (1.0 - f) * t_w;
        if !(positive(t_w) && positive(t_first)) {
            return Err("the write time per element is out of range".to_string());
        }
        let later = f64::from(self.epochs.saturating_sub(1));
        let seconds = n * t_first + later * n * t_r;
        let predicted = Predicted {
            compute_items_per_s: self.compute_rate(),
            write_items_per_s: Some(1.0 / t_first),
            read_items_per_s: read_rate,
        };
        let bytes = (1.0 - f) * entry;
        self.finish(Estimate {
            action: action(b),
            seconds,
            bytes,
            dollars: 0.0,
            predicted,
            entry_bytes: entry,
        })
    }

    /// `e` with its dollars, if every figure is finite.
    fn finish(&self, mut e: Estimate) -> Result<Estimate, String> {
        e.dollars = self.dollars(e.seconds, e.bytes);
        let p = &e.predicted;
        let rates = [Some(p.compute_items_per_s), p.write_items_per_s, p.read_items_per_s];
        let finite = [e.seconds, e.bytes, e.dollars, e.entry_bytes].iter().all(|x| x.is_finite())
            && rates.iter().flatten().all(|x| x.is_finite());
        if finite { Ok(e) } else { Err("the estimate is out of range".to_string()) }
    }
}
