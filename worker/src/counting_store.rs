//! A local store that counts what its reads hand out, for tests of how much a reader fetches.

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result as StoreResult,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A local store that counts the bytes its reads hand out, and the reads.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: LocalFileSystem,
    /// Bytes handed out by reads.
    pub bytes: Arc<AtomicU64>,
    /// Reads (`get_opts` calls: every get, ranged or whole).
    pub gets: AtomicU64,
}

impl std::fmt::Display for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

// `ObjectStore` is an `async_trait`: its methods are written out as that macro expands them.
impl ObjectStore for Counting {
    fn put_opts<'a, 'b, 't>(
        &'a self,
        location: &'b StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Boxed<'t, StoreResult<PutResult>>
    where
        'a: 't,
        'b: 't,
        Self: 't,
    {
        self.inner.put_opts(location, payload, opts)
    }

    fn put_multipart_opts<'a, 'b, 't>(
        &'a self,
        location: &'b StorePath,
        opts: PutMultipartOptions,
    ) -> Boxed<'t, StoreResult<Box<dyn MultipartUpload>>>
    where
        'a: 't,
        'b: 't,
        Self: 't,
    {
        self.inner.put_multipart_opts(location, opts)
    }

    fn get_opts<'a, 'b, 't>(
        &'a self,
        location: &'b StorePath,
        options: GetOptions,
    ) -> Boxed<'t, StoreResult<GetResult>>
    where
        'a: 't,
        'b: 't,
        Self: 't,
    {
        Box::pin(async move {
            self.gets.fetch_add(1, Ordering::Relaxed);
            let result = self.inner.get_opts(location, options).await?;
            let (meta, range, attributes, extensions) = (
                result.meta.clone(),
                result.range.clone(),
                result.attributes.clone(),
                result.extensions.clone(),
            );
            let bytes = self.bytes.clone();
            let stream = result
                .into_stream()
                .inspect(move |chunk| {
                    if let Ok(chunk) = chunk {
                        bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                })
                .boxed();
            Ok(GetResult { payload: GetResultPayload::Stream(stream), meta, range, attributes, extensions })
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, StoreResult<StorePath>>,
    ) -> BoxStream<'static, StoreResult<StorePath>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&StorePath>) -> BoxStream<'static, StoreResult<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_delimiter<'a, 'b, 'c, 't>(
        &'a self,
        prefix: Option<&'b StorePath>,
    ) -> Boxed<'t, StoreResult<ListResult>>
    where
        'a: 't,
        'b: 't,
        Self: 't,
    {
        self.inner.list_with_delimiter(prefix)
    }

    fn copy_opts<'a, 'b, 'c, 't>(
        &'a self,
        from: &'b StorePath,
        to: &'c StorePath,
        options: CopyOptions,
    ) -> Boxed<'t, StoreResult<()>>
    where
        'a: 't,
        'b: 't,
        'c: 't,
        Self: 't,
    {
        self.inner.copy_opts(from, to, options)
    }
}

/// A runtime for the store's I/O, and a store over `dir` that counts.
pub(crate) fn counting_store(dir: &std::path::Path) -> (tokio::runtime::Runtime, Arc<Counting>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let inner = LocalFileSystem::new_with_prefix(dir).unwrap();
    (rt, Arc::new(Counting { inner, bytes: Arc::default(), gets: AtomicU64::new(0) }))
}
