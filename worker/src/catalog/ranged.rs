//! A `Read + Seek` view of one object for counting its elements without holding it: bytes stream
//! from the store chunk by chunk; a seek forward of at most [`READ_THROUGH`] bytes reads through
//! (discarding), a longer one drops the stream and starts a ranged read at the target, so a tar
//! shard's large members are skipped without being fetched. Every wait on the store ends at the
//! counting's deadline.

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path as StorePath;
use object_store::{GetOptions, GetRange, ObjectStore};
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// The longest gap read through rather than skipped with a new ranged read: about what one
/// request's latency costs in transfer.
pub const READ_THROUGH: u64 = 1 << 20;

/// When counting must be done by.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// `budget` from now.
    pub fn after(budget: Duration) -> Deadline {
        Deadline { at: Instant::now() + budget }
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The time left, or a `TimedOut` error once none is.
    fn left(&self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the counting budget is spent"));
        }
        Ok(left)
    }
}

type Chunks = BoxStream<'static, object_store::Result<Bytes>>;

/// One object read for counting (see the module's documentation).
pub struct RangedReader<'a> {
    store: Arc<dyn ObjectStore>,
    location: &'a StorePath,
    size: u64,
    rt: &'a Handle,
    deadline: Deadline,
    /// Where the next read starts.
    pos: u64,
    /// The open ranged read, if any: `chunk` holds its bytes from `stream_pos` on.
    stream: Option<Chunks>,
    stream_pos: u64,
    chunk: Bytes,
    /// Bytes read since the last seek, and the most allowed (`None`: no limit).
    run: u64,
    max_run: Option<u64>,
}

impl<'a> RangedReader<'a> {
    /// A reader of the `size` bytes at `location`, positioned at 0.
    pub fn new(
        store: &Arc<dyn ObjectStore>,
        location: &'a StorePath,
        size: u64,
        rt: &'a Handle,
        deadline: Deadline,
    ) -> RangedReader<'a> {
        RangedReader {
            store: Arc::clone(store),
            location,
            size,
            rt,
            deadline,
            pos: 0,
            stream: None,
            stream_pos: 0,
            chunk: Bytes::new(),
            run: 0,
            max_run: None,
        }
    }

    /// Fails any read that would take more than `max` bytes between two seeks: what bounds the
    /// memory of a reader (tar's) that buffers whatever it reads without seeking.
    pub fn with_max_run(mut self, max: u64) -> RangedReader<'a> {
        self.max_run = Some(max);
        self
    }

    /// The next chunk of the open stream; `None` at its end.
    fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let left = self.deadline.left()?;
        let Some(stream) = self.stream.as_mut() else { return Ok(None) };
        // The timer is made inside the runtime, which drives it.
        match self.rt.block_on(async { tokio::time::timeout(left, stream.next()).await }) {
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the counting budget is spent")),
            Ok(None) => Ok(None),
            Ok(Some(chunk)) => chunk.map(Some).map_err(io::Error::other),
        }
    }

    /// Starts a ranged read at `pos`.
    fn open_at(&mut self, pos: u64) -> io::Result<()> {
        let left = self.deadline.left()?;
        let options = GetOptions { range: Some(GetRange::Bounded(pos..self.size)), ..GetOptions::default() };
        let get = self.store.get_opts(self.location, options);
        let result = match self.rt.block_on(async { tokio::time::timeout(left, get).await }) {
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "the counting budget is spent")),
            Ok(result) => result.map_err(io::Error::other)?,
        };
        self.stream = Some(result.into_stream());
        self.stream_pos = pos;
        self.chunk = Bytes::new();
        Ok(())
    }

    /// Brings the stream to `pos`: reads through a short gap, or starts a ranged read there.
    fn reach(&mut self, pos: u64) -> io::Result<()> {
        let near = self.stream.is_some() && self.stream_pos <= pos && pos - self.stream_pos <= READ_THROUGH;
        if !near {
            return self.open_at(pos);
        }
        while self.stream_pos < pos {
            if self.chunk.is_empty() {
                match self.next_chunk()? {
                    Some(chunk) => self.chunk = chunk,
                    None => return Err(io::ErrorKind::UnexpectedEof.into()),
                }
            }
            let skip = (pos - self.stream_pos).min(self.chunk.len() as u64) as usize;
            self.chunk = self.chunk.slice(skip..);
            self.stream_pos += skip as u64;
        }
        Ok(())
    }
}

impl Read for RangedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.pos >= self.size {
            return Ok(0);
        }
        if self.stream.is_none() || self.stream_pos != self.pos {
            self.reach(self.pos)?;
        }
        while self.chunk.is_empty() {
            match self.next_chunk()? {
                Some(chunk) => self.chunk = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        if let Some(max) = self.max_run
            && self.run + n as u64 > max
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {max} bytes read in a row where only headers were expected"),
            ));
        }
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk = self.chunk.slice(n..);
        self.pos += n as u64;
        self.stream_pos += n as u64;
        self.run += n as u64;
        Ok(n)
    }
}

impl Seek for RangedReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        let Some(target) = target else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "seek before the start of the object"));
        };
        self.pos = target;
        self.run = 0;
        Ok(target)
    }
}
