//! A synchronous client for trainers without an async runtime.

use std::time::Duration;

use crate::batch::Batch;
use crate::client::Client;
use crate::error::ClientError;
use crate::options::ClientOptions;
use crate::position::Position;

/// Most runtime threads the blocking client starts.
const MAX_THREADS: usize = 4;

/// A [`Client`] with its own tokio runtime, iterated like any iterator. Do not create or drop it
/// inside an async context.
pub struct BlockingClient {
    // Declared first so that it is dropped (its tasks aborted) before the runtime.
    client: Client,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for BlockingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingClient").field("client", &self.client).finish_non_exhaustive()
    }
}

impl BlockingClient {
    /// Starts a runtime and opens a client with `options` (see [`Client::open`]).
    pub fn open(options: ClientOptions) -> Result<BlockingClient, ClientError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("granary-client")
            .enable_all()
            .build()?;
        let client = runtime.block_on(Client::open(options))?;
        Ok(BlockingClient { client, runtime })
    }

    /// Joins `pipeline` as a new distributed consumer (see [`Client::connect`]).
    pub fn connect(dispatcher: Option<&str>, pipeline: &str) -> Result<BlockingClient, ClientError> {
        let mut options = ClientOptions::new(pipeline);
        options.dispatcher = dispatcher.map(str::to_owned);
        BlockingClient::open(options)
    }

    /// The position after the last batch returned (see [`Client::checkpoint`]).
    pub fn checkpoint(&self) -> Position {
        self.client.checkpoint()
    }

    /// Like [`Iterator::next`], but asks `interrupted` every `every` while it waits, and gives up
    /// waiting with its error. For callers that must stay responsive while blocked, such as a
    /// Python binding checking for Ctrl-C. Giving up never loses a batch: it drops an unfinished
    /// plan fetch (fetched again by the next call) or, after the last epoch, the final heartbeat.
    pub fn next_or_interrupt<E>(
        &mut self,
        every: Duration,
        mut interrupted: impl FnMut() -> Result<(), E>,
    ) -> Result<Option<Result<Batch, ClientError>>, E> {
        let client = &mut self.client;
        self.runtime.block_on(async move {
            let next = client.next();
            tokio::pin!(next);
            loop {
                tokio::select! {
                    item = &mut next => return Ok(item),
                    () = tokio::time::sleep(every) => interrupted()?,
                }
            }
        })
    }

    /// The underlying async client, for its accessors.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Epochs the job runs.
    pub fn epochs(&self) -> u32 {
        self.client.epochs()
    }

    /// This consumer's index in the job.
    pub fn consumer_index(&self) -> u32 {
        self.client.consumer_index()
    }

    /// Consumers of the job.
    pub fn num_consumers(&self) -> u32 {
        self.client.num_consumers()
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        self.client.job()
    }
}

impl Iterator for BlockingClient {
    type Item = Result<Batch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.runtime.block_on(self.client.next())
    }
}
