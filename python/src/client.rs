//! The `Client` class: one consumer of a Granary job, driven from Python.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use granary_client::{Batch, BlockingClient, ClientError, ClientOptions, ImagePlacement, Mode, Position};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::buffer::TensorBuffer;
use crate::drain::{DrainReport, Drainer};
use crate::errors;

/// How often a blocked `next()` checks for Ctrl-C (and other signals Python handles).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// What a call on a closed client answers.
const CLOSED: &str = "the client is closed";

/// A consumer of a Granary job: registers with the dispatcher, streams batch parts from every
/// worker, and delivers each batch of each epoch exactly once, in the order batches complete.
///
/// The Python package wraps it; use `granary.Pipeline`.
#[pyclass(module = "granary._native", frozen)]
pub struct Client {
    /// `None` once closed.
    inner: Mutex<Option<BlockingClient>>,
    info: Info,
}

/// What does not change while a client is open.
struct Info {
    pipeline: String,
    job: String,
    mode: Mode,
    epochs: u32,
    consumer_index: u32,
    num_consumers: u32,
    batch_size: u32,
}

impl Client {
    /// The client, locked. Only ever taken with the GIL released (inside `Python::detach`): a
    /// thread that holds the lock may wait for the GIL (to check for signals), so a thread that
    /// holds the GIL must not wait for the lock.
    fn lock(&self) -> MutexGuard<'_, Option<BlockingClient>> {
        // A panic while the lock was held cannot leave the client half-updated in a way that
        // matters more than the panic itself, which already reached Python.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `f` of the open client, with the GIL released; an error once closed.
    fn with_client<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&BlockingClient) -> T + Send,
    ) -> PyResult<T> {
        py.detach(|| self.lock().as_ref().map(f)).ok_or_else(|| PyRuntimeError::new_err(CLOSED))
    }
}

/// The outcome of waiting for a batch, before it is turned into Python objects.
enum Next {
    Batch(Batch),
    End,
    Failed(ClientError),
    Closed,
}

#[pymethods]
impl Client {
    /// Joins job `job` (default: the pipeline's name) of `pipeline` at the dispatcher
    /// `dispatcher` (`host:port`; default `$GRANARY_DISPATCHER`), as consumer `consumer_index` of
    /// `num_consumers` (default: the lowest free index), or resumes the checkpoint `position`
    /// (bytes from `checkpoint()`). `mode` is `"distributed"` (each element reaches one consumer
    /// per epoch) or `"replicated"` (every consumer sees every element).
    ///
    /// `token` is the pipeline's trainer token, or `token_file` a file holding it (not both);
    /// default `$GRANARY_TOKEN_FILE`, else `$GRANARY_TOKEN`. `tls_ca` is the CA certificate (PEM)
    /// to dial TLS with; default `$GRANARY_TLS_CA`, else plaintext. The files are read now.
    ///
    /// `images` is where the images of the pipeline's fused image run are made: `"auto"` (a
    /// share on this host while it has idle cores), `"client"` or `"workers"`; default
    /// `$GRANARY_IMAGES`, else `"auto"`.
    ///
    /// `prefetch_bytes` is the memory the client may hold in complete batches ahead of the
    /// trainer: it holds 4, and twice as many each time the trainer empties a full buffer, as long
    /// as they fit (default 1 GiB; 0 keeps 4).
    #[new]
    #[pyo3(signature = (pipeline, dispatcher=None, *, job=None, consumer_index=None, num_consumers=1, mode="distributed", position=None, token=None, token_file=None, tls_ca=None, images=None, prefetch_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pipeline: String,
        dispatcher: Option<String>,
        job: Option<String>,
        consumer_index: Option<u32>,
        num_consumers: u32,
        mode: &str,
        position: Option<&[u8]>,
        token: Option<String>,
        token_file: Option<PathBuf>,
        tls_ca: Option<PathBuf>,
        images: Option<&str>,
        prefetch_bytes: Option<u64>,
    ) -> PyResult<Client> {
        let mode = match mode {
            "distributed" => Mode::Distributed,
            "replicated" => Mode::Replicated,
            other => {
                return Err(PyValueError::new_err(format!(
                    "mode: `{other}` is not a mode; use \"distributed\" or \"replicated\""
                )));
            }
        };
        let resume = match position {
            Some(bytes) => Some(Position::from_bytes(bytes).map_err(|error| errors::to_py(py, error))?),
            None => None,
        };
        let token =
            credential_token(token, token_file.as_deref()).map_err(|error| errors::to_py(py, error))?;
        let images =
            images.map(ImagePlacement::parse).transpose().map_err(|error| errors::to_py(py, error))?;
        let tls = tls_ca
            .map(|ca| ClientOptions::tls_from_ca(&ca))
            .transpose()
            .map_err(|error| errors::to_py(py, error))?;
        let options = ClientOptions {
            dispatcher,
            pipeline,
            job,
            mode,
            consumer_index,
            num_consumers,
            resume,
            token,
            tls,
            images,
            prefetch_bytes: prefetch_bytes.unwrap_or(granary_client::DEFAULT_PREFETCH_BYTES),
        };
        let client = py.detach(|| BlockingClient::open(options)).map_err(|error| errors::to_py(py, error))?;
        let inner = client.client();
        let info = Info {
            pipeline: inner.pipeline().to_owned(),
            job: inner.job().to_owned(),
            mode: inner.mode(),
            epochs: inner.epochs(),
            consumer_index: inner.consumer_index(),
            num_consumers: inner.num_consumers(),
            batch_size: inner.batch_size(),
        };
        Ok(Client { inner: Mutex::new(Some(client)), info })
    }

    /// The next batch, waiting for it with the GIL released; `None` after the last epoch. An
    /// error leaves the client usable: call again to go on.
    fn next(&self, py: Python<'_>) -> PyResult<Option<RawBatch>> {
        let next = py.detach(|| {
            let mut guard = self.lock();
            let Some(client) = guard.as_mut() else { return Ok(Next::Closed) };
            let item = client.next_or_interrupt(SIGNAL_CHECK, || Python::attach(|py| py.check_signals()))?;
            Ok::<_, PyErr>(match item {
                Some(Ok(batch)) => Next::Batch(batch),
                Some(Err(error)) => Next::Failed(error),
                None => Next::End,
            })
        })?;
        match next {
            Next::Batch(batch) => Ok(Some(RawBatch { batch })),
            Next::End => Ok(None),
            Next::Failed(error) => Err(errors::to_py(py, error)),
            Next::Closed => Err(PyRuntimeError::new_err(CLOSED)),
        }
    }

    /// Consumes up to `max_batches` batches (default: the rest of the job) in Rust, handing none
    /// to Python, and returns what arrived. With `digests`, also a SHA-256 per element of its
    /// tensors' bytes, by element key. For benchmarks and for checking what Python receives.
    #[pyo3(signature = (max_batches=None, *, digests=false))]
    fn drain(&self, py: Python<'_>, max_batches: Option<u64>, digests: bool) -> PyResult<DrainReport> {
        let drained = py.detach(|| {
            let mut guard = self.lock();
            let Some(client) = guard.as_mut() else { return Ok(Err(None)) };
            let mut drainer = Drainer::new(digests);
            while drainer.batches() < max_batches.unwrap_or(u64::MAX) {
                match client.next_or_interrupt(SIGNAL_CHECK, || Python::attach(|py| py.check_signals()))? {
                    Some(Ok(batch)) => drainer.add(&batch),
                    Some(Err(error)) => return Ok(Err(Some(error))),
                    None => break,
                }
            }
            Ok::<_, PyErr>(Ok(drainer.finish()))
        })?;
        match drained {
            Ok(report) => Ok(report),
            Err(Some(error)) => Err(errors::to_py(py, error)),
            Err(None) => Err(PyRuntimeError::new_err(CLOSED)),
        }
    }

    /// The position after the last batch returned, as bytes to store with a training checkpoint
    /// and pass back as `position` to resume.
    fn checkpoint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let position = self.with_client(py, BlockingClient::checkpoint)?;
        Ok(PyBytes::new(py, &position.to_bytes()))
    }

    /// Stops the background tasks and the client's runtime. Further calls fail.
    fn close(&self, py: Python<'_>) {
        py.detach(|| drop(self.lock().take()));
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.lock().is_none())
    }

    /// The pipeline's name.
    #[getter]
    fn pipeline(&self) -> &str {
        &self.info.pipeline
    }

    /// The job's name.
    #[getter]
    fn job(&self) -> &str {
        &self.info.job
    }

    /// `"distributed"` or `"replicated"`.
    #[getter]
    fn mode(&self) -> &'static str {
        match self.info.mode {
            Mode::Distributed => "distributed",
            Mode::Replicated => "replicated",
        }
    }

    /// Epochs the job runs.
    #[getter]
    fn epochs(&self) -> u32 {
        self.info.epochs
    }

    /// This consumer's index in the job.
    #[getter]
    fn consumer_index(&self) -> u32 {
        self.info.consumer_index
    }

    /// Consumers of the job.
    #[getter]
    fn num_consumers(&self) -> u32 {
        self.info.num_consumers
    }

    /// Rows in a full batch.
    #[getter]
    fn batch_size(&self) -> u32 {
        self.info.batch_size
    }

    /// The epoch being delivered.
    #[getter]
    fn epoch(&self, py: Python<'_>) -> PyResult<u32> {
        self.with_client(py, |client| client.client().epoch())
    }

    /// Whether every batch of the current epoch was returned: the next `next()` starts the
    /// following epoch (or ends the job).
    #[getter]
    fn epoch_finished(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_client(py, |client| client.client().epoch_finished())
    }

    /// Complete batches the client holds ahead of the trainer at most now (its tuned prefetch
    /// depth).
    #[getter]
    fn prefetch_batches(&self, py: Python<'_>) -> PyResult<u32> {
        self.with_client(py, |client| client.client().prefetch_batches())
    }

    /// Batch parts dropped as duplicates so far (replays, re-sent parts).
    #[getter]
    fn duplicates(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_client(py, |client| client.client().duplicates())
    }

    fn __repr__(&self) -> String {
        format!(
            "Client(pipeline={:?}, job={:?}, consumer {} of {}, {} epochs)",
            self.info.pipeline,
            self.info.job,
            self.info.consumer_index,
            self.info.num_consumers,
            self.info.epochs
        )
    }
}

/// The token option from the `token` and `token_file` arguments: at most one of them, a given
/// token not blank; `None` when neither is given (the client then reads the environment).
fn credential_token(
    token: Option<String>,
    token_file: Option<&std::path::Path>,
) -> Result<Option<String>, ClientError> {
    match (token, token_file) {
        (Some(_), Some(_)) => Err(ClientError::InvalidOptions(
            "token and token_file are both given; pass the token or the file holding it, not both".to_owned(),
        )),
        (Some(token), None) if token.trim().is_empty() => Err(ClientError::InvalidOptions(
            "token: the token is empty; pass the pipeline's trainer token, or leave token out to read \
             GRANARY_TOKEN_FILE or GRANARY_TOKEN"
                .to_owned(),
        )),
        (Some(token), None) => Ok(Some(token)),
        (None, Some(path)) => ClientOptions::token_from_file(path).map(Some),
        (None, None) => Ok(None),
    }
}

/// A batch as received: its place in the job, its element keys and its tensors' buffers.
#[pyclass(module = "granary._native", frozen)]
pub struct RawBatch {
    batch: Batch,
}

#[pymethods]
impl RawBatch {
    /// The epoch it belongs to.
    #[getter]
    fn epoch(&self) -> u32 {
        self.batch.epoch
    }

    /// Its slot in the consumer's epoch plan.
    #[getter]
    fn slot(&self) -> u64 {
        self.batch.slot
    }

    /// Rows in the batch.
    #[getter]
    fn rows(&self) -> usize {
        self.batch.len()
    }

    /// Tensor payload bytes this batch took on the wire.
    #[getter]
    fn wire_bytes(&self) -> u64 {
        self.batch.wire_bytes
    }

    /// The element keys, in row order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.batch.keys)
    }

    /// The tensors, in the order the pipeline made them, as `(name, dtype, shape, buffer)`
    /// tuples; `buffer` is a `TensorBuffer` over the received bytes.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let tensors = self
            .batch
            .tensors
            .iter()
            .map(|tensor| {
                let shape = PyTuple::new(py, &tensor.shape)?;
                let buffer = Bound::new(py, TensorBuffer::new(tensor.data.clone()))?;
                PyTuple::new(
                    py,
                    [
                        tensor.name.as_str().into_pyobject(py)?.into_any(),
                        tensor.dtype.as_str().into_pyobject(py)?.into_any(),
                        shape.into_any(),
                        buffer.into_any(),
                    ],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, tensors)
    }

    fn __repr__(&self) -> String {
        format!("RawBatch(epoch={}, slot={}, rows={})", self.batch.epoch, self.batch.slot, self.batch.len())
    }
}
