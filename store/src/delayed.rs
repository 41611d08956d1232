//! A store that answers every read late, as a distant object store does: tests and benchmarks on
//! a local disk use it to measure what hides a store's latency (reads in flight). Unlike
//! `object_store`'s `ThrottledStore`, it serves the local file system's streamed reads too.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

use crate::cache::Throttle;

/// `inner`, with every `get` and `get_ranges` answered after the throttle's `per_call_ms`, plus
/// `get_per_byte_ns` for each byte asked for. Writes, lists and deletes go straight through.
#[derive(Debug)]
pub struct Delayed {
    inner: Arc<dyn ObjectStore>,
    throttle: Throttle,
}

impl Delayed {
    /// `inner`, delayed as `throttle` says.
    pub fn new(inner: Arc<dyn ObjectStore>, throttle: Throttle) -> Delayed {
        Delayed { inner, throttle }
    }

    async fn wait(&self, bytes: u64) {
        let delay = Duration::from_millis(self.throttle.per_call_ms)
            + Duration::from_nanos(self.throttle.get_per_byte_ns.saturating_mul(bytes));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

impl fmt::Display for Delayed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Delayed({}, {:?})", self.inner, self.throttle)
    }
}

#[async_trait]
impl ObjectStore for Delayed {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let result = self.inner.get_opts(location, options).await?;
        self.wait(result.range.end - result.range.start).await;
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let result = self.inner.get_ranges(location, ranges).await?;
        self.wait(ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum()).await;
        Ok(result)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::local::LocalFileSystem;
    use std::time::Instant;

    #[tokio::test]
    async fn reads_from_the_local_disk_come_late_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let location = Path::from("a/b.bin");
        local.put(&location, Bytes::from_static(b"twelve bytes").into()).await.unwrap();
        let throttle = Throttle { per_call_ms: 30, ..Throttle::default() };
        let store = Delayed::new(local, throttle);
        let started = Instant::now();
        let bytes = store.get(&location).await.unwrap().bytes().await.unwrap();
        assert_eq!(&bytes[..], b"twelve bytes");
        // A lower bound only: a sleep never ends early.
        assert!(started.elapsed() >= Duration::from_millis(30));
        let ranges = store.get_ranges(&location, &[0..3, 7..12]).await.unwrap();
        assert_eq!(ranges, vec![Bytes::from_static(b"twe"), Bytes::from_static(b"bytes")]);
        let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(None)).await.unwrap();
        assert_eq!(listed.len(), 1);
    }
}
