//! `format: parquet`: one row per sample; a row group is a split. Rows are decoded one record
//! batch at a time. With a [`Projection`], only the top-level columns it names are read: the
//! others' column chunks are neither fetched nor decoded.

// `ParquetObjectReader` is deprecated in parquet 60 in favour of hand-written `AsyncFileReader`s;
// it still reads correctly over any `object_store`, and replacing it is tracked for the cache work.
#![allow(deprecated)]

use super::{Emit, Object, Projection, SourceError, Split, SplitKind, relative_key, values};
use crate::contained::contained;
use crate::element::Element;
use crate::store::Located;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::{ParquetObjectReader, ParquetRecordBatchStreamBuilder};
use parquet::file::metadata::ParquetMetaData;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Rows decoded at once.
const ROWS_PER_BATCH: usize = 1024;

fn reader(store: &Arc<dyn ObjectStore>, object: &Object) -> ParquetObjectReader {
    ParquetObjectReader::new(Arc::clone(store), object.location.clone()).with_file_size(object.size)
}

pub(super) async fn splits(located: &Located, objects: Vec<ObjectMeta>) -> Result<Vec<Split>, SourceError> {
    let mut splits = Vec::new();
    for o in objects.into_iter().filter(|o| {
        let p = o.location.as_ref();
        p.ends_with(".parquet") || p.ends_with(".parq")
    }) {
        let object = Object { location: o.location, size: o.size };
        let builder =
            ParquetRecordBatchStreamBuilder::new(reader(&located.store, &object)).await.map_err(|e| {
                SourceError::data(object.location.to_string(), format!("not a readable Parquet file: {e}"))
            })?;
        let mut first_row = 0u64;
        for (row_group, rg) in builder.metadata().row_groups().iter().enumerate() {
            let rows = rg.num_rows().max(0) as u64;
            splits.push(Split {
                id: splits.len() as u64,
                kind: SplitKind::RowGroup { object: object.clone(), row_group, first_row, rows },
                input: 0,
            });
            first_row += rows;
        }
    }
    if splits.is_empty() {
        return Err(SourceError::Empty { url: located.url.to_string(), format: "parquet" });
    }
    Ok(splits)
}

/// Refuses a row group whose column chunks do not lie within the file: the footer is the file's
/// own claim, and the parquet crate panics on a negative offset or length.
fn check_row_group(metadata: &ParquetMetaData, row_group: usize, file_size: u64) -> Result<(), String> {
    let Some(group) = metadata.row_groups().get(row_group) else {
        return Err(format!("has no row group {row_group}; the file changed since it was listed"));
    };
    for (i, column) in group.columns().iter().enumerate() {
        let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
        let len = column.compressed_size();
        let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(s, l)| s.checked_add(l));
        if end.is_none_or(|end| end > file_size) {
            return Err(format!(
                "row group {row_group}, column {i}: the footer puts its {len} bytes at offset {start}, \
                 outside the {file_size}-byte file; the file is corrupt: rewrite it"
            ));
        }
    }
    Ok(())
}

/// The row group a split reads.
pub(super) struct Group<'a> {
    /// The file.
    pub object: &'a Object,
    /// Its index in the file.
    pub index: usize,
    /// Row number (within the file) of its first row.
    pub first_row: u64,
}

/// The mask reading the top-level columns `projection` names (nested columns whole).
fn projection_mask(
    schema: &parquet::schema::types::SchemaDescriptor,
    projection: &Projection,
) -> ProjectionMask {
    let roots = schema.root_schema().get_fields().iter().enumerate();
    ProjectionMask::roots(schema, roots.filter(|(_, f)| projection.contains(f.name())).map(|(i, _)| i))
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    group: Group<'_>,
    projection: Option<&Projection>,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let Group { object, index: row_group, first_row } = group;
    let location = object.location.to_string();
    let bad = |e: parquet::errors::ParquetError| {
        SourceError::data(location.clone(), format!("cannot read Parquet: {e}"))
    };
    let mut builder =
        rt.block_on(ParquetRecordBatchStreamBuilder::new(reader(store, object))).map_err(bad)?;
    check_row_group(builder.metadata(), row_group, object.size)
        .map_err(|m| SourceError::data(location.clone(), m))?;
    if let Some(projection) = projection {
        let mask = projection_mask(builder.parquet_schema(), projection);
        builder = builder.with_projection(mask);
    }
    let mut stream =
        builder.with_row_groups(vec![row_group]).with_batch_size(ROWS_PER_BATCH).build().map_err(bad)?;
    let file_key = relative_key(root, &object.location);
    let mut row = first_row;
    // The parquet crate panics on some corrupt pages (a dictionary-encoded page with no
    // dictionary, found by fuzzing): such a file is bad data, not a reason to lose the worker.
    let next = |stream: &mut _| {
        contained(|| rt.block_on(StreamExt::next(stream))).map_err(|why| {
            SourceError::data(
                location.clone(),
                format!(
                    "cannot read Parquet: the decoder failed on row group {row_group} ({why}); the \
                     file is corrupt: rewrite it"
                ),
            )
        })
    };
    while let Some(batch) = next(&mut stream)? {
        let batch = batch.map_err(bad)?;
        let schema = batch.schema();
        for r in 0..batch.num_rows() {
            let mut element = Element::new(format!("{file_key}:{row}"));
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                let value = values::from_arrow(column, r).map_err(|m| {
                    SourceError::data(format!("{location}:{row}"), format!("column `{}`: {m}", field.name()))
                })?;
                if let Some(value) = value {
                    element.fields.push((field.name().clone(), value));
                }
            }
            row += 1;
            if !emit(element) {
                return Ok(());
            }
        }
    }
    Ok(())
}
