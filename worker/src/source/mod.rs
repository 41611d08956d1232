//! Sources: listing a dataset in object storage into splits, and streaming each split's records
//! as elements. A split is the unit of work that is shuffled, assigned and replayed: a group of
//! files, a WebDataset shard, a JSONL, TFRecord or CSV file, or a Parquet row group.
//!
//! A [`Projection`] set on the source ([`Source::set_projection`]) names the top-level fields the
//! pipeline uses: the Parquet, JSONL and CSV readers then read or build only those fields
//! (projection pushdown). The other formats ignore it.

mod columns;
pub mod csv;
pub mod files;
pub mod jsonl;
pub mod parquet;
pub mod read_ahead;
pub mod tfrecord;
pub mod values;
pub mod webdataset;

use crate::element::Element;
use crate::store::{self, Located};
use futures::TryStreamExt;
use granary_crds::{InputPipelineSpec, SourceFormat, SourceSpec};
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use read_ahead::ReadAhead;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::runtime::Handle;

/// A failure listing or reading the source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The store could not be opened.
    #[error("spec.source.url: {0}")]
    Store(#[from] store::StoreError),
    /// A store operation failed. The message says the store's error and each of its causes once
    /// (the transport's "connection refused" is a cause, not part of the store's own text).
    #[error("{what} `{location}`: {}", granary_proto::error_text(source))]
    Io {
        /// What was being done.
        what: &'static str,
        /// Object path.
        location: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The data is not what the format says.
    #[error("{location}: {message}")]
    Data {
        /// Object path (and line, member or row).
        location: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// Nothing to read.
    #[error("spec.source.url: no {format} objects under `{url}`; check the URL and spec.source.format")]
    Empty {
        /// The source URL.
        url: String,
        /// The format looked for.
        format: &'static str,
    },
}

impl SourceError {
    /// The error with the field path of the input it concerns (`spec.sources[1]`) in front.
    fn at_input(self, path: &str) -> SourceError {
        match self {
            SourceError::Empty { url, format } => SourceError::data(
                format!("{path}.url"),
                format!("no {format} objects under `{url}`; check the URL and {path}.format"),
            ),
            SourceError::Store(e) => SourceError::data(format!("{path}.url"), e.to_string()),
            SourceError::Io { what, location, source } => {
                SourceError::Io { what, location: format!("{path}: {location}"), source }
            }
            SourceError::Data { location, message } => {
                SourceError::Data { location: format!("{path}: {location}"), message }
            }
        }
    }

    pub(crate) fn data(location: impl Into<String>, message: impl Into<String>) -> SourceError {
        SourceError::Data { location: location.into(), message: message.into() }
    }

    pub(crate) fn io(what: &'static str, location: &StorePath, source: object_store::Error) -> SourceError {
        SourceError::Io { what, location: location.to_string(), source }
    }
}

/// One object of a split.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    /// Path inside the store.
    pub location: StorePath,
    /// Size in bytes.
    pub size: u64,
}

/// What a split reads.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitKind {
    /// A group of files, one sample each, with optional labels.
    Files(Vec<(Object, Option<i64>)>),
    /// One WebDataset tar shard.
    Shard(Object),
    /// One JSON Lines file.
    Jsonl(Object),
    /// One row group of a Parquet file.
    RowGroup {
        /// The file.
        object: Object,
        /// Row group index in the file.
        row_group: usize,
        /// Row number (within the file) of the group's first row.
        first_row: u64,
        /// Rows in the group.
        rows: u64,
    },
    /// One TFRecord file.
    Tfrecord {
        /// The file.
        object: Object,
        /// Whether it is GZIP-compressed.
        gzip: bool,
    },
    /// One CSV file.
    Csv {
        /// The file.
        object: Object,
        /// The byte between cells.
        delimiter: u8,
    },
}

/// A unit of work: shuffled, assigned and replayed as a whole.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Index in the pipeline's listing (across all its inputs, in order); seeds its randomness.
    pub id: u64,
    /// What it reads.
    pub kind: SplitKind,
    /// The input it belongs to: 0 for a single `spec.source`, else its index in `spec.sources`.
    pub input: usize,
}

impl Split {
    /// Bytes the split reads from the store (an estimate for row groups).
    pub fn bytes(&self) -> u64 {
        match &self.kind {
            SplitKind::Files(files) => files.iter().map(|(o, _)| o.size).sum(),
            SplitKind::Shard(o) | SplitKind::Jsonl(o) => o.size,
            SplitKind::Tfrecord { object, .. } | SplitKind::Csv { object, .. } => object.size,
            SplitKind::RowGroup { object, .. } => object.size,
        }
    }
}

/// The top-level element fields a pipeline uses from its source: with one set, the Parquet,
/// JSONL and CSV readers give each element only the fields it names that the data has, and skip
/// reading or building the others. A name the data lacks is no error here (the stage that needs
/// the field reports it missing). Splits, element counts, order and keys are the same as without.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Projection {
    fields: BTreeSet<String>,
}

impl Projection {
    /// The projection onto `fields` (duplicates are ignored; none gives elements with no fields).
    pub fn new<I, S>(fields: I) -> Projection
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Projection { fields: fields.into_iter().map(Into::into).collect() }
    }

    /// Whether field `name` is kept.
    pub fn contains(&self, name: &str) -> bool {
        self.fields.contains(name)
    }

    /// The kept field names, sorted.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(String::as_str)
    }

    /// How many names it keeps.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether it keeps no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
}

impl<S: Into<String>> FromIterator<S> for Projection {
    fn from_iter<I: IntoIterator<Item = S>>(fields: I) -> Projection {
        Projection::new(fields)
    }
}

/// A listed dataset: the pipeline's single source, or all of its mixed sources with their splits
/// numbered across them in order.
pub struct Source {
    inputs: Vec<Listed>,
    splits: Vec<Split>,
    /// The fields readers give elements; `None` for all of them.
    projection: Option<Arc<Projection>>,
    /// Reads in flight for `format: files` splits, tuned as they go.
    read_ahead: Arc<ReadAhead>,
    /// The decoded footers of its Parquet files, from the listing on.
    footers: parquet::Footers,
}

/// One listed input.
struct Listed {
    located: Located,
    format: SourceFormat,
    identity: String,
    splits: std::ops::Range<usize>,
}

/// One input's listing as [`Source::listings`] describes it.
#[derive(Clone, Debug)]
pub struct InputListing<'a> {
    /// The URL it was opened from.
    pub url: &'a url::Url,
    /// SHA-256 (hex) of its listed objects' paths, sizes, ETags and versions.
    pub identity: &'a str,
    /// Its split ids in the combined listing.
    pub splits: std::ops::Range<usize>,
}

/// Whether the reader should go on after an element was handed over.
pub type Emit<'a> = dyn FnMut(Element) -> bool + 'a;

impl Source {
    /// Lists the dataset at `spec.url` into splits; `batch_size` sizes the default split of
    /// `format: files` (see [`SourceSpec::files_per_split`]).
    pub async fn open(spec: &SourceSpec, batch_size: usize) -> Result<Source, SourceError> {
        let footers = parquet::Footers::new(crate::memory::footers_for(crate::memory::memory_limit()));
        let (listed, splits) = Self::list_input(spec, batch_size, 0, &footers).await?;
        let inputs = vec![Listed { splits: 0..splits.len(), ..listed }];
        Ok(Source { inputs, splits, projection: None, read_ahead: Arc::new(ReadAhead::new(true)), footers })
    }

    /// Lists every input of `spec` (its `source`, or each of its `sources` in order), numbering
    /// the splits across them. A failure names the input's field path. The reads in flight for
    /// `format: files` are tuned unless `spec.optimize` is false ([`read_ahead`]).
    pub async fn open_all(spec: &InputPipelineSpec, batch_size: usize) -> Result<Source, SourceError> {
        let mut inputs = Vec::new();
        let mut splits: Vec<Split> = Vec::new();
        let footers = parquet::Footers::new(crate::memory::footers_for(crate::memory::memory_limit()));
        for (index, input) in spec.inputs().into_iter().enumerate() {
            let listing = Self::list_input(input.source, batch_size, index, &footers).await;
            let (listed, listed_splits) = listing.map_err(|e| {
                if index == 0 && !spec.is_mixed() { e } else { e.at_input(&input.path.to_string()) }
            })?;
            let first = splits.len();
            splits.extend(listed_splits.into_iter().map(|mut split| {
                split.id += first as u64;
                split.input = index;
                split
            }));
            inputs.push(Listed { splits: first..splits.len(), ..listed });
        }
        let read_ahead = Arc::new(ReadAhead::new(spec.optimize));
        Ok(Source { inputs, splits, projection: None, read_ahead, footers })
    }

    /// Lists `spec`, the source's input number `input`, keeping its Parquet footers in `footers`.
    async fn list_input(
        spec: &SourceSpec,
        batch_size: usize,
        input: usize,
        footers: &parquet::Footers,
    ) -> Result<(Listed, Vec<Split>), SourceError> {
        let located = throttled(store::open(&spec.url)?)?;
        let objects = list(&located).await?;
        let identity = identity(&objects);
        let splits = match spec.format {
            SourceFormat::Files => files::splits(&located, spec, objects, batch_size).await?,
            SourceFormat::Webdataset => one_per_object(
                &located,
                objects,
                "webdataset",
                |n| n.ends_with(".tar"),
                |o, _| SplitKind::Shard(o),
            )?,
            SourceFormat::Jsonl => one_per_object(
                &located,
                objects,
                "jsonl",
                |n| n.ends_with(".jsonl") || n.ends_with(".ndjson"),
                |o, _| SplitKind::Jsonl(o),
            )?,
            SourceFormat::Parquet => parquet::splits(&located, objects, input, footers).await?,
            SourceFormat::Tfrecord => tfrecord::splits(&located, spec, objects)?,
            SourceFormat::Csv => self::csv::splits(&located, spec, objects)?,
        };
        Ok((Listed { located, format: spec.format, identity, splits: 0..0 }, splits))
    }

    /// Sets the fields that [`Source::read_split`] gives elements, for every input and split:
    /// `Some` reads only the projected fields where the format allows (Parquet: only their
    /// column chunks are fetched and decoded; JSONL: other keys are parsed but not built; CSV:
    /// other cells are not converted), `None` (the default) reads every field. Files, WebDataset
    /// and TFRecord sources ignore it and give every field. Call it after opening, before
    /// sharing the source (e.g. before wrapping it in an `Arc` for the readers' threads).
    pub fn set_projection(&mut self, fields: Option<Projection>) {
        self.projection = fields.map(Arc::new);
    }

    /// The source with [`Source::set_projection`] applied.
    pub fn with_projection(mut self, fields: Option<Projection>) -> Source {
        self.set_projection(fields);
        self
    }

    /// The projection set with [`Source::set_projection`]; `None` when every field is read.
    pub fn projection(&self) -> Option<&Projection> {
        self.projection.as_deref()
    }

    fn first(&self) -> &Listed {
        // `open` and `open_all` list at least one input (validation requires one).
        &self.inputs[0]
    }

    /// SHA-256 (hex) of every listed object's path, size, ETag and version: a changed, added or
    /// removed object changes it, and with it every cache fingerprint. Of the first input.
    pub fn identity(&self) -> &str {
        &self.first().identity
    }

    /// The URL the source was opened from (the first input's).
    pub fn url(&self) -> &url::Url {
        &self.first().located.url
    }

    /// The splits, in listing order (across the inputs, in order).
    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    /// The reads in flight of a source with a `format: files` input, tuned as they go
    /// ([`read_ahead`]); `None` without one (the other formats read a whole object per split).
    pub fn read_ahead(&self) -> Option<Arc<ReadAhead>> {
        let files = self.inputs.iter().any(|input| input.format == SourceFormat::Files);
        files.then(|| Arc::clone(&self.read_ahead))
    }

    /// Split ids of each input, in the order of `spec.sources` (one range for a single source).
    pub fn input_splits(&self) -> Vec<std::ops::Range<usize>> {
        self.inputs.iter().map(|i| i.splits.clone()).collect()
    }

    /// What each input's listing is, in the order of `spec.sources` (one for a single source):
    /// what the cache fingerprints of its entries are made of.
    pub fn listings(&self) -> Vec<InputListing<'_>> {
        self.inputs
            .iter()
            .map(|i| InputListing { url: &i.located.url, identity: &i.identity, splits: i.splits.clone() })
            .collect()
    }

    /// The store `split` reads (its input's); `None` for a split of another source.
    pub fn store_of(&self, split: &Split) -> Option<&Arc<dyn ObjectStore>> {
        self.inputs.get(split.input).map(|i| &i.located.store)
    }

    /// The layout of the data (the first input's).
    pub fn format(&self) -> SourceFormat {
        self.first().format
    }

    /// The store the source reads (the first input's).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.first().located.store
    }

    /// Streams `split`'s elements into `emit`, in order, until it returns false. Runs on a plain
    /// thread; store I/O goes through `rt`. Elements hold the fields of the source's
    /// [`Projection`], if one is set (see [`Source::set_projection`]).
    pub fn read_split(&self, split: &Split, rt: &Handle, emit: &mut Emit<'_>) -> Result<(), SourceError> {
        let Some(input) = self.inputs.get(split.input) else {
            return Err(SourceError::data(format!("split {}", split.id), "names no listed input"));
        };
        let (store, root) = (&input.located.store, &input.located.path);
        let projection = self.projection.as_deref();
        match &split.kind {
            SplitKind::Files(samples) => files::read(store, root, samples, &self.read_ahead, rt, emit),
            SplitKind::Shard(object) => webdataset::read(store, root, object, rt, emit),
            SplitKind::Jsonl(object) => jsonl::read(store, root, object, projection, rt, emit),
            SplitKind::RowGroup { object, row_group, first_row, .. } => {
                let group =
                    parquet::Group { input: split.input, object, index: *row_group, first_row: *first_row };
                parquet::read(store, root, group, &self.footers, projection, rt, emit)
            }
            SplitKind::Tfrecord { object, gzip } => tfrecord::read(store, root, object, *gzip, rt, emit),
            SplitKind::Csv { object, delimiter } => {
                self::csv::read(store, root, object, *delimiter, projection, rt, emit)
            }
        }
    }
}

/// The digest [`Source::identity`] returns, over the sorted listing; each field is
/// length-prefixed, so no two listings hash alike by shifting bytes between fields.
fn identity(objects: &[ObjectMeta]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for o in objects {
        field(o.location.as_ref().as_bytes());
        field(&o.size.to_le_bytes());
        field(o.e_tag.as_deref().unwrap_or("").as_bytes());
        field(o.version.as_deref().unwrap_or("").as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The variable that slows the source's store down in tests and benchmarks, in the cache
/// throttle's format (`per_call_ms=N,get_per_byte_ns=N`): a local disk then answers like a
/// distant object store, whose per-request latency the reads in flight must hide.
pub const THROTTLE_ENV: &str = "GRANARY_TEST_SOURCE_THROTTLE";

/// `located`, slowed down as [`THROTTLE_ENV`] asks when it is set.
fn throttled(located: Located) -> Result<Located, SourceError> {
    let throttle = granary_store::cache::Throttle::from_var(THROTTLE_ENV).map_err(|e| {
        let message = e.to_string();
        let message = message.strip_prefix(&format!("{THROTTLE_ENV}: ")).unwrap_or(&message).to_string();
        SourceError::data(THROTTLE_ENV.to_string(), message)
    })?;
    let Some(throttle) = throttle else { return Ok(located) };
    let store = granary_store::delayed::Delayed::new(located.store, throttle);
    Ok(Located { store: Arc::new(store), ..located })
}

/// Lists every object under the URL's prefix, sorted; a URL naming one object yields it alone.
async fn list(located: &Located) -> Result<Vec<ObjectMeta>, SourceError> {
    let prefix = (!located.path.as_ref().is_empty()).then_some(&located.path);
    let mut objects: Vec<ObjectMeta> = located
        .store
        .list(prefix)
        .try_collect()
        .await
        .map_err(|e| SourceError::io("listing", &located.path, e))?;
    if objects.is_empty()
        && !located.url.path().ends_with('/')
        && let Ok(meta) = located.store.head(&located.path).await
    {
        objects.push(meta);
    }
    objects.retain(|o| o.location.filename().is_some_and(|name| !name.starts_with('.')));
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(objects)
}

/// One split per listed object whose file name `accept`s, numbered in listing order; `kind` makes
/// each split from its object and file name. No such object is an error naming `format`.
pub(super) fn one_per_object(
    located: &Located,
    objects: Vec<ObjectMeta>,
    format: &'static str,
    accept: impl Fn(&str) -> bool,
    kind: impl Fn(Object, &str) -> SplitKind,
) -> Result<Vec<Split>, SourceError> {
    let splits: Vec<Split> = objects
        .into_iter()
        .filter(|o| o.location.filename().is_some_and(&accept))
        .enumerate()
        .map(|(i, o)| {
            let name = o.location.filename().unwrap_or_default().to_string();
            Split { id: i as u64, kind: kind(Object { location: o.location, size: o.size }, &name), input: 0 }
        })
        .collect();
    if splits.is_empty() {
        return Err(SourceError::Empty { url: located.url.to_string(), format });
    }
    Ok(splits)
}

/// The key of an object: its path relative to the source's prefix (the file name when the
/// source names a single object).
pub(crate) fn relative_key(root: &StorePath, location: &StorePath) -> String {
    match location.prefix_match(root) {
        Some(parts) => {
            let rel: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
            if rel.is_empty() { location.filename().unwrap_or_default().to_string() } else { rel.join("/") }
        }
        None => location.to_string(),
    }
}

/// The key of record `n` of the file whose key is `file`: `file`, `separator`, then `n`. Built
/// without the formatting machinery, which cost more than the rest of a table row's key.
pub(crate) fn record_key(file: &str, separator: char, n: impl itoa::Integer) -> String {
    let mut digits = itoa::Buffer::new();
    let n = digits.format(n);
    let mut key = String::with_capacity(file.len() + separator.len_utf8() + n.len());
    key.push_str(file);
    key.push(separator);
    key.push_str(n);
    key
}

/// Reads an object of the listed `size`: its bytes as listed. One request on any store, and on
/// a local disk one trip to a blocking thread (opening and reading together) where a plain
/// `get` takes two: with small files read under a loaded CPU, each trip waits its turn for a
/// core, and the waits, not the reads, set how fast a split arrives. An empty object is read
/// with a plain `get`, so that one gone since the listing still fails.
pub(crate) async fn get_listed(
    store: Arc<dyn ObjectStore>,
    location: StorePath,
    size: u64,
) -> Result<bytes::Bytes, SourceError> {
    if size == 0 {
        return get_bytes(store, location).await;
    }
    let mut parts = store
        .get_ranges(&location, std::slice::from_ref(&(0..size)))
        .await
        .map_err(|e| SourceError::io("reading", &location, e))?;
    match parts.pop() {
        Some(bytes) if parts.is_empty() => Ok(bytes),
        _ => Err(SourceError::data(
            location.to_string(),
            "the store answered one range with another count of parts",
        )),
    }
}

/// Reads a whole object.
pub(crate) async fn get_bytes(
    store: Arc<dyn ObjectStore>,
    location: StorePath,
) -> Result<bytes::Bytes, SourceError> {
    let result = store.get(&location).await.map_err(|e| SourceError::io("reading", &location, e))?;
    result.bytes().await.map_err(|e| SourceError::io("reading", &location, e))
}

/// A blocking reader over an object's byte stream, for parsers that want `std::io::Read`.
pub(crate) fn blocking_reader(
    store: &Arc<dyn ObjectStore>,
    location: &StorePath,
    rt: &Handle,
) -> Result<impl std::io::Read + use<>, SourceError> {
    let result = rt.block_on(store.get(location)).map_err(|e| SourceError::io("reading", location, e))?;
    let stream = result.into_stream().map_err(std::io::Error::other);
    let reader = tokio_util::io::StreamReader::new(stream);
    Ok(tokio_util::io::SyncIoBridge::new_with_handle(reader, rt.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_is_the_file_key_the_separator_and_the_number() {
        assert_eq!(record_key("features.parquet", ':', 0u64), "features.parquet:0");
        assert_eq!(record_key("a/b.csv", '#', 1_234_567usize), "a/b.csv#1234567");
        assert_eq!(record_key("", '#', u64::MAX), format!("#{}", u64::MAX));
        assert_eq!(record_key("données.jsonl", '→', 42u32), "données.jsonl→42");
    }
}
